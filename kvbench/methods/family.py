"""A method family is one class: its dataclass fields are its knobs, and the class registers itself (issue #41).

Every family, a paper's (SnapKV, CAKE, H2O ...) or a one-class scorer (:class:`kvbench.methods.recipe.ScorerMethod`),
is a dataclass subclassing :class:`FamilyMethod` with its family name::

    @dataclass
    class SnapKV(VoteKnobs, FamilyMethod, family="snapkv"):
        def build(self, method_cfg: Any) -> EvictionMethod:
            return EvictionMethod(scorer=WindowVoteScorer(score_options(method_cfg, self)), ...)

Defining the class registers :func:`build_family_method` (one generic builder for every family) for
``method.family == "snapkv"`` (and the class in :data:`FAMILY_CLASSES`): it validates ``method.params`` into the
class (:meth:`FamilyMethod.from_params`, i.e. :func:`kvbench.methods.params.parse_params`: an unknown knob is an
error listing the class's fields) and calls :meth:`FamilyMethod.build` with the composed ``method`` node, whose
session knobs (window, GQA storage, sinks, decode switch) the family reads from there.  A wrapper over another
family (ThinK over its token method) overrides :meth:`~FamilyMethod.from_params` and
:meth:`~FamilyMethod.declared_knobs` to pass the other keys on.
"""

from __future__ import annotations

import dataclasses
import difflib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from functools import partial
from typing import Any, ClassVar, TypeVar

from kvbench.methods.base import METHOD_FAMILIES, EvictionMethod, register_method
from kvbench.methods.params import parse_params
from kvbench.methods.plugins import method_entry_points

FamilyT = TypeVar("FamilyT", bound="FamilyMethod")

#: Every family class by family name (registered by the class itself).
FAMILY_CLASSES: dict[str, type[FamilyMethod]] = {}


class FamilyMethod(ABC):
    """Base of a method family's class (module docstring): subclass with ``family=<name>``, write :meth:`build`."""

    #: The registry name, given as ``class X(..., FamilyMethod, family="x")``.
    family: ClassVar[str] = ""

    def __init_subclass__(cls, family: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if family is not None:
            cls.family = family
            # Registered first: a family refused as a duplicate ("registered twice") leaves the registered class.
            register_method(family)(partial(build_family_method, cls))
            FAMILY_CLASSES[family] = cls

    @classmethod
    def from_params(cls: type[FamilyT], params: Mapping[str, Any] | None) -> FamilyT:
        """The knobs from ``method.params``, validated (:func:`~kvbench.methods.params.parse_params`)."""
        return parse_params(cls, params, cls.family)

    @classmethod
    def field_knobs(cls) -> list[str]:
        """The class's own knobs: its dataclass fields."""
        return [field.name for field in dataclasses.fields(cls)]  # type: ignore[arg-type]

    @classmethod
    def declared_knobs(cls, params: Mapping[str, Any] | None = None) -> list[str]:
        """The keys ``method.params`` may hold (given its current ``params``: a wrapper's depend on what it wraps);
        by default :meth:`field_knobs`."""
        return cls.field_knobs()

    @abstractmethod
    def build(self, method_cfg: Any) -> EvictionMethod:
        """The family's recipe from these knobs and the session knobs of ``method_cfg`` (the composed ``method``)."""


def build_family_method(method_class: type[FamilyT], method_cfg: Any) -> EvictionMethod:
    """The generic builder: the class's fields from ``method.params`` (validated), then its
    :meth:`~FamilyMethod.build`."""
    return method_class.from_params(method_cfg.params).build(method_cfg)


def family_class(family: str) -> type[FamilyMethod] | None:
    """The class of a registered family (kvbench's method modules imported first, and the plug-in declaring
    ``family``, if any); ``None`` for a family registered by a builder alone or not at all."""
    METHOD_FAMILIES.names()  # discovers kvbench's method modules
    if family not in FAMILY_CLASSES and family in method_entry_points():
        METHOD_FAMILIES.get(family)  # a plug-in's module is imported when its method is asked for
    return FAMILY_CLASSES.get(family)


def check_declared_params(method_cfg: Any) -> None:
    """Raise ``ValueError`` when ``method.params`` holds a key the family's class does not declare
    (:meth:`FamilyMethod.declared_knobs`), listing the method's own knobs (the preset's first, in its order, then the
    class's others) and the closest one.  A family registered without a class checks its keys when it builds."""
    family = str(method_cfg.family)
    METHOD_FAMILIES.get(family)  # an unknown family: the registry's error, naming the valid ones
    method_class = family_class(family)
    params = dict(method_cfg.params or {})
    if method_class is None:
        return
    declared = method_class.declared_knobs(params)
    unknown = [key for key in params if key not in declared]
    if not unknown:
        return
    own = [key for key in params if key in declared] + [key for key in declared if key not in params]
    close = difflib.get_close_matches(str(unknown[0]), declared, n=1, cutoff=0.6)
    hint = f" Did you mean method.params.{close[0]}?" if close else ""
    keys = ", ".join(f"method.params.{key}" for key in unknown)
    verb = "is not a parameter" if len(unknown) == 1 else "are not parameters"
    raise ValueError(
        f"{keys} {verb} of this method (family {family!r}); its parameters are: {', '.join(own) or 'none'}.{hint} "
        "(`kvbench list methods` shows each preset's parameters.)"
    )
