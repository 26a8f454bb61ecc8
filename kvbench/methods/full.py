"""``full``: no eviction (the reference every method is compared with)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvbench.methods.base import EvictionMethod, common_knobs, register_method
from kvbench.methods.knobs import RECORDED_KNOBS
from kvbench.methods.params import parse_params


@dataclass
class FullParams:
    """``full`` has no hyper-parameters."""


@register_method("full")
def build_full(method_cfg: Any) -> EvictionMethod:
    """The full cache: nothing is scored or evicted."""
    parse_params(FullParams, method_cfg.params, "full")
    return EvictionMethod(scorer=None, ignored_knobs=frozenset(RECORDED_KNOBS), **common_knobs(method_cfg))
