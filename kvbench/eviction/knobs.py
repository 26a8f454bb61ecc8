"""The session knobs: what every method's recipe is built with besides its own knobs (the observation window, budget
accounting, GQA storage, sinks, the decode switch), declared once as :class:`SessionKnobs` (issue #57).

Every knob of a method is a field of its class, set as ``method.params.<knob>`` (one way, issue #57): a family's class
(:class:`kvbench.eviction.family.FamilyMethod`) inherits these fields, so ``method.params.window=16`` sets SnapKV's
window as ``method.params.kernel_size=5`` sets its pooling.  A family that never reads one lists it in
:attr:`~kvbench.eviction.family.FamilyMethod.unused_knobs`: it is then not among the method's knobs (``kvbench list
methods`` does not show it, setting it is an error listing the method's knobs).  A knob that a family reads only in
some settings (TOVA's ``gqa_agg`` unless ``head_average``) is refused when set in the others
(:func:`check_unused_knobs`, through :attr:`kvbench.eviction.base.EvictionMethod.ignored_knobs`).

The spelling of before, ``method.<knob>`` (:data:`kvbench.config.SESSION_KNOBS`), still works with a one-line note
(:func:`kvbench.config.move_session_knobs`); a run's config hash is computed in that layout
(:func:`kvbench.storage.writers.canonical_config`), so no run changed its hash.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from kvbench.config import GQA_AGGREGATIONS, GQA_GRANULARITIES, SESSION_KNOBS
from kvbench.eviction.params import bounded, choice

if TYPE_CHECKING:
    from kvbench.eviction.base import EvictionMethod


@dataclass(frozen=True)
class SessionKnobs:
    """The session knobs (module docstring), fields of every method class."""

    #: Observation window: the last ``window`` prompt queries score the keys (and are kept, where the method
    #: protects them).
    window: int = bounded(32, low=1)
    #: Whether the observation window's tokens count toward the budget (papers: true).
    window_in_budget: bool = True
    #: GQA storage: ``kv_head`` (one cache per KV head) or ``query_head`` (KV repeated per query head, as the
    #: original SnapKV/PyramidKV code did; inflates memory by the group size).
    gqa_granularity: str = choice("kv_head", GQA_GRANULARITIES)
    #: How query-head scores are combined per KV head when ``gqa_granularity=kv_head``: mean | max | sum.
    gqa_agg: str = choice("mean", GQA_AGGREGATIONS)
    #: Attention-sink tokens always kept (the first ones; StreamingLLM).
    sink_tokens: int = bounded(0, 0)
    #: Whether eviction also happens during decoding (H2O/TOVA/StreamingLLM...), keeping the cache at its budget.
    decode_eviction: bool = False


#: The session knobs a run records in ``metrics.json`` (unless the method ignores them; its own knobs are recorded
#: under ``params``).
RECORDED_KNOBS = SESSION_KNOBS
#: Every session knob's default.
KNOB_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(SessionKnobs)}
assert tuple(KNOB_DEFAULTS) == SESSION_KNOBS, "kvbench.config.SESSION_KNOBS names SessionKnobs's fields in order"


def check_unused_knobs(knobs: Any, method: EvictionMethod) -> None:
    """Raise ``ValueError`` naming the family and its knobs when ``knobs`` (the method's class, as built) sets a
    session knob away from its default that the built ``method`` does not read (:attr:`EvictionMethod.ignored_knobs`:
    TOVA's ``gqa_agg`` under ``head_average``), since it would change nothing."""
    set_knobs = [
        f"method.params.{knob}={getattr(knobs, knob)!r}"
        for knob in sorted(method.ignored_knobs & set(session_fields(type(knobs))))
        if getattr(knobs, knob) != KNOB_DEFAULTS[knob]
    ]
    if set_knobs:
        own = [f"method.params.{knob}" for knob in knobs.declared_knobs() if knob not in method.ignored_knobs]
        raise ValueError(
            f"{', '.join(set_knobs)} is not used by the {method.family} family as set (it would change nothing); "
            f"its knobs: {', '.join(own) or 'none'}. Remove the override, or pick a family that uses it"
        )


def session_fields(method_class: type) -> list[str]:
    """The session knobs ``method_class`` has as :class:`SessionKnobs` declares them (a family that redefines one,
    NACL's own ``sink_tokens``, owns it: it is the family's knob, not the session's)."""
    return shared_fields(method_class, SessionKnobs)


def recorded_knobs(knobs: Any, method: EvictionMethod) -> dict[str, Any]:
    """The session knobs a run records (``metrics.json``'s ``settings``): each one ``method`` reads, at its value in
    ``knobs`` (the method's class as built)."""
    session = session_fields(type(knobs))
    return {
        knob: getattr(knobs, knob) if knob in session else KNOB_DEFAULTS[knob]
        for knob in RECORDED_KNOBS
        if knob not in method.ignored_knobs
    }


def knob_meanings(method_class: type) -> dict[str, str]:
    """Each field of ``method_class`` (a dataclass) -> its meaning: the ``#:`` comment above its declaration in the
    nearest class of its MRO that declares it (the same text the API reference shows); ``""`` where there is none."""
    meanings: dict[str, str] = {}
    for cls in reversed(method_class.__mro__):
        if "__dataclass_fields__" not in vars(cls):
            continue
        try:
            lines, _ = inspect.getsourcelines(cls)
        except (OSError, TypeError):
            continue
        comment: list[str] = []
        for line in lines:
            text = line.strip()
            if text.startswith("#:"):
                comment.append(text[2:].strip())
                continue
            match = re.match(r"(\w+)\s*:[^=]*=", text)
            if match and match[1] in cls.__dataclass_fields__ and line.startswith("    ") and line[4] != " ":
                meanings[match[1]] = " ".join(comment)
            comment = []
    return meanings


def shared_fields(method_class: type, bundle: type) -> list[str]:
    """The fields ``method_class`` takes unchanged from ``bundle`` (a redefined field is the class's own)."""
    own = getattr(method_class, "__dataclass_fields__", {})
    return [name for name, field in bundle.__dataclass_fields__.items() if own.get(name) is field]
