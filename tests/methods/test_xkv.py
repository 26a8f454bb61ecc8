"""XKV: the greedy allocation is the brute-force optimum (and its dual the least total); sampled mode reuses one."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from kvbench.eviction.base import WindowObservation
from kvbench.eviction.token_scores import ScoreOptions, window_attention
from kvbench.methods.xkv import (
    XKVCalibration,
    XKVLayerAllocator,
    XKVScorer,
    mean_retention,
    rescale_shares,
    xkv_allocate,
    xkv_allocate_for_retention,
)
from tests.methods.helpers import method_from_yaml, run_method
from tests.methods.test_cake import _prefill_layers, _random_layers


def _all_splits(lengths: list[int], total: int):
    for split in itertools.product(*(range(n + 1) for n in lengths)):
        if sum(split) == total:
            yield list(split)


def _layers(seed: int, lengths=(5, 4, 6)) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.rand(n, generator=gen) ** (1 + 3 * i) for i, n in enumerate(lengths)]


@pytest.mark.parametrize("seed", range(8))
def test_greedy_allocation_is_the_brute_force_optimum(seed: int) -> None:
    scores = _layers(seed)
    lengths = [s.numel() for s in scores]
    for total in range(sum(lengths) + 1):
        allocation = xkv_allocate(scores, total)
        assert sum(allocation) == total
        assert all(0 <= n <= cap for n, cap in zip(allocation, lengths, strict=True))
        best = max(mean_retention(scores, split) for split in _all_splits(lengths, total))
        assert mean_retention(scores, allocation) == pytest.approx(best, abs=1e-12)


def test_retention_is_the_normalised_top_n_mass() -> None:
    scores = [torch.tensor([4.0, 1.0, 3.0, 2.0]), torch.tensor([1.0, 1.0])]
    # R_0(2) = (4 + 3) / 10, R_1(1) = 1 / 2 -> mean 0.6
    assert mean_retention(scores, [2, 1]) == pytest.approx(0.6)
    # Ties go to the lowest layer (the paper's Max + Getindex).
    assert xkv_allocate([torch.ones(3), torch.ones(3)], 1) == [1, 0]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("target", [0.3, 0.55, 0.8, 0.95])
def test_dual_allocation_is_the_least_total_reaching_the_target(seed: int, target: float) -> None:
    scores = _layers(seed)
    lengths = [s.numel() for s in scores]
    allocation = xkv_allocate_for_retention(scores, target)
    used = sum(allocation)
    assert mean_retention(scores, allocation) >= target - 1e-12
    if used > 0:  # no split with one token less reaches the target
        assert max(mean_retention(scores, s) for s in _all_splits(lengths, used - 1)) < target


def test_scorer_is_window_mean_with_average_pooling() -> None:
    gen = torch.Generator().manual_seed(3)
    keys = torch.randn(2, 60, 8, generator=gen)
    queries = torch.randn(4, 8, 8, generator=gen)
    observation = WindowObservation(0, 1, queries, keys, keys, 8**-0.5)
    attention = window_attention(queries, keys, 8**-0.5)
    mean = attention.mean(dim=1)[:, :52]
    pooled = torch.nn.functional.avg_pool1d(mean[:, None], 7, 1, 3)[:, 0]  # padding counted (SnapKV family)
    options = ScoreOptions(kernel_size=7, pooling="avg")
    shared = XKVScorer(options, "layer_shared").score(observation)
    torch.testing.assert_close(shared[:, :52], pooled.mean(dim=0, keepdim=True).expand(2, -1))
    per_head = XKVScorer(options, "per_head").score(observation)
    torch.testing.assert_close(per_head[:, :52], pooled.reshape(2, 2, 52).mean(dim=1))


def test_session_applies_the_allocation_with_the_window_kept() -> None:
    layers = _random_layers(5, 4, context=120)
    method = method_from_yaml("xkv")
    cache, session = _prefill_layers(method, "40L", layers)
    budgets = session.record.requested_per_layer
    assert sum(budgets) == 40 * 5 and len(set(budgets)) > 1
    assert budgets == session.record.achieved_per_layer
    expected = session.allocator_state.budgets  # the sample's own state, in its session
    assert budgets == [n + 8 for n in expected]  # ows = 8 window tokens on top of each n_i
    for layer in cache.headwise_layers:
        positions = [p.tolist() for p in layer.positions]
        assert positions[0] == positions[1]  # layer_shared: one vector per layer
        assert set(range(112, 120)) <= set(positions[0])  # the observation window stays
    # All layers are needed first: the prefill peak is the full cache.
    assert session.record.peak_prefill_bytes == 5 * 120 * 2 * 16 * 4 * 2


def test_sampled_mode_reuses_one_averaged_allocation() -> None:
    method = method_from_yaml("xkv_sampled", params={"sampling": True, "sample_ratio": 0.1, "task_samples": 20})
    allocator = method.layer_allocator
    assert isinstance(allocator, XKVLayerAllocator)
    # Without a dataset's state a sample stands alone: a fresh calibration sized by params.task_samples.
    _, alone = _prefill_layers(method, "40L", _random_layers(4, 0, context=120))
    assert alone.allocator_state.dataset.calibration_samples == 2
    dataset = allocator.new_dataset_state("task", 20)  # the runner's per-dataset state, passed to every session
    assert isinstance(dataset, XKVCalibration) and dataset.calibration_samples == 2
    records = [
        _prefill_layers(method, "40L", _random_layers(4, seed, context=120), dataset_state=dataset)[1].finish()
        for seed in range(5)
    ]
    calibration = dataset.allocations[:2]
    assert calibration[0] != calibration[1]  # personalised while calibrating
    reused = dataset.allocations[2:]
    assert reused[0] == reused[1] == reused[2]
    shares = [sum(col) / 2 for col in zip(*[[n / sum(a) for n in a] for a in calibration], strict=True)]
    assert reused[0] == rescale_shares(shares, 4 * 32, [112] * 4)
    assert all(r.requested_per_layer == records[2].requested_per_layer for r in records[2:])
    # Reused allocations are known upfront: layers are evicted as they come, the peak drops below the full cache.
    assert records[3].peak_prefill_bytes < records[0].peak_prefill_bytes
    # A new dataset starts a new calibration; a resumed one is fed the shares its finished samples recorded.
    fresh = allocator.new_dataset_state("next", 30)
    assert fresh.calibration_samples == 3 and fresh.shared_shares is None
    resumed = allocator.new_dataset_state("task", 20, [r.allocator_state for r in records[:2]])
    assert resumed.shared_shares == dataset.shared_shares


def test_rescale_shares_is_exact() -> None:
    assert sum(rescale_shares([0.5, 0.3, 0.2], 7, [10, 10, 10])) == 7
    assert rescale_shares([0.9, 0.1], 10, [5, 10]) == [5, 5]
    assert math.isclose(sum(rescale_shares([1 / 3] * 3, 100, [100] * 3)), 100)


@pytest.mark.parametrize("head_mode", ["layer_shared", "per_head"])
def test_tiny_model_budgets(tiny_llama, head_mode: str) -> None:
    model, tokenizer = tiny_llama
    record = run_method(model, tokenizer, method_from_yaml("xkv", params={"head_mode": head_mode}), "64L", new=6).record
    assert sum(record.requested_per_layer) == 64 * 4
    assert record.requested_per_layer == record.achieved_per_layer
    assert record.final_per_layer == [b + 5 for b in record.requested_per_layer]  # no decode eviction
