"""A method is one class: a frozen dataclass whose fields are its knobs, registered by defining it (issues #41, #57).

Every family, a paper's (SnapKV, CAKE, H2O ...) or a one-class scorer (:class:`kvbench.eviction.recipe.ScorerMethod`),
is a frozen dataclass subclassing :class:`FamilyMethod` with its family name::

    @dataclass(frozen=True)
    class PyramidKV(VoteKnobs, FamilyMethod, family="pyramidkv"):
        beta: int = bounded(20, low=1)

        def build(self, method_cfg: Any) -> EvictionMethod:
            return EvictionMethod(scorer=WindowVoteScorer(score_options(self)), ..., **common_knobs(method_cfg, self))

Its knobs are its fields: the session knobs every method has (:class:`kvbench.eviction.knobs.SessionKnobs`: window,
budget accounting, GQA storage, sinks, the decode switch; less the ones in :attr:`FamilyMethod.unused_knobs`) and its
own, all set as ``method.params.<knob>``.  Defining the class registers it in the one registry of methods,
:data:`kvbench.eviction.base.METHOD_FAMILIES`; :func:`kvbench.eviction.base.build_method` makes the class from
``method.params`` (:meth:`FamilyMethod.from_params`, i.e. :func:`kvbench.eviction.params.parse_params`: an unknown
knob is an error listing the class's knobs) and calls :meth:`FamilyMethod.build`, which composes the recipe's pieces
(:class:`kvbench.eviction.base.EvictionMethod`).  A method over another family (ThinK over its token method) overrides
:meth:`~FamilyMethod.from_params` and :meth:`~FamilyMethod.declared_knobs` to pass the other keys on.
"""

from __future__ import annotations

import dataclasses
import difflib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from kvbench.checks import check_known_keys
from kvbench.eviction.base import METHOD_FAMILIES, EvictionMethod
from kvbench.eviction.knobs import KNOB_DEFAULTS, SessionKnobs, session_fields
from kvbench.eviction.params import parse_params
from kvbench.eviction.plugins import method_entry_points

FamilyT = TypeVar("FamilyT", bound="FamilyMethod")
_NO_DEFAULT = object()


@dataclasses.dataclass(frozen=True)
class FamilyMethod(SessionKnobs, ABC):
    """Base of a method's class (module docstring): subclass with ``family=<name>``, write :meth:`build`."""

    #: The registry name, given as ``class X(..., FamilyMethod, family="x")``.
    family: ClassVar[str] = ""
    #: The session knobs the family never reads (not among its knobs: refused when set, not listed).
    unused_knobs: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, family: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if family is not None:
            cls.family = family
            registered = METHOD_FAMILIES.registered(family)
            if registered is not None and registered.__qualname__ == cls.__qualname__:
                METHOD_FAMILIES.unregister(family)  # the same class defined again (a module or notebook cell re-run)
            METHOD_FAMILIES.register(family)(cls)

    @classmethod
    def from_params(cls: type[FamilyT], params: Mapping[str, Any] | None) -> FamilyT:
        """The knobs from ``method.params``, validated (:func:`~kvbench.eviction.params.parse_params`)."""
        given = cls.given_params(params)
        check_known_keys(given, cls.field_knobs(), "method.params", f"family {cls.family!r}")
        return parse_params(cls, given, cls.family)

    @classmethod
    def given_params(cls, params: Mapping[str, Any] | None) -> dict[str, Any]:
        """``method.params`` less the :attr:`unused_knobs` given at their default (they change nothing: a sweep's
        ``method.params.gqa_agg=mean`` over families that do not all read it)."""
        return {
            key: value
            for key, value in (params or {}).items()
            if not (key in cls.unused_knobs and value == KNOB_DEFAULTS.get(key, _NO_DEFAULT))
        }

    @classmethod
    def field_knobs(cls) -> list[str]:
        """The class's knobs: its dataclass fields, less :attr:`unused_knobs`; its own first, the session knobs last."""
        names = [field.name for field in dataclasses.fields(cls) if field.name not in cls.unused_knobs]  # type: ignore[arg-type]
        session = set(session_fields(cls))
        return [name for name in names if name not in session] + [name for name in names if name in session]

    @classmethod
    def declared_knobs(cls, params: Mapping[str, Any] | None = None) -> list[str]:
        """The keys ``method.params`` may hold (given its current ``params``: a wrapper's depend on what it wraps);
        by default :meth:`field_knobs`."""
        return cls.field_knobs()

    @abstractmethod
    def build(self, method_cfg: Any) -> EvictionMethod:
        """The family's recipe from these knobs (the name and family from ``method_cfg``, the composed ``method``)."""


def family_class(family: str) -> type[FamilyMethod] | None:
    """The class of a registered family (kvbench's method modules imported first, and the plug-in declaring
    ``family``, if any); ``None`` when no family of that name is registered."""
    METHOD_FAMILIES.names()  # discovers kvbench's method modules
    if METHOD_FAMILIES.registered(family) is None and family in method_entry_points():
        METHOD_FAMILIES.get(family)  # a plug-in's module is imported when its method is asked for
    return METHOD_FAMILIES.registered(family)


def check_declared_params(method_cfg: Any) -> None:
    """Raise ``ValueError`` when ``method.params`` holds a key the family's class does not declare
    (:meth:`FamilyMethod.declared_knobs`), listing the method's own knobs (the preset's first, in its order, then the
    class's others) and the closest one."""
    family = str(method_cfg.family)
    method_class = METHOD_FAMILIES.get(family)  # an unknown family: the registry's error, naming the valid ones
    params = method_class.given_params(method_cfg.params)
    declared = method_class.declared_knobs(params)
    unknown = [key for key in params if key not in declared]
    if not unknown:
        return
    given = [key for key in params if key in declared]  # the preset's own knobs first, then its session knobs
    given = [key for key in given if key not in KNOB_DEFAULTS] + [key for key in given if key in KNOB_DEFAULTS]
    own = given + [key for key in declared if key not in params]
    close = difflib.get_close_matches(str(unknown[0]), declared, n=1, cutoff=0.6)
    hint = f" Did you mean method.params.{close[0]}?" if close else ""
    keys = ", ".join(f"method.params.{key}" for key in unknown)
    verb = "is not a parameter" if len(unknown) == 1 else "are not parameters"
    raise ValueError(
        f"{keys} {verb} of this method (family {family!r}); its parameters are: {', '.join(own) or 'none'}.{hint} "
        "(`kvbench list methods` shows each preset's parameters.)"
    )
