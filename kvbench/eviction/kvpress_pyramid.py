"""PyramidKV's layer budgets as NVIDIA/kvpress 0.5.5 computes them (``PyramidKVPress.get_layer_budget``; issue #43).

``method=pyramidkv_kvpress`` (family ``pyramidkv``, ``params.schedule: kvpress``).  kvpress's press keeps a ratio
``1 - c`` of the context on average: with ``n = S (1 - c)`` and the window ``W`` (64),

* ``min = n / beta``, ``max = 2 n - min`` (floats); if ``max >= S - W``: ``max = S - W``, ``min = 2 n - max``;
* unless ``S >= max >= min >= W``, every layer keeps ``max(1, round(n))`` (kvpress's fall-back to SnapKV: with beta
  20 that is every context with ``n < 20 W = 1280`` tokens kept);
* else layer ``l`` keeps ``round(max - l (max - min) / (L - 1))`` tokens, **window included** (kvpress's top-k over
  every token, the window scored ``max + 1``); no uniform branch, no "nothing evicted when ``S < C``".

Unlike KVCache-Factory's schedule (:func:`kvbench.methods.snapkv.pyramid_schedule`), the arithmetic is in floats,
rounded per layer with Python's ``round`` (half to even), and the window sits inside the layer budget.  With a
``<c>cr`` budget the mean ``n`` is kvpress's unrounded ``S (1 - c)`` (:meth:`KvpressPyramidAllocator.start_sample`;
``n`` is computed as kvpress does, ``(W + S (1 - c)) - W``, so the floats round alike); with ``<n>L`` it is ``n``.
``tests/methods/test_kvpress_pyramid.py`` checks every layer's count against kvpress's on 378 recorded cases.
"""

from __future__ import annotations

from typing import Any

from kvbench.budget import Budget
from kvbench.checks import check_min
from kvbench.eviction.base import StaticLayerAllocator
from kvbench.eviction.state import AllocatorState


def kvpress_pyramid_budgets(average: float, window: int, beta: int, num_layers: int, context_length: int) -> list[int]:
    """Tokens kept per layer (window included) by kvpress's ``PyramidKVPress`` for a mean of ``average`` per layer
    (``S (1 - compression_ratio)``, unrounded), as its ``get_layer_budget`` computes them (module docstring)."""
    spread = (window + average) - window  # kvpress: max_capacity_prompt - window_size, in floats
    smallest = spread / beta
    largest = spread * 2 - smallest
    if largest >= context_length - window:
        largest = context_length - window
        smallest = spread * 2 - largest
    if not context_length >= largest >= smallest >= window:
        return [max(1, round(average))] * num_layers
    steps = (largest - smallest) / (num_layers - 1) if num_layers > 1 else 0.0
    return [round(largest - layer * steps) for layer in range(num_layers)]


class KvpressPyramidAllocator(StaticLayerAllocator):
    """kvpress's ``PyramidKVPress`` layer budgets (:func:`kvpress_pyramid_budgets`), largest at layer 0; the mean
    per layer is the budget's unrounded one (:meth:`start_sample`), or ``total // num_layers`` when planned from a
    total; a layer budget above the context keeps every token."""

    def __init__(self, beta: int, window: int) -> None:
        check_min("method.params.beta", beta, 1)
        self.beta = beta
        self.window = window

    def plan(self, total: int, num_layers: int, context_length: int) -> list[int]:
        return self._plan(total // num_layers, num_layers, context_length)

    def start_sample(
        self, budget: Budget, num_layers: int, context_length: int, dataset: Any = None, *, extra_per_layer: int = 0
    ) -> AllocatorState:
        """The budgets from the budget's mean before rounding (``<c>cr``: kvpress's ``S (1 - c)``; ``<n>L``: ``n``)."""
        state = super().start_sample(budget, num_layers, context_length, dataset, extra_per_layer=extra_per_layer)
        average = budget.unrounded_mean_per_layer(context_length) + extra_per_layer
        state.budgets = self._plan(average, num_layers, context_length)
        return state

    def _plan(self, average: float, num_layers: int, context_length: int) -> list[int]:
        budgets = kvpress_pyramid_budgets(average, self.window, self.beta, num_layers, context_length)
        return [min(budget, context_length) for budget in budgets]
