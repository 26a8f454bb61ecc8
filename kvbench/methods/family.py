"""A method family is one class: its dataclass fields are its knobs, and the class registers itself (issue #41).

Every family, a paper's (SnapKV, CAKE, H2O ...) or a one-class scorer (:class:`kvbench.methods.recipe.ScorerMethod`),
is a dataclass subclassing :class:`FamilyMethod` with its family name::

    @dataclass
    class SnapKV(VoteKnobs, FamilyMethod, family="snapkv"):
        def build(self, method_cfg: Any) -> EvictionMethod:
            return EvictionMethod(scorer=WindowVoteScorer(score_options(method_cfg, self)), ...)

Defining the class registers :func:`build_family_method` (one generic builder for every family) for
``method.family == "snapkv"``: it validates ``method.params`` into the class
(:func:`kvbench.methods.params.parse_params`: an unknown knob is an error listing the class's fields) and calls
:meth:`FamilyMethod.build` with the composed ``method`` node, whose session knobs (window, GQA storage, sinks, decode
switch) the family reads from there.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from functools import partial
from typing import Any, ClassVar, TypeVar

from kvbench.methods.base import EvictionMethod, register_method
from kvbench.methods.params import parse_params

FamilyT = TypeVar("FamilyT", bound="FamilyMethod")


class FamilyMethod(ABC):
    """Base of a method family's class (module docstring): subclass with ``family=<name>``, write :meth:`build`."""

    #: The registry name, given as ``class X(..., FamilyMethod, family="x")``.
    family: ClassVar[str] = ""

    def __init_subclass__(cls, family: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if family is not None:
            cls.family = family
            register_method(family)(partial(build_family_method, cls))

    @abstractmethod
    def build(self, method_cfg: Any) -> EvictionMethod:
        """The family's recipe from these knobs and the session knobs of ``method_cfg`` (the composed ``method``)."""


def build_family_method(method_class: type[FamilyT], method_cfg: Any) -> EvictionMethod:
    """The generic builder: the class's fields from ``method.params`` (validated), then its
    :meth:`~FamilyMethod.build`."""
    return parse_params(method_class, method_cfg.params, method_class.family).build(method_cfg)
