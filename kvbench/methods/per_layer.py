"""A compression ratio per layer over any scorer: NVIDIA/kvpress 0.5.5's ``PerLayerCompressionPress`` (issue #58).

Reproduces ``kvpress/presses/per_layer_compression_press.py``: layer ``l`` of the wrapped scorer keeps
``max(1, int(S (1 - c_l)))`` tokens per head, ``c_l`` = ``compression_ratios[l]`` (one per compressible layer;
kvpress: one per model layer), its top by the scorer's scores; kvpress's ``compression_ratio`` is their mean ``c``.

In kvbench the budget still sets the size and the ratios its profile over the layers
(:class:`PerLayerRatioAllocator`): layer ``l`` keeps ``max(1, int(n (1 - c_l) / (1 - c)))`` of a budget's mean ``n``
per layer (unrounded: ``S (1 - c')`` for ``<c'>cr``), so ``budget=64L`` keeps 64 per layer on average, more where the
ratio is low.  At kvpress's own budget, ``<c>cr`` with ``c`` the ratios' mean, every layer keeps exactly kvpress's
``max(1, int(S (1 - c_l)))``.  ``<n>/layer`` bypasses layer allocators (every layer keeps ``n``), as for every method.

``method=per_layer`` (``conf/method/per_layer.yaml``: KNorm, the three layers of the embedded default model);
``method.params.press`` picks the scorer (its knobs ride along).  Parity: ``tests/methods/test_composed.py``
(recordings ``PerLayerCompressionPress_*``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvbench.budget import Budget
from kvbench.eviction.base import EvictionMethod, StaticLayerAllocator
from kvbench.eviction.over_press import OverPress
from kvbench.eviction.state import AllocatorState

REFERENCE = "NVIDIA/kvpress kvpress/presses/per_layer_compression_press.py@0.5.5 (PerLayerCompressionPress)"


class PerLayerRatioAllocator(StaticLayerAllocator):
    """Layer budgets from per-layer compression ratios (module docstring)."""

    def __init__(self, ratios: Sequence[float]) -> None:
        self.ratios = tuple(float(ratio) for ratio in ratios)
        if not self.ratios or not all(0 <= ratio < 1 for ratio in self.ratios):
            raise ValueError(
                f"method.params.compression_ratios={list(self.ratios)}: one compression ratio in [0, 1) per layer"
            )
        self.mean = sum(self.ratios) / len(self.ratios)

    def plan(self, total: int, num_layers: int, context_length: int) -> list[int]:
        return self._plan(total / num_layers, num_layers, context_length, exact=False)

    def start_sample(
        self, budget: Budget, num_layers: int, context_length: int, dataset: Any = None, *, extra_per_layer: int = 0
    ) -> AllocatorState:
        """The budgets from the budget's unrounded mean; kvpress's exact counts at ``<c>cr`` with ``c`` the mean."""
        state = super().start_sample(budget, num_layers, context_length, dataset, extra_per_layer=extra_per_layer)
        exact = budget.kind == "compression" and abs(budget.value - self.mean) < 1e-12 and not extra_per_layer
        average = budget.unrounded_mean_per_layer(context_length) + extra_per_layer
        state.budgets = self._plan(average, num_layers, context_length, exact=exact)
        return state

    def _plan(self, average: float, num_layers: int, context_length: int, *, exact: bool) -> list[int]:
        if len(self.ratios) != num_layers:
            raise ValueError(
                f"method.params.compression_ratios has {len(self.ratios)} ratios for a model with {num_layers} "
                "compressible layers: give one per layer (kvpress's PerLayerCompressionPress)"
            )
        if exact:  # kvpress's compute_n_kept per layer
            budgets = [max(1, int(context_length * (1 - ratio))) for ratio in self.ratios]
        else:
            budgets = [max(1, int(average * (1 - ratio) / (1 - self.mean))) for ratio in self.ratios]
        return [min(budget, context_length) for budget in budgets]


@dataclass(frozen=True)
class PerLayerCompression(OverPress, family="per_layer"):
    """PerLayerCompressionPress's knob: the ratio of each layer; the wrapped scorer (``press``) ranks the tokens."""

    #: kvpress's ``compression_ratios``: one compression ratio in ``[0, 1)`` per compressible layer.
    compression_ratios: Any = (0.25, 0.5, 0.75)

    def build(self, method_cfg: Any) -> EvictionMethod:
        """The wrapped scorer's method under the per-layer budgets."""
        inner = self.build_inner(method_cfg)
        allocator = PerLayerRatioAllocator(list(self.compression_ratios))
        return dataclasses.replace(
            inner, family=self.family, layer_allocator=allocator, settings=self.settings_of(inner, REFERENCE)
        )
