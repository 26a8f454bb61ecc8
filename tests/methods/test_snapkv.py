"""SnapKV and PyramidKV (kvbench/methods/snapkv.py): the observation window's votes and the pyramid layer schedule."""

from __future__ import annotations

import pytest
import torch

from kvbench.methods.base import WindowObservation
from kvbench.methods.snapkv import PyramidLayerAllocator, WindowVoteScorer
from kvbench.methods.token_scores import ScoreOptions, window_attention
from tests.methods.helpers import dominant_case


def test_snapkv_scores_use_window_queries_only() -> None:
    keys, query = dominant_case()
    observation = WindowObservation(0, 1, query[:, -32:], keys, keys, 0.25)
    stats = observation.window_stats()
    assert stats.col_sum.shape == (4, 200) and stats.row_lse.shape == (4, 32)  # per key / per row, no matrix
    probs = window_attention(query[:, -32:], keys, 0.25)
    torch.testing.assert_close(stats.col_sum, probs.sum(dim=1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(probs.sum(-1), torch.ones(4, 32))
    assert probs[:, 0, 200 - 31 :].abs().max() == 0  # causal inside the window
    votes = WindowVoteScorer(ScoreOptions(kernel_size=7, pooling="max")).score(observation)
    assert int(votes[0].argmax()) in range(54, 61)  # pooled around the dominant key


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
