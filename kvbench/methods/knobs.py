"""The session knobs (``MethodConfig`` fields every family's recipe is built with: window, budget accounting, GQA
storage, sinks, decode switch) and the check that a family does not get one it never reads.

A family's own knobs are its params dataclass's fields (``method.params.<knob>``; :mod:`kvbench.methods.params`
rejects one it does not declare).  A session knob is declared by the schema for every family; a family that does not
read one says so in :attr:`kvbench.methods.base.EvictionMethod.ignored_knobs` (NACL has no observation window, the
full cache reads none), and setting it away from its default is an error listing the family's own knobs
(:func:`check_unused_knobs`, called by :func:`kvbench.methods.base.build_method`).
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import TYPE_CHECKING, Any

from kvbench.config import MethodConfig

if TYPE_CHECKING:
    from kvbench.methods.base import EvictionMethod

#: The session knobs a run records in ``metrics.json``, unless the method ignores them (the family's own knobs are
#: recorded under ``params``).
RECORDED_KNOBS = ("window", "window_in_budget", "gqa_granularity", "gqa_agg", "sink_tokens", "decode_eviction")
#: ``MethodConfig``'s default of every session knob.
KNOB_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in fields(MethodConfig) if f.default is not MISSING and f.name in RECORDED_KNOBS
}


def check_unused_knobs(method_cfg: Any, method: EvictionMethod) -> None:
    """Raise ``ValueError`` naming the family and its own knobs when ``method_cfg`` sets a session knob the family
    does not read (:attr:`EvictionMethod.ignored_knobs`) away from its default: ``method=full method.window=8``
    would otherwise be accepted and change nothing."""
    set_knobs = [
        f"method.{knob}={method_cfg[knob]!r}"
        for knob in sorted(method.ignored_knobs & set(KNOB_DEFAULTS))
        if method_cfg[knob] != KNOB_DEFAULTS[knob]
    ]
    if set_knobs:
        raise ValueError(
            f"{', '.join(set_knobs)} is not used by the {method_cfg.family} family (it would change nothing); "
            f"its knobs: {', '.join(own_knobs(method_cfg, method)) or 'none'}. Remove the override, or pick a family "
            "that uses it"
        )


def own_knobs(method_cfg: Any, method: EvictionMethod) -> list[str]:
    """The knobs of ``method``: the session knobs it reads (``method.<knob>``) and its own (``method.params.<knob>``,
    as composed)."""
    session = [f"method.{knob}" for knob in RECORDED_KNOBS if knob not in method.ignored_knobs]
    return session + [f"method.params.{key}" for key in (method_cfg.params or {})]
