"""PyramidKV's layer budgets as NVIDIA/kvpress 0.5.5 computes them (``PyramidKVPress.get_layer_budget``; issue #43).

``method=pyramidkv_kvpress`` (family ``pyramidkv``, ``params.schedule: kvpress``).  kvpress's press keeps a ratio
``1 - c`` of the context on average: with ``n = S (1 - c)`` and the window ``W`` (64),

* ``min = n / beta``, ``max = 2 n - min`` (floats); if ``max >= S - W``: ``max = S - W``, ``min = 2 n - max``;
* unless ``S >= max >= min >= W``, every layer keeps ``max(1, round(n))`` (kvpress's fall-back to SnapKV: with beta
  20 that is every context with ``n < 20 W = 1280`` tokens kept);
* else layer ``l`` keeps ``round(max - l (max - min) / (L - 1))`` tokens, **window included** (kvpress's top-k over
  every token, the window scored ``max + 1``); no uniform branch, no "nothing evicted when ``S < C``".

Unlike KVCache-Factory's schedule (:func:`kvbench.methods.snapkv.pyramid_schedule`), the arithmetic is in floats,
rounded per layer with Python's ``round`` (half to even), and the window sits inside the layer budget.  kvbench's
mean per layer is the budget's (``<n>L``; ``<c>cr`` gives ``max(1, int(S (1 - c)))``); kvpress uses ``S (1 - c)``
unrounded, so where ``S (1 - c)`` is not an integer a layer's budget may differ by up to two tokens (its
fraction enters ``2 n``; one token in the fall-back, ``round`` against ``int``); the recorded cases' ``S (1 - c)``
are integers.
"""

from __future__ import annotations

from kvbench.checks import check_min
from kvbench.methods.base import StaticLayerAllocator


def kvpress_pyramid_budgets(average: float, window: int, beta: int, num_layers: int, context_length: int) -> list[int]:
    """Tokens kept per layer (window included) by kvpress's ``PyramidKVPress`` for a mean of ``average`` per layer
    (``S (1 - compression_ratio)``), as its ``get_layer_budget`` computes them (module docstring)."""
    smallest = average / beta
    largest = 2 * average - smallest
    if largest >= context_length - window:
        largest = context_length - window
        smallest = 2 * average - largest
    if not context_length >= largest >= smallest >= window:
        return [max(1, round(average))] * num_layers
    steps = (largest - smallest) / (num_layers - 1) if num_layers > 1 else 0.0
    return [round(largest - layer * steps) for layer in range(num_layers)]


class KvpressPyramidAllocator(StaticLayerAllocator):
    """kvpress's ``PyramidKVPress`` layer budgets (:func:`kvpress_pyramid_budgets`), largest at layer 0; the mean
    per layer is ``total // num_layers``; a layer budget above the context keeps every token."""

    def __init__(self, beta: int, window: int) -> None:
        check_min("method.params.beta", beta, 1)
        self.beta = beta
        self.window = window

    def plan(self, total: int, num_layers: int, context_length: int) -> list[int]:
        budgets = kvpress_pyramid_budgets(total // num_layers, self.window, self.beta, num_layers, context_length)
        return [min(budget, context_length) for budget in budgets]
