"""PyramidKV's layer schedule (Cai et al., 2024), a piece over any scorer: the ``pyramidkv`` and ``ada_pyramidkv``
families and the ``layers: pyramid`` wrapper (:mod:`kvbench.eviction.wrappers`) split the total budget over layers
with :class:`PyramidLayerAllocator`.

Reproduces Zefan-Cai/KVCache-Factory ``pyramidkv/pyramidkv_utils.py`` (``PyramidKVCluster``): integer arithmetic
(:func:`pyramid_schedule`), in the variant of KVCache-Factory (default) or of AdaKV's ``pyram_mode``;
``sum_preserving`` is kvbench's variant whose total is exactly ``L x C``; ``kvpress`` is NVIDIA/kvpress's
``PyramidKVPress`` (:mod:`kvbench.eviction.kvpress_pyramid`).
"""

from __future__ import annotations

from kvbench.checks import check_choice, check_min
from kvbench.eviction.base import StaticLayerAllocator
from kvbench.eviction.kvpress_pyramid import kvpress_pyramid_budgets

PYRAMID_SCHEDULES = ("kvcache_factory", "adakv", "sum_preserving", "kvpress")


def pyramid_schedule(
    average: int, window: int, beta: int, num_layers: int, context_length: int, variant: str
) -> list[int]:
    """PyramidKV's per-layer budgets (window included), or ``context_length`` for a layer that evicts nothing.

    ``average`` is the mean budget per layer ``C``; ``base = C - W``; ``min = base // beta``; ``max = 2 base - min``;
    if ``max >= S - W``: ``max = S - W``, ``min = 2 base - max``; ``steps = (max - min) // (L - 1)``; layer ``l``
    selects ``max - l * steps`` candidates and keeps the window on top.

    * ``kvcache_factory``: nothing is evicted when ``S < C``; every layer keeps ``C`` when ``S < 2 base``.
    * ``adakv`` (AdaKV ``pyram_mode``): no uniform branch; a layer evicts nothing when it would select more than
      the ``S - W`` candidates.
    * ``sum_preserving`` (kvbench): the same endpoints with a fractional step, rounded, and the remainder spread so
      the total is exactly ``L x C``; uniform when ``S < 2 base`` as KVCache-Factory.

    One layer, or a budget not above the window, is uniform (the references assume ``L > 1`` and ``C > W``).
    """
    check_choice("method.params.schedule", variant, PYRAMID_SCHEDULES)
    if variant == "kvpress":
        return kvpress_pyramid_budgets(average, window, beta, num_layers, context_length)
    base = average - window
    if variant != "adakv" and context_length < average:
        return [context_length] * num_layers
    if num_layers == 1 or base <= 0:
        return [min(average, context_length)] * num_layers
    if variant != "adakv" and context_length < 2 * base:
        return [average] * num_layers
    smallest = base // beta
    largest = 2 * base - smallest
    if largest >= context_length - window:
        largest = context_length - window
        smallest = 2 * base - largest
    if variant == "sum_preserving":
        return _sum_preserving(largest, smallest, window, average, num_layers)
    steps = (largest - smallest) // (num_layers - 1)
    selected = [largest - layer * steps for layer in range(num_layers)]
    return [context_length if count > context_length - window else count + window for count in selected]


def _sum_preserving(largest: int, smallest: int, window: int, average: int, num_layers: int) -> list[int]:
    step = (largest - smallest) / (num_layers - 1)
    budgets = [round(largest - layer * step) + window for layer in range(num_layers)]
    remainder = average * num_layers - sum(budgets)
    order = range(num_layers) if remainder > 0 else range(num_layers - 1, -1, -1)
    for layer in list(order)[: abs(remainder)]:
        budgets[layer] += 1 if remainder > 0 else -1
    return budgets


class PyramidLayerAllocator(StaticLayerAllocator):
    """PyramidKV's linear per-layer schedule (:func:`pyramid_schedule`), largest at layer 0.

    The mean per-layer budget ``C`` is ``total // num_layers`` (window included).
    """

    def __init__(self, beta: int, window: int, schedule: str = "kvcache_factory") -> None:
        check_min("method.params.beta", beta, 1)
        check_choice("method.params.schedule", schedule, PYRAMID_SCHEDULES)
        self.beta = beta
        self.window = window
        self.schedule = schedule

    def plan(self, total: int, num_layers: int, context_length: int) -> list[int]:
        window = min(self.window, context_length)
        return pyramid_schedule(total // num_layers, window, self.beta, num_layers, context_length, self.schedule)
