"""``full``: no eviction (the reference every method is compared with)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from kvbench.eviction.base import EvictionMethod, common_knobs
from kvbench.eviction.family import FamilyMethod
from kvbench.eviction.knobs import RECORDED_KNOBS


@dataclass(frozen=True)
class Full(FamilyMethod, family="full"):
    """``full`` has no hyper-parameters."""

    #: The full cache reads no session knob.
    unused_knobs: ClassVar[frozenset[str]] = frozenset(RECORDED_KNOBS)

    def build(self, method_cfg: Any) -> EvictionMethod:
        """The full cache: nothing is scored or evicted."""
        return EvictionMethod(scorer=None, ignored_knobs=frozenset(RECORDED_KNOBS), **common_knobs(method_cfg, self))
