"""A method family that wraps another family's scorer (kvpress's ``Press(press=ScorerPress)`` wrappers, issue #58).

kvpress's ``DMSPress``, ``MergingPress`` and ``PerLayerCompressionPress`` each take any ``ScorerPress``; kvbench's
families of them (:mod:`kvbench.methods.dms`, :mod:`kvbench.methods.merging`, :mod:`kvbench.methods.per_layer`)
subclass :class:`OverPress`: the field ``press`` names the wrapped family (a scorer method: ``knorm``, ``snapkv``,
``keydiff``, ...), every other key of ``method.params`` goes to that family, which validates it when it builds::

    method=merging method.params.press=snapkv method.params.kernel_size=5 method.params.merge_fraction=0.75

The wrapped method is built from the same ``method`` node (its session knobs: window, GQA storage, sinks) with the
wrapper's own knobs removed, and must be a plain scorer recipe (a scorer, uniform layer and head budgets, nothing
while decoding, every key channel): what a kvpress ``ScorerPress`` is.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

from omegaconf import ListConfig, open_dict

from kvbench.eviction.base import (
    METHOD_FAMILIES,
    EvictionMethod,
    UniformHeadAllocator,
    UniformLayerAllocator,
    build_method,
)
from kvbench.eviction.family import FamilyMethod, family_class
from kvbench.eviction.knobs import session_fields
from kvbench.eviction.params import parse_params
from kvbench.eviction.threshold import ThresholdScorer


@dataclasses.dataclass(frozen=True)
class OverPress(FamilyMethod):
    """Base of a wrapper family over a scorer family (module docstring); subclasses add their knobs as fields."""

    #: The wrapped scorer family (kvpress's ``press``): a one-class method or SnapKV.
    press: str = "knorm"

    @classmethod
    def from_params(cls, params: Mapping[str, Any] | None) -> OverPress:
        """The wrapper's own knobs (its fields) from ``method.params``, validated; the others are the wrapped
        family's."""
        own = cls.field_knobs()
        return parse_params(cls, {key: value for key, value in (params or {}).items() if key in own}, cls.family)

    @classmethod
    def declared_knobs(cls, params: Mapping[str, Any] | None = None) -> list[str]:
        """The wrapper's knobs and those of the wrapped family (``params["press"]``)."""
        inner_class = family_class(cls.from_params(params).inner_family())
        return [*cls.wrapper_knobs(), *(inner_class.declared_knobs(params) if inner_class is not None else [])]

    @classmethod
    def wrapper_knobs(cls) -> list[str]:
        """The wrapper's own knobs: its fields less the session knobs (``method.params.window`` ...), which are the
        wrapped method's (the wrapper's recipe is the wrapped one's, :meth:`build_inner`)."""
        session = set(session_fields(cls))
        return [name for name in cls.field_knobs() if name not in session]

    def inner_family(self) -> str:
        """``press``, checked: a registered family other than this wrapper (``ValueError`` naming the valid ones)."""
        if self.press == self.family:
            raise ValueError(f"method.params.press={self.press!r} is not valid: {self.family} wraps another method")
        METHOD_FAMILIES.get(self.press)
        return self.press

    def build_inner(self, method_cfg: Any) -> EvictionMethod:
        """The wrapped family's method from ``method_cfg`` without this wrapper's knobs; ``ValueError`` unless it
        is a plain scorer recipe (module docstring)."""
        family, own = self.inner_family(), self.wrapper_knobs()
        inner_cfg = copy.deepcopy(method_cfg)
        with open_dict(inner_cfg):
            inner_cfg.family = family
            inner_cfg.params = {key: value for key, value in (method_cfg.params or {}).items() if key not in own}
        inner = build_method(inner_cfg)
        plain = (
            inner.scorer is not None
            and type(inner.layer_allocator) is UniformLayerAllocator
            and type(inner.head_allocator) is UniformHeadAllocator
            and inner.decode_policy is None
            and inner.key_channel_pruner is None
            and inner.value_merger is None
            and not getattr(inner.scorer, "replays_context", False)
            and not isinstance(inner.scorer, ThresholdScorer)  # a threshold method (DMS) keeps no size to wrap
        )
        if not plain:
            raise ValueError(
                f"method.params.press={family!r}: {self.family} wraps a plain scorer (kvpress's ScorerPress: one "
                "score per token, uniform budgets, nothing while decoding); this configuration of it has its own "
                "allocation, decode policy or replay. Use a one-class method (knorm, keydiff, ...) or snapkv, with "
                "its wrappers off"
            )
        return inner

    def settings_of(self, inner: EvictionMethod, reference: str) -> dict[str, Any]:
        """The recorded settings: the wrapped method's, then this wrapper's knobs and its reference."""
        own = {key: getattr(self, key) for key in self.wrapper_knobs()}
        own = {key: list(value) if isinstance(value, (tuple, ListConfig)) else value for key, value in own.items()}
        return {**inner.settings, **own, f"{self.family}_reference": reference}
