"""PyramidKV (family ``pyramidkv``, kvbench/methods/snapkv.py): the pyramid layer schedule's shape for every
schedule variant, over layer counts, budgets and context lengths."""

from __future__ import annotations

import pytest

from kvbench.methods.snapkv import PyramidLayerAllocator


@pytest.mark.parametrize("num_layers", [1, 2, 4, 32, 80])
@pytest.mark.parametrize("avg", [40, 64, 128, 1024, 2048])
@pytest.mark.parametrize("context", [100, 3000, 30000])
@pytest.mark.parametrize("schedule", ["kvcache_factory", "adakv", "sum_preserving"])
def test_pyramid_schedule_shape(num_layers: int, avg: int, context: int, schedule: str) -> None:
    budgets = PyramidLayerAllocator(beta=20, window=32, schedule=schedule).plan(avg * num_layers, num_layers, context)
    assert len(budgets) == num_layers
    assert all(0 < b <= max(context, avg) for b in budgets)
    if schedule == "sum_preserving":
        assert sum(budgets) == min(avg, context) * num_layers or context < 2 * (avg - 32)
    compressed = [b for b in budgets if b < context]
    assert compressed == sorted(compressed, reverse=True)  # never larger at a higher layer
    if num_layers > 1 and context >= 2 * (avg - 32) + 32 and avg > 32 and schedule != "sum_preserving":
        # the reference's floor division: the schedule never spends less than L x C
        assert sum(min(b, context) for b in budgets) >= min(avg, context) * num_layers - num_layers
