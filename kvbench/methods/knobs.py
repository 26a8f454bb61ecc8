"""The common method knobs (``MethodConfig`` fields) a family does not use: setting one is an error naming the
family (:func:`check_unused_knobs`, called by :func:`kvbench.methods.base.build_method`)."""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import TYPE_CHECKING, Any

from kvbench.config import MethodConfig

if TYPE_CHECKING:
    from kvbench.methods.base import EvictionMethod

#: The common knobs (``MethodConfig`` fields) a run records in ``metrics.json``, unless the method ignores them
#: (``gqa_reduce`` is recorded resolved, in the method's settings, by the families that pool).
RECORDED_KNOBS = (
    "window",
    "kernel_size",
    "pooling",
    "pool_padding",
    "window_in_budget",
    "gqa_granularity",
    "gqa_agg",
    "score_dtype",
    "sink_tokens",
    "decode_eviction",
)
#: Values of a common knob that say "off" (``kernel_size: 1`` = no pooling), accepted where the family does not use
#: the knob (the TOVA preset states it does not pool).
KNOB_OFF_VALUES: dict[str, tuple[Any, ...]] = {"kernel_size": (1,)}
#: ``MethodConfig``'s default of every common knob.
KNOB_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in fields(MethodConfig) if f.default is not MISSING and f.name not in ("paper",)
}


def check_unused_knobs(method_cfg: Any, method: EvictionMethod) -> None:
    """Raise ``ValueError`` naming the family when ``method_cfg`` sets a common knob the family does not use
    (:attr:`EvictionMethod.unused_knobs`) to anything but its default or an "off" value (:data:`KNOB_OFF_VALUES`):
    ``method=streamingllm method.pooling=avg`` would otherwise be accepted and change nothing."""
    unused = method.unused_knobs
    if unused is None:
        unused = method.ignored_knobs | ({"gqa_reduce"} if "pooling" in method.ignored_knobs else frozenset())
    set_knobs = [
        f"method.{knob}={method_cfg[knob]!r}"
        for knob in sorted(unused)
        if knob in KNOB_DEFAULTS
        and method_cfg[knob] != KNOB_DEFAULTS[knob]
        and method_cfg[knob] not in KNOB_OFF_VALUES.get(knob, ())
    ]
    if set_knobs:
        used = [knob for knob in KNOB_DEFAULTS if knob in RECORDED_KNOBS and knob not in unused]
        raise ValueError(
            f"{', '.join(set_knobs)} is not used by the {method_cfg.family} family (it would change nothing); the "
            f"common knobs it uses: {', '.join(used) or 'none'}. Remove the override, or pick a family that uses it"
        )
