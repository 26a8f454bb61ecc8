"""SnapKV (kvbench/methods/snapkv.py): the observation window's votes; on the tiny model, a budget at or above the
context and the window outside the budget (PyramidKV's layer schedule: test_pyramidkv.py)."""

from __future__ import annotations

import torch

from kvbench.eviction.base import WindowObservation
from kvbench.eviction.token_scores import ScoreOptions, window_attention
from kvbench.methods.snapkv import WindowVoteScorer
from tests.methods.helpers import dominant_case, method_from_yaml, run_method


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


def test_budget_at_or_above_context_evicts_nothing_and_says_so(tiny_llama) -> None:
    model, tokenizer = tiny_llama
    record = run_method(model, tokenizer, method_from_yaml("snapkv"), "512L", context=300, new=1).record
    assert not record.evicted
    assert record.achieved_per_layer == record.requested_per_layer == [320] * 4


def test_window_outside_budget_adds_the_window(tiny_llama) -> None:
    model, tokenizer = tiny_llama
    method = method_from_yaml("snapkv", window_in_budget=False)
    record = run_method(model, tokenizer, method, "64L", new=1).record
    assert record.achieved_per_layer == [64 + 32] * 4
