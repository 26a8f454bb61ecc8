"""The wrappers over any scorer, declared once (issue #41 item 3): kvpress's ``AdaKVPress(press)``,
``DecodingPress(base_press)``, ``ChunkKVPress(press)``, ``CriticalKVPress(press)`` as knobs of a method.

A method whose recipe is "one token scorer, uniform budgets" declares the wrapper knobs by inheriting their fields
(:class:`Wrappers`: every one-class method, :class:`kvbench.eviction.recipe.ScorerMethod`, SnapKV among them) and
passes the method it builds through :func:`apply_wrappers`::

    method = EvictionMethod(scorer=..., layer_allocator=UniformLayerAllocator(), ...)
    return apply_wrappers(method, self)

With every wrapper off (their defaults) the method is returned unchanged.  The knobs (``method.params.<knob>``):

* ``allocation``: ``uniform``, ``ada`` (Ada-KV's head-wise allocation, its reference code's reading,
  :mod:`kvbench.eviction.head_allocation`) or
  ``ada_kvpress`` (kvpress's ``AdaKVPress``, :mod:`kvbench.eviction.kvpress_ada`);
* ``layers``: ``uniform`` or ``pyramid`` (PyramidKV's layer schedule, beta 20, the method's ``window``:
  :mod:`kvbench.eviction.layer_schedules`);
* ``selection`` / ``selection_length``: ``topk``, or kvpress's ``chunkkv``, ``chunk``, ``block``
  (:mod:`kvbench.eviction.selection`);
* ``rescale``: ``none`` or ``critical`` (CriticalKV; CriticalAdaKV with ``ada_kvpress``,
  :mod:`kvbench.eviction.critical`);
* ``decode_interval`` / ``decode_target`` / ``decode_ratio``: kvpress's ``DecodingPress`` family
  (:mod:`kvbench.eviction.kvpress_decoding`).

Families with an allocator of their own (Ada-KV, CAKE, PyramidKV, HeadKV, XKV) do not declare these knobs: setting
one is refused with the family's own knobs listed (:func:`kvbench.eviction.family.check_declared_params`).  The results
folder names the wrappers that are on (``knorm+ada``, ``snapkv_kvpress+ada_kvpress``: :data:`WRAPPER_LABEL_KNOBS`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kvbench.eviction.base import EvictionMethod
from kvbench.eviction.critical import wrap_critical
from kvbench.eviction.head_allocation import PAPER_ALPHA, AdaHeadAllocator
from kvbench.eviction.kvpress_ada import KvpressAdaAllocator
from kvbench.eviction.kvpress_decoding import IntervalDecodingPolicy
from kvbench.eviction.layer_schedules import PyramidLayerAllocator
from kvbench.eviction.params import bounded, choice
from kvbench.eviction.selection import SELECTIONS, wrap_selection

#: The head-allocation wrappers (``method.params.allocation``) and the layer schedules (``method.params.layers``).
HEAD_ALLOCATIONS = ("uniform", "ada", "ada_kvpress")
LAYER_SCHEDULES = ("uniform", "pyramid")
#: The score rescalings (``method.params.rescale``): none, or CriticalKV's.
RESCALES = ("none", "critical")


@dataclasses.dataclass(frozen=True)
class Wrappers:
    """The wrapper knobs (module docstring), fields of a method class."""

    #: Wrapper: how a layer's budget is split over its heads: ``uniform`` or ``ada`` (Ada-KV's head-wise allocation,
    #: its reference code's settings: safeguard alpha 0.2, floor reading) or ``ada_kvpress`` (kvpress's
    #: ``AdaKVPress(press)``: safeguard then one top-k over the layer, :mod:`kvbench.eviction.kvpress_ada`).
    allocation: str = choice("uniform", HEAD_ALLOCATIONS)
    #: Wrapper: how the total budget is split over layers: ``uniform`` or ``pyramid`` (PyramidKV's schedule, beta 20,
    #: KVCache-Factory's variant, the method's ``window``).
    layers: str = choice("uniform", LAYER_SCHEDULES)
    #: Wrapper: which tokens a head keeps given the scores: ``topk`` (each head its top-k), or kvpress's ``chunkkv``
    #: (ChunkKVPress: whole chunks, the same on every head), ``chunk`` (ChunkPress: each chunk its own top-k) or
    #: ``block`` (BlockPress: block-wise scoring); :mod:`kvbench.eviction.selection`.
    selection: str = choice("topk", SELECTIONS)
    #: The chunk or block length of ``selection`` (0: kvpress's default, chunkkv 20, chunk 1024, block 128).
    selection_length: int = bounded(0, 0)
    #: Wrapper: ``critical`` is CriticalKV (kvpress's ``CriticalKVPress``: the scores rescaled by the values'
    #: projected L1 norms, two stages); with ``allocation: ada_kvpress``, CriticalAdaKV
    #: (:mod:`kvbench.eviction.critical`).
    rescale: str = choice("none", RESCALES)
    #: Wrapper: kvpress's ``DecodingPress``: every ``decode_interval`` forwards after the prefill, each head is cut back
    #: to its budget by the scores of the whole cache (0: off; :mod:`kvbench.eviction.kvpress_decoding`).
    decode_interval: int = bounded(0, 0)
    #: The size ``decode_interval`` cuts each head back to (kvpress's ``target_size``; 0: the head's budget).
    decode_target: int = bounded(0, 0)
    #: kvpress's ``CompressionRatioDecodingPress``: ``decode_interval`` cuts to ``max(1, int(seen (1 - r)))`` of the
    #: tokens seen so far (0: off; ``r`` in ``[0, 1)``, exclusive with ``decode_target``).
    decode_ratio: float = bounded(0.0, 0.0, 1.0)


#: The wrapper knobs (every field of :class:`Wrappers`) and their values when off.
WRAPPER_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(Wrappers)}


def wrappers_on(knobs: Any) -> dict[str, Any]:
    """The wrapper knobs of ``knobs`` (a :class:`Wrappers`) that are not at their default."""
    return {name: getattr(knobs, name) for name, off in WRAPPER_DEFAULTS.items() if getattr(knobs, name) != off}


#: The wrappers that split the budget or choose the kept tokens after the prefill (not the decode-time ones).
PREFILL_WRAPPERS = ("allocation", "layers", "selection", "rescale")


def refuse_prefill_wrappers(knobs: Any, family: str, why: str) -> None:
    """Refuse (``ValueError``, the command line's exit 2) any of :data:`PREFILL_WRAPPERS` that is on for ``family``,
    a method that splits its budget or selects its tokens itself (``why``), naming the valid value."""
    for name in PREFILL_WRAPPERS:
        if getattr(knobs, name) != WRAPPER_DEFAULTS[name]:
            raise ValueError(
                f"method.params.{name}={getattr(knobs, name)!r}: {family} {why}; valid: {name}={WRAPPER_DEFAULTS[name]}"
            )


def declares_wrappers(family: str) -> bool:
    """Whether the family's class declares the wrapper knobs (a one-class method, SnapKV); not CAKE, whose own
    ``allocation`` knob is its allocator's."""
    from kvbench.eviction.family import family_class

    method_class = family_class(family)
    return method_class is not None and issubclass(method_class, Wrappers)


def check_kvpress_composition(method: EvictionMethod, knobs: Any) -> None:
    """Refuse (``ValueError``, the command line's exit 2) a wrapper over a scorer whose kvpress composition kvbench
    does not reproduce, naming why: a decoding press over ``AdaKVPress`` (kvpress masks, and its decoding press then
    compresses the masked cache: kvbench's decode compressions cut each head by the scorer alone)."""
    if knobs.decode_interval and knobs.allocation == "ada_kvpress":
        raise ValueError(
            "method.params.decode_interval with allocation=ada_kvpress is kvpress's DecodingPress over AdaKVPress, "
            "which masks instead of evicting and then compresses the masked cache; kvbench does not reproduce it "
            "(valid with decode_interval: allocation=uniform or ada)"
        )


def apply_wrappers(method: EvictionMethod, knobs: Any) -> EvictionMethod:
    """``method`` (a scorer with uniform head and layer budgets) under the wrappers ``knobs`` turns on (module
    docstring); unchanged when every wrapper is off.  Raises ``ValueError`` for a combination that does not compose
    (a selection wrapper with a head allocation; CriticalKV with a selection or ``allocation=ada``)."""
    if not wrappers_on(knobs):
        return method
    if method.scorer is None:
        raise ValueError(f"method {method.name!r} has no token scorer: its wrapper knobs cannot apply")
    allocation, selection = knobs.allocation, knobs.selection
    check_kvpress_composition(method, knobs)
    if selection != "topk" and allocation != "uniform":
        raise ValueError(
            f"method.params.selection={selection!r} sets its own per-head counts: it does not combine with "
            f"method.params.allocation={allocation!r}; valid with it: allocation=uniform"
        )
    changes: dict[str, Any] = {}
    if allocation == "ada":
        changes["head_allocator"] = AdaHeadAllocator(PAPER_ALPHA["late"], "floor")
    elif allocation == "ada_kvpress":
        changes["head_allocator"] = KvpressAdaAllocator()
    if knobs.layers == "pyramid":
        changes["layer_allocator"] = PyramidLayerAllocator(20, method.window)
    if knobs.decode_interval:
        changes["decode_policy"] = IntervalDecodingPolicy(
            method.scorer, knobs.decode_interval, method.gqa_agg, method.window, knobs.decode_target, knobs.decode_ratio
        )
    method = dataclasses.replace(method, **changes) if changes else method
    if knobs.rescale == "critical":
        if selection != "topk" or allocation == "ada":
            raise ValueError(
                "method.params.rescale=critical combines with method.params.allocation=uniform (CriticalKV) or "
                f"ada_kvpress (CriticalAdaKV) and selection=topk; got allocation={allocation!r}, "
                f"selection={selection!r}"
            )
        return wrap_critical(method, adaptive=allocation == "ada_kvpress")
    return wrap_selection(method, selection, knobs.selection_length)
