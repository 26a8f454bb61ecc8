"""Ada-KV's head allocation over any scorer against NVIDIA/kvpress's ``AdaKVPress`` (0.5.5).

``allocation=ada_kvpress`` is kvpress's reading (safeguard, then one top-k over the layer): the same kept tokens per
head, or another valid top-k where kvpress's scores tie.  ``allocation=ada`` is the reference code's reading
(FFY0/AdaKV's floor blend and rounding), which gives some heads a token more or less than kvpress: measured here, not
asserted equal."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvbench.eviction.base import build_method
from kvbench.eviction.kvpress_ada import KVPRESS_ALPHA_SAFEGUARD, KvpressAdaAllocator
from tests.methods.helpers import method_from_yaml
from tests.methods.kvpress_replay import rotary_observation
from tests.methods.wrapper_replay import replay_kept, window_observation
from tests.reference_recordings import RecordedCase, is_valid_topk, kvpress_n_kept


def tied_layer_topk(case: RecordedCase, layer: int, kept: list[list[int]]) -> bool:
    """Another of kvpress's choices among tied scores: the layer keeps kvpress's total; every head its top
    ``n_safe`` (the safeguard) and a top-k of its own recorded scores; beyond the safeguards, no evicted score of any
    head exceeds a kept one (one top-k over the layer)."""
    scores = case.layer_scores(layer)
    n_kept = kvpress_n_kept(case.length, case.compression_ratio)
    n_safe = max(1, int(n_kept * KVPRESS_ALPHA_SAFEGUARD))
    if sum(map(len, kept)) != sum(map(len, case.kept[layer])) or min(map(len, kept)) < n_safe:
        return False
    beyond_safe, evicted = [], []
    for head, positions in enumerate(kept):
        if not is_valid_topk(scores[head], positions):
            return False
        beyond_safe.append(scores[head][positions].sort(descending=True).values[n_safe:])
        dropped = torch.ones(scores.shape[1], dtype=torch.bool)
        dropped[positions] = False
        evicted.append(scores[head][dropped])
    lowest_kept, highest_evicted = torch.cat(beyond_safe), torch.cat(evicted)
    return lowest_kept.numel() == 0 or highest_evicted.numel() == 0 or lowest_kept.min() >= highest_evicted.max()


def test_ada_kvpress_over_knorm_keeps_kvpress_tokens() -> None:
    method = build_method({"name": "knorm", "family": "knorm", "params": {"allocation": "ada_kvpress"}})
    tally = replay_kept(method, "AdaKVPress_KnormPress", valid=tied_layer_topk)
    assert tally.cases == 16 and tally.differ == 0 and tally.same > tally.tied_valid


def test_ada_kvpress_over_snapkv_and_expected_attention_keeps_kvpress_tokens() -> None:
    snapkv = dataclasses.replace(method_from_yaml("snapkv_kvpress", window=16), head_allocator=KvpressAdaAllocator())
    tally = replay_kept(snapkv, "AdaKVPress_SnapKVPress", window_observation(16), valid=tied_layer_topk)
    assert tally.cases == 16 and tally.differ == 0, tally
    params = {"allocation": "ada_kvpress", "epsilon": 0.01}
    expected = build_method({"name": "ea", "family": "expected_attention", "params": params})
    tally = replay_kept(expected, "AdaKVPress_ExpectedAttentionPress", rotary_observation, valid=tied_layer_topk)
    assert tally.cases == 16 and tally.differ == 0, tally


def test_ada_reference_reading_differs_from_kvpress_by_head_counts() -> None:
    """The reference code's reading keeps kvpress's layer total within rounding but splits it differently."""
    method = build_method({"name": "knorm", "family": "knorm", "params": {"allocation": "ada"}})
    tally = replay_kept(method, "AdaKVPress_KnormPress", valid=tied_layer_topk)
    assert tally.cases == 16 and tally.same > 0 and tally.differ > 0


@pytest.mark.parametrize("budget", [1, 3, 5])
def test_ada_kvpress_counts_sum_to_the_layer_budget_with_a_safeguard(budget: int) -> None:
    scores = torch.tensor([[9.0, 8, 7, 6, 5, 4], [0.1, 0.2, 0.0, 0.3, 0.05, 0.01]])
    counts = KvpressAdaAllocator().allocate(scores, budget)
    assert sum(counts) == 2 * budget and min(counts) >= max(1, int(budget * 0.2))
    assert counts[0] >= counts[1]
