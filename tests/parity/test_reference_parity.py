"""Every preset selects what its reference code selects (kvbench issue #15).

Two kinds of tests, both on plain CPU float32 tensors:

* hand-computed cases, one per rule of the references: candidate-only pooling, average pooling counting its
  padding, GQA reduction before pooling (KVCache-Factory ``kv_head`` / AdaKV ``gqa_support``) or after (CAKE),
  PyramidKV's integer schedules, Ada-KV's per-head rounding, CAKE's ``adjust_budgets``, H2O's all-rows scores;
* property tests on random tensors: the kept tokens of a full eviction session are a valid top-k of scores computed
  by the small reference implementations written below from the reference semantics (ties allowed), with the
  reference's integer budgets.

The reference implementations here follow the original code's order of operations (float32 softmax of the window
rows with the window-causal mask, reductions, slicing, pooling, ``topk``) and are deliberately independent of
kvbench's own code paths.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kvbench.budget import parse_budget
from kvbench.cache.kv_cache import KVBenchCache
from kvbench.eviction.base import WindowObservation
from kvbench.eviction.token_scores import ScoreOptions, pool_scores
from kvbench.inference.eviction import EvictionSession
from kvbench.kernels.reference import stats_of_probs
from kvbench.methods.adakv import ada_capacities
from kvbench.methods.cake import CakeScorer, adjust_budgets, preference_shares
from kvbench.methods.snapkv import WindowVoteScorer, pyramid_schedule
from tests.methods.helpers import LayerIndex, method_from_yaml


# ============================================================================================ reference semantics
def ref_window_probs(queries: torch.Tensor, keys: torch.Tensor, window: int) -> torch.Tensor:
    """``[H_q, W, S]``: ``q[-W:] @ repeat_kv(k)^T / sqrt(d)``, ``finfo.min`` on the window's future, fp32 softmax."""
    num_q, _, dim = queries.shape
    keys = keys.repeat_interleave(num_q // keys.shape[0], dim=0)
    logits = queries[:, -window:] @ keys.transpose(1, 2) / math.sqrt(dim)
    mask = torch.full((window, window), torch.finfo(logits.dtype).min)
    mask = torch.triu(mask, diagonal=1)
    logits[:, :, -window:] += mask
    return torch.softmax(logits, dim=-1, dtype=torch.float32)


def ref_group(scores: torch.Tensor, num_heads: int, how: str = "mean") -> torch.Tensor:
    grouped = scores.reshape(num_heads, scores.shape[0] // num_heads, -1)
    return {"mean": grouped.mean(1), "max": grouped.amax(1), "sum": grouped.sum(1)}[how]


def ref_pool(scores: torch.Tensor, kernel: int, pooling: str) -> torch.Tensor:
    layer = F.max_pool1d if pooling == "max" else F.avg_pool1d
    return layer(scores[:, None], kernel_size=kernel, padding=kernel // 2, stride=1)[:, 0]


def ref_snapkv_scores(queries, keys, window, kernel=7, pooling="max", rows="sum", kv_head=True) -> torch.Tensor:
    """SnapKV/PyramidKV (``rows=sum``) and Ada-KV (``rows=mean``) candidate scores ``[H, S-W]``."""
    probs = ref_window_probs(queries, keys, window)
    reduced = probs.sum(dim=-2) if rows == "sum" else probs.mean(dim=-2)
    candidates = reduced[:, :-window]
    if kv_head:
        candidates = ref_group(candidates, keys.shape[0])
    return ref_pool(candidates, kernel, pooling)


def ref_h2o_scores(queries, keys, window, kv_head=True) -> torch.Tensor:
    """Column sums of the whole causal attention over the candidates ``[H, S-W]``."""
    num_q, length, dim = queries.shape
    full = keys.repeat_interleave(num_q // keys.shape[0], dim=0)
    logits = queries @ full.transpose(1, 2) / math.sqrt(dim)
    logits += torch.triu(torch.full((length, length), torch.finfo(logits.dtype).min), diagonal=1)
    sums = torch.softmax(logits, dim=-1, dtype=torch.float32)[:, :, :-window].sum(dim=-2)
    return ref_group(sums, keys.shape[0]) if kv_head else sums


def ref_cake_scores(queries, keys, window, gamma=200.0, kernel=5) -> torch.Tensor:
    probs = ref_window_probs(queries, keys, window)
    indicator = (probs.mean(dim=-2) + gamma * probs.var(dim=-2))[:, :-window]
    pooled = F.avg_pool1d(indicator[:, None], kernel_size=kernel, padding=kernel // 2, stride=1)[:, 0]
    return ref_group(pooled, keys.shape[0])


def ref_cake_preference(queries, keys, window, tau1=1.0, tau2=1.0) -> np.float32:
    probs = ref_window_probs(queries, keys, window)[:, :, :-window]
    entropy = -torch.sum(probs * torch.log(probs + 1e-10))
    variance = torch.var(probs, dim=-2).sum(0).sum(0)
    return (entropy ** (1 / tau1) * variance ** (1 / tau2)).numpy()


def ref_adjust_budgets(budgets: list, total: int, cap: int) -> list[int]:
    """CAKE's ``adjust_budgets`` in numpy, step by step."""
    arr = np.array(budgets, dtype=int)
    excess = np.maximum(arr - cap, 0)
    arr = np.minimum(arr, cap)
    total_excess = int(np.sum(excess))
    if total_excess > 0:
        valid = arr < cap
        if np.sum(valid) > 0:
            arr[valid] += total_excess // int(np.sum(valid))
            arr[np.where(valid)[0][: total_excess % int(np.sum(valid))]] += 1
    diff = total - int(np.sum(arr))
    if diff != 0:
        valid = arr < cap if diff > 0 else arr > 1
        count = int(np.sum(valid))
        if count > 0:
            step, rest = abs(diff) // count, abs(diff) % count
            sign = 1 if diff > 0 else -1
            arr[valid] += sign * step
            arr[np.where(valid)[0][:rest]] += sign
    return arr.tolist()


def ref_pyramid(avg: int, window: int, beta: int, layers: int, length: int, adakv: bool) -> list[int | None]:
    """Selected candidates per layer (None = no compression), PyramidKVCluster / AdaKV pyram_mode."""
    base = avg - window
    if not adakv and length < avg:
        return [None] * layers
    min_num = base // beta
    max_num = base * 2 - min_num
    if max_num >= length - window:
        max_num = length - window
        min_num = base * 2 - max_num
    steps = (max_num - min_num) // (layers - 1)
    if not adakv and length < base * 2:
        return [base] * layers
    selected = [max_num - layer * steps for layer in range(layers)]
    return [None if adakv and s > length - window else s for s in selected]


def ref_ada_counts(scores: torch.Tensor, base: int, alpha: float, normalize: bool = False) -> list[int]:
    """AdaKV head capacities for candidate scores ``[H, S-W]``."""
    heads, length = scores.shape
    ranked = scores.sort(dim=-1, descending=True).values
    if normalize:
        ranked = ranked * (ranked[:, :base].sum(-1, keepdim=True) / ranked.sum(-1, keepdim=True))
    top = torch.topk(ranked.reshape(1, heads * length), k=heads * base, dim=-1).indices // length
    counts = torch.zeros((1, heads), dtype=top.dtype).scatter_add_(-1, top, torch.ones_like(top))
    return torch.round(counts * (1 - alpha) + int(base * alpha)).int()[0].tolist()


# ============================================================================================ kvbench drivers
def _session(method, budget: str, layers: list[tuple[torch.Tensor, torch.Tensor]], expand: int = 1):
    """Run kvbench's prefill eviction over ``layers`` of (keys ``[H, S, D]``, queries ``[H_q, S, D]``)."""
    cache = KVBenchCache(len(layers), expand_factor=expand)
    session = EvictionSession(method, parse_budget(budget), cache)
    session.begin_prefill(layers[0][0].shape[1])
    for idx, (keys, queries) in enumerate(layers):
        cache.update(keys[None], keys[None].clone(), idx)
        session.after_attention(LayerIndex(idx), queries[None], keys.shape[-1] ** -0.5)
    session.begin_decode()
    return cache, session


def _random_layer(seed: int, heads: int, groups: int, length: int, dim: int = 16, sharp: float = 1.0):
    gen = torch.Generator().manual_seed(seed)
    keys = torch.randn(heads, length, dim, generator=gen)
    queries = torch.randn(heads * groups, length, dim, generator=gen) * sharp
    return keys, queries


def assert_valid_topk(kept: list[int], scores: torch.Tensor, window: int, length: int, count: int) -> None:
    """``kept`` positions = the window + ``count`` candidates that are a top-``count`` of ``scores`` (ties allowed)."""
    kept_set = set(kept)
    assert set(range(length - window, length)) <= kept_set, "the window must be kept"
    chosen = sorted(p for p in kept_set if p < length - window)
    assert len(chosen) == count, (len(chosen), count)
    if count == 0 or count == scores.numel():
        return
    mask = torch.zeros(scores.numel(), dtype=torch.bool)
    mask[chosen] = True
    assert float(scores[mask].min()) >= float(scores[~mask].max()), "a dropped candidate outranks a kept one"


# ============================================================================================ hand-computed rules
def _observation_with(probs: torch.Tensor, num_heads: int) -> WindowObservation:
    """An observation whose window attention is ``probs`` ``[H_q, W, S]`` (keys only give the shapes): its
    statistics are set to those of ``probs`` (float32 model, so no probability rounding)."""
    num_q, window, length = probs.shape
    observation = WindowObservation(0, 1, torch.zeros(num_q, window, 4), torch.zeros(num_heads, length, 4),
                                    torch.zeros(num_heads, length, 4), 0.5)  # fmt: skip
    observation.use_window_stats(stats_of_probs(probs))
    return observation


def test_candidate_only_pooling_keeps_window_votes_out_of_the_last_candidates() -> None:
    # S = 8, W = 2: candidates 0..5.  The window votes heavily for itself (columns 6, 7).
    votes = torch.tensor([[1.0, 0, 0, 0, 0, 0, 9.0, 9.0]])  # summed over the window rows
    probs = torch.zeros(1, 2, 8)
    probs[0, 0] = votes[0] / 2
    probs[0, 1] = votes[0] / 2
    scores = WindowVoteScorer(ScoreOptions(kernel_size=3, pooling="max")).score(_observation_with(probs, 1))
    # Pooling over the candidates only: candidate 5 sees max(0, 0) = 0, not the window's 9.
    assert scores[0, :6].tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert scores[0, 6:].tolist() == [0.0, 0.0]  # window columns are protected, not scored


def test_average_pooling_counts_the_padding() -> None:
    scores = torch.tensor([[3.0, 0.0, 0.0, 6.0]])
    torch.testing.assert_close(pool_scores(scores, 3, "avg"), torch.tensor([[1.0, 1.0, 2.0, 2.0]]))
    torch.testing.assert_close(
        pool_scores(scores, 3, "avg", include_padding=False), torch.tensor([[1.5, 1.0, 2.0, 3.0]])
    )


def test_gqa_reduction_before_pooling_and_cakes_after() -> None:
    # Two query heads sharing one KV head, votes over 6 candidates (+ a 1-token window).
    votes = torch.tensor([[0.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]])
    probs = votes[:, None, :]  # W = 1
    before = ScoreOptions(kernel_size=3, pooling="max", gqa_reduce="before_pool")
    after = ScoreOptions(kernel_size=3, pooling="max", gqa_reduce="after_pool")
    # mean first: [0, 1, 0, .5, 0, 0] -> max-pool -> [1, 1, 1, .5, .5, 0]
    got_before = WindowVoteScorer(before).score(_observation_with(probs, 1))[0, :6]
    assert got_before.tolist() == [1.0, 1.0, 1.0, 0.5, 0.5, 0.0]
    # pool first: [2, 2, 2, 0, 0, 0] and [0, 0, 1, 1, 1, 0] -> mean -> [1, 1, 1.5, .5, .5, 0]
    got_after = WindowVoteScorer(after).score(_observation_with(probs, 1))[0, :6]
    assert got_after.tolist() == [1.0, 1.0, 1.5, 0.5, 0.5, 0.0]


def test_cake_indicator_pools_each_query_head_then_averages_the_group() -> None:
    gen = torch.Generator().manual_seed(3)
    keys, queries = torch.randn(2, 90, 8, generator=gen), torch.randn(4, 90, 8, generator=gen)
    observation = WindowObservation(0, 1, queries[:, -32:], keys, keys, 8**-0.5)
    got = CakeScorer(200.0, ScoreOptions(kernel_size=5, pooling="avg", gqa_reduce="after_pool")).score(observation)
    torch.testing.assert_close(got[:, :58], ref_cake_scores(queries, keys, 32), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    ("avg", "length", "adakv", "expected"),
    [
        # long context: base 96, min 96 // 20 = 4, max 188, steps (188 - 4) // 3 = 61
        (128, 30000, False, [188 + 32, 127 + 32, 66 + 32, 5 + 32]),
        # clamp: max 188 >= S - W = 168 -> max 168, min 2 * 96 - 168 = 24, steps 48
        (128, 200, False, [200, 152, 104, 56]),
        # uniform branch: S = 150 < 2 * base = 192
        (128, 150, False, [128, 128, 128, 128]),
        # no compression: S = 100 < C = 128
        (128, 100, False, [100, 100, 100, 100]),
        # AdaKV: no uniform branch; clamp max = 118, min = 74, steps 14
        (128, 150, True, [150, 136, 122, 108]),
        # AdaKV: selecting more than S - W = 68 means no compression for that layer
        (128, 100, True, [100, 100, 100, 100]),
    ],
)
def test_pyramid_schedule_is_the_references_integer_arithmetic(avg, length, adakv, expected) -> None:
    variant = "adakv" if adakv else "kvcache_factory"
    assert pyramid_schedule(avg, 32, 20, 4, length, variant) == expected
    reference = ref_pyramid(avg, 32, 20, 4, length, adakv)
    assert [length if s is None else s + 32 for s in reference] == expected


def test_pyramid_total_is_not_forced_to_the_budget() -> None:
    budgets = pyramid_schedule(128, 32, 20, 32, 30000, "kvcache_factory")
    assert budgets[0] == 188 + 32 and budgets[-1] == 188 - 31 * 5 + 32  # steps = (188 - 4) // 31 = 5
    assert sum(budgets) == 4560 != 128 * 32
    assert sum(pyramid_schedule(128, 32, 20, 32, 30000, "sum_preserving")) == 128 * 32


@pytest.mark.parametrize(
    ("counts", "base", "alpha", "expected"),
    [
        ([3, 5], 4, 0.5, [4, 4]),  # 1.5 + 2 = 3.5 -> 4, 2.5 + 2 = 4.5 -> 4 (half to even)
        ([1, 7], 4, 0.5, [2, 6]),  # 2.5 -> 2, 5.5 -> 6
        ([3, 17], 10, 0.2, [4, 16]),  # 2.4 + 2 -> 4, 13.6 + 2 -> 16
        ([2, 2, 11], 5, 0.2, [3, 3, 10]),  # 2.6 -> 3, 9.8 -> 10: the layer keeps 16, not 15
    ],
)
def test_ada_rounding_is_per_head_half_to_even(counts, base, alpha, expected) -> None:
    # Scores whose global top-(H x base) picks exactly `counts` per head: head h's values are distinct and only its
    # first counts[h] exceed every other head's remaining ones.
    heads = len(counts)
    rows = []
    for head, count in enumerate(counts):
        rows.append([10.0 + head + i * 0.01 for i in range(count)] + [-(1.0 + head + i * 0.01) for i in range(30)])
    width = max(len(r) for r in rows)
    scores = torch.tensor([r + [-100.0] * (width - len(r)) for r in rows])
    assert ada_capacities(scores, base, alpha) == expected
    assert ref_ada_counts(scores, base, alpha) == expected
    assert heads == len(expected)


def test_ada_normalize_scales_each_head_by_its_top_share() -> None:
    # Head 0 concentrates its mass (top-2 share 0.75), head 1 spreads it (0.43): scaled by those shares, head 0
    # wins one more of the global top-4.
    scores = torch.tensor([[0.5, 0.25, 0.15, 0.1, 0.0, 0.0], [0.22, 0.21, 0.2, 0.19, 0.18, 0.0]])
    assert ada_capacities(scores, 2, 0.0) == ref_ada_counts(scores, 2, 0.0) == [2, 2]
    assert ada_capacities(scores, 2, 0.0, normalize=True) == ref_ada_counts(scores, 2, 0.0, normalize=True) == [3, 1]


@pytest.mark.parametrize(
    ("shares", "pool", "cap", "expected"),
    [
        ([10.7, 50.2, 39.9], 100, 45, [14, 45, 41]),  # excess 5 -> 2 each + 1 to the first; then +1 to the first
        ([44.9, 60.0, 0.5], 105, 45, [52, 45, 8]),  # the excess pushes layer 0 past the cap: the code allows it
        ([60.0, 60.0], 100, 45, [45, 45]),  # every layer capped: the excess and the difference are lost
        ([20.9, 20.9, 20.9, 20.9], 84, 100, [21, 21, 21, 21]),  # truncation remainder 4, one each
        ([33.3, 33.3, 33.4], 100, 100, [34, 33, 33]),  # remainder 1 to the first layer
    ],
)
def test_cake_adjust_budgets(shares, pool, cap, expected) -> None:
    assert adjust_budgets(shares, pool, cap) == expected
    assert ref_adjust_budgets(shares, pool, cap) == expected


def test_cake_shares_are_float32_and_truncated() -> None:
    prefs = [np.float32(0.1), np.float32(0.2), np.float32(0.3)]
    ref = [p / sum(prefs) * 600 for p in prefs]
    assert preference_shares([float(p) for p in prefs], 600) == [float(r) for r in ref]
    assert adjust_budgets(preference_shares([float(p) for p in prefs], 600), 600, 1000) == ref_adjust_budgets(
        ref, 600, 1000
    )


# ============================================================================================ random tensors
GRANULARITIES = [("kv_head", 1), ("query_head", 2)]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(("granularity", "expand"), GRANULARITIES)
@pytest.mark.parametrize("preset", ["snapkv", "h2o"])
@pytest.mark.parametrize("budget", [48, 100, 140])
def test_uniform_presets_select_a_reference_topk(seed, granularity, expand, preset, budget) -> None:
    keys, queries = _random_layer(seed, heads=2, groups=2, length=120)
    method = method_from_yaml(preset, gqa_granularity=granularity, decode_eviction=False)
    window = method.window
    stored = keys.repeat_interleave(expand, dim=0)
    cache, _ = _session(method, f"{budget}L", [(stored, queries)], expand=1)
    positions = [p.tolist() for p in cache.headwise_layers[0].positions]
    if budget > 120:  # S < C: nothing evicted
        assert all(p == list(range(120)) for p in positions)
        return
    kv_head = granularity == "kv_head"
    if preset == "snapkv":
        scores = ref_snapkv_scores(queries, keys, window, kv_head=kv_head)
    else:
        scores = ref_h2o_scores(queries, keys, window, kv_head=kv_head)
    assert len(positions) == scores.shape[0]
    for head, kept in enumerate(positions):
        assert_valid_topk(kept, scores[head], window, 120, budget - window)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("adakv", [False, True])
@pytest.mark.parametrize("length", [150, 260, 600])
def test_pyramidkv_layers_select_a_reference_topk(seed, adakv, length) -> None:
    layers = [_random_layer(seed * 10 + layer, heads=2, groups=2, length=length) for layer in range(4)]
    method = method_from_yaml("pyramidkv_adakv" if adakv else "pyramidkv", gqa_granularity="kv_head")
    window = method.window
    cache, session = _session(method, "128L", layers)
    selected = ref_pyramid(128, window, 20, 4, length, adakv)
    for layer, ((keys, queries), count) in enumerate(zip(layers, selected, strict=True)):
        positions = [p.tolist() for p in cache.headwise_layers[layer].positions]
        if count is None or count >= length - window:
            assert all(len(p) == length for p in positions)
            continue
        scores = ref_snapkv_scores(queries, keys, window)
        for head, kept in enumerate(positions):
            assert_valid_topk(kept, scores[head], window, length, count)
        assert session.record.requested_per_layer[layer] == count + window


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("preset", "alpha"), [("ada_snapkv", 0.2), ("ada_snapkv_early", 0.5)])
@pytest.mark.parametrize("budget", [48, 64, 150])
def test_ada_selects_the_reference_counts_and_tokens(seed, preset, alpha, budget) -> None:
    # One sharp and one flat KV head so the adaptive split is far from uniform.
    keys, queries = _random_layer(seed, heads=2, groups=2, length=140, sharp=1.0)
    queries[:2] *= 3.0
    method = method_from_yaml(preset)
    expand = 2 if method.gqa_granularity == "query_head" else 1
    cache, _ = _session(method, f"{budget}L", [(keys, queries)], expand=expand)
    positions = [p.tolist() for p in cache.headwise_layers[0].positions]
    window, base = 32, budget - 32
    if base > 140 - window:
        assert all(len(p) == 140 for p in positions)
        return
    scores = ref_snapkv_scores(queries, keys, window, rows="mean", kv_head=expand == 1)
    counts = ref_ada_counts(scores, base, alpha)
    assert [len(p) - window for p in positions] == counts
    for head, kept in enumerate(positions):
        assert_valid_topk(kept, scores[head], window, 140, counts[head])


def _ref_cake(layers, total_per_layer: int, window: int = 32):
    """CAKE's cascading prefill: per layer the kept candidate indices, and the final integer budgets."""
    length = layers[0][0].shape[1]
    if length <= total_per_layer + window:
        return None, None
    pool = (total_per_layer - window) * len(layers)
    prefs, kept, scores = [], [], []
    budgets: list[int] = []
    for keys, queries in layers:
        prefs.append(ref_cake_preference(queries, keys, window))
        scores.append(ref_cake_scores(queries, keys, window))
        kept.append([torch.arange(length - window) for _ in range(keys.shape[0])])
        shares = [p / sum(prefs) * pool for p in prefs]
        budgets = ref_adjust_budgets(shares, pool, length - window)
        for layer, budget in enumerate(budgets):
            budget = min(budget, length - window)
            for head in range(len(kept[layer])):
                current = kept[layer][head]
                k = min(budget, current.numel())
                order = torch.topk(scores[layer][head][current], k).indices
                kept[layer][head] = current[order]
    return kept, budgets


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("budget", [40, 64, 100, 160])
def test_cake_cascade_matches_the_reference_budgets_and_tokens(seed, budget) -> None:
    layers = [_random_layer(seed * 7 + layer, heads=2, groups=2, length=160, sharp=0.3 + 0.5 * layer)
              for layer in range(5)]  # fmt: skip
    method = method_from_yaml("cake", decode_eviction=False)
    cache, session = _session(method, f"{budget}L", layers)
    kept, budgets = _ref_cake(layers, budget)
    if kept is None:  # S <= C + W: the code evicts nothing
        assert all(len(p) == 160 for layer in cache.headwise_layers for p in layer.positions)
        return
    assert [b - 32 for b in session.record.requested_per_layer] == [min(b, 128) for b in budgets]
    for layer, ref_heads in enumerate(kept):
        for head, ref_kept in enumerate(ref_heads):
            got = set(cache.headwise_layers[layer].positions[head].tolist())
            assert got == set(ref_kept.tolist()) | set(range(128, 160))


# ============================================================================================ model-dtype rounding
def test_scores_follow_the_references_bf16_rounding() -> None:
    """``score_dtype=model``: each step rounds to the model dtype as the reference's bf16 tensors do."""
    gen = torch.Generator().manual_seed(11)
    keys = torch.randn(2, 96, 16, generator=gen).bfloat16()
    queries = torch.randn(4, 96, 16, generator=gen).bfloat16()
    probs = ref_window_probs(queries, keys, 32)  # bf16 logits (matmul, then / sqrt(d)), float32 softmax
    # The reference: softmax(float32).to(bf16), then bf16 sum / group mean / max pooling.
    votes = probs.bfloat16().sum(dim=-2)[:, :-32]
    expected = ref_pool(ref_group(votes, 2).float(), 7, "max").bfloat16().float()
    observation = WindowObservation(0, 1, queries[:, -32:], keys, keys, 16**-0.5)
    got = WindowVoteScorer(ScoreOptions(kernel_size=7, pooling="max")).score(observation)[:, :64]
    torch.testing.assert_close(got, expected, rtol=0, atol=0)  # bf16 logits too (issue #28): the same rounding
    exact = WindowVoteScorer(ScoreOptions(kernel_size=7, pooling="max", score_dtype="float32")).score(observation)
    assert not torch.equal(exact[:, :64], got)  # float32 scores keep the digits bf16 drops
    assert got.unique().numel() < exact[:, :64].unique().numel()  # bf16 rounding merges close scores into ties
