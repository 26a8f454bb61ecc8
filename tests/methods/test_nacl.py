"""NACL (kvbench/methods/nacl.py): hand-computed rules, parity with the official code's semantics, seeding, budgets.

The reference below (:func:`ref_kvcache_eviction`) is written from PaddlePaddle/Research
``NLP/ACL2024-NACL/src/llama_nacl_patch.py`` (``kvcache_eviction``) in NumPy, independently of kvbench's code: the
non-causal softmax of the last ``proxy_tokens`` queries summed over its rows, a loop over the stored heads taking
``proxy_score[:, head_idx]``, ``topk`` of the tokens between the sinks and the recent ones, then
``np.random.choice(..., replace=False, p=softmax(rest))``.  Its random draws come from NumPy, kvbench's from torch:
the random part is compared by its rules and, separately, by distribution.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from kvbench.app.validation import validate_run
from kvbench.budget import parse_budget
from kvbench.cache.kv_cache import KVBenchCache
from kvbench.config import register_configs
from kvbench.inference.eviction import EvictionSession
from kvbench.methods.nacl import (
    BudgetSplit,
    proxy_row_count,
    proxy_scores,
    sample_without_replacement,
    select_tokens,
    split_budget,
)
from kvbench.run.runner import Runner
from tests.methods.helpers import LayerIndex, method_from_yaml

CONF = Path(__file__).resolve().parents[2] / "conf"


# ============================================================================================ reference semantics
def ref_kvcache_eviction(query, key, proxy_tokens, sinks, recent, proxy_keep, random_keep, rng):
    """The official ``kvcache_eviction`` on ``query`` ``[S, H_q, D]`` and ``key`` ``[S, H, D]`` (NumPy float32).

    Returns per stored head ``(proxy_score_of_that_head, sink_idx, proxy_idx, random_idx, recent_idx, removed)``
    with ``removed`` the candidates left for the random draw.
    """
    length, num_q, dim = query.shape
    groups = num_q // key.shape[1]
    proxy_q = query[-proxy_tokens:].astype(np.float32)  # [P, H_q, D]
    full_k = np.repeat(key, groups, axis=1).astype(np.float32)  # flash-attn GQA: query head i reads KV head i // g
    logits = np.einsum("phd,shd->hps", proxy_q, full_k) / np.float32(math.sqrt(dim))  # causal=False
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    proxy_score = (probs / probs.sum(-1, keepdims=True)).sum(1)  # calc_reduced_attention_scores: [H_q, S]
    heads = []
    for head_idx in range(key.shape[1]):  # the code loops over key_states.shape[2]
        cur = proxy_score[head_idx][sinks : length - recent]
        topk_idx = np.argsort(-cur, kind="stable")[:proxy_keep]
        removed = np.delete(np.arange(cur.shape[0]), topk_idx)
        reserved = np.delete(cur, topk_idx).astype(np.float64)
        reserved = np.exp(reserved - reserved.max())
        picked = rng.choice(removed, size=random_keep, replace=False, p=reserved / reserved.sum())
        heads.append(
            (proxy_score[head_idx], np.arange(sinks), topk_idx + sinks, picked + sinks,
             np.arange(length - recent, length), removed + sinks)
        )  # fmt: skip
    return heads


def _layer(seed: int, kv_heads: int, groups: int, length: int, dim: int = 16):
    gen = torch.Generator().manual_seed(seed)
    keys = torch.randn(kv_heads, length, dim, generator=gen)
    queries = torch.randn(kv_heads * groups, length, dim, generator=gen)
    return keys, queries


def _run_session(method, budget: str, layers, expand: int = 1, prompt_ids=None):
    """kvbench's prefill eviction over ``layers`` of (keys ``[H, S, D]``, queries ``[H_q, S, D]``)."""
    cache = KVBenchCache(len(layers), expand_factor=expand)
    session = EvictionSession(method, parse_budget(budget), cache)
    length = layers[0][0].shape[1]
    session.begin_prefill(length, prompt_ids=prompt_ids)
    for idx, (keys, queries) in enumerate(layers):
        cache.update(keys[None], keys[None].clone(), idx)
        session.after_attention(LayerIndex(idx), queries[None], keys.shape[-1] ** -0.5)
    session.begin_decode()
    return cache, session


def _kept(cache, layer: int = 0) -> list[list[int]]:
    return [p.tolist() for p in cache.headwise_layers[layer].positions]


def _nacl(**params):
    return method_from_yaml("nacl", params={"min_eviction_seqlen": 0, **params})


# ============================================================================================ hand-computed rules
def test_proxy_scores_sum_the_proxy_rows_softmax_over_all_keys():
    keys = torch.tensor([[[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]])  # [1, 3, 2]
    rows = torch.tensor([[[math.log(2), 0.0], [0.0, math.log(3)]]])  # logits [0, ln2, 0] and [0, 0, ln3]
    full = proxy_scores(rows, keys, scaling=1.0)
    # (1, 2, 1)/4 + (1, 1, 3)/5: every row sees every key (the code's causal=False).
    assert torch.allclose(full, torch.tensor([[0.45, 0.7, 0.85]]))
    # Causal: the first proxy row sits at position 1 and sees keys 0..1: (1, 2)/3.
    causal = proxy_scores(rows, keys, scaling=1.0, causal=True)
    assert torch.allclose(causal, torch.tensor([[1 / 3 + 0.2, 2 / 3 + 0.2, 0.6]]))
    # Row blocks (forced to one row per block) give the same sums.
    assert torch.allclose(proxy_scores(rows, keys, 1.0, max_block_bytes=1), full)


def test_proxy_row_count_is_the_codes_int_of_the_ratio():
    assert [proxy_row_count(s, 0.01) for s in (8000, 2049, 131072, 50)] == [80, 20, 1310, 1]
    assert all(proxy_row_count(s, 0.01) == max(1, int(0.01 * s)) for s in range(1, 5000, 7))


@pytest.mark.parametrize(
    "budget, ratios, sinks, expected",
    [
        # AhaKV's budget: protect 50 (all sinks: the code's 256 do not fit), proxy 600, random 350.
        (1000, (0.01, 0.12, 0.07), 256, BudgetSplit(50, 0, 600, 350)),
        # 20 % of a 30 000-token prompt: exactly the code's int(0.01 S) - 256, int(0.12 S), int(0.07 S).
        (6000, (0.01, 0.12, 0.07), 256, BudgetSplit(256, 44, 3600, 2100)),
        (64, (0.01, 0.12, 0.07), 256, BudgetSplit(3, 0, 38, 23)),  # floor(3.2), floor(38.4), the rest
        (200, (0.02, 0.06, 0.12), 4, BudgetSplit(4, 16, 60, 120)),  # the paper's Table 4 split at 20 %
        (720, (0.01, 0.12, 0.07), 0, BudgetSplit(0, 36, 432, 252)),
    ],
)
def test_budget_split(budget, ratios, sinks, expected):
    split = split_budget(budget, *ratios, sink_tokens=sinks)
    assert split == expected
    assert split.total == budget


def test_selection_keeps_sinks_recent_proxy_top_and_draws_from_the_rest():
    # 12 tokens, 1 sink, 2 recent, 3 by proxy score, 2 drawn.  Candidates are positions 1..9.
    scores = torch.tensor([[0.0, 5, 9, 1, 8, 1000, 1000, 7, 2, 3, 0, 0]])
    split = BudgetSplit(sinks=1, recent=2, proxy=3, random=2)
    chosen = select_tokens(scores, split, "softmax", torch.Generator().manual_seed(0))
    assert chosen.protected.tolist() == [0, 10, 11]
    assert sorted(chosen.proxy[0].tolist()) == [2, 5, 6]  # 1000, 1000, 9
    # The rest (5, 1, 8, 7, 2, 3 at 1, 3, 4, 7, 8, 9) are drawn by softmax: 8 and 7 carry 0.66 and 0.24 of the mass.
    draws = [
        sorted(select_tokens(scores, split, "softmax", torch.Generator().manual_seed(s)).random[0].tolist())
        for s in range(200)
    ]
    assert all(set(d) <= {1, 3, 4, 7, 8, 9} and len(d) == 2 for d in draws)
    assert sum(d == [4, 7] for d in draws) > 100  # P({4, 7}) = 0.58 under successive sampling
    assert chosen.kept(0).tolist() == sorted([0, 10, 11, 2, 5, 6, *chosen.random[0].tolist()])
    # Ties among the proxy scores go to the more recent token, as kvbench's ranking elsewhere.
    tied = select_tokens(torch.zeros(1, 12), split, "softmax", torch.Generator().manual_seed(0))
    assert sorted(tied.proxy[0].tolist()) == [7, 8, 9]


def _successive_sampling_pairs(weights: np.ndarray) -> dict[tuple[int, int], float]:
    """Exact probability of each unordered pair drawn by two successive draws without replacement."""
    p = weights / weights.sum()
    return {
        (a, b): p[a] * p[b] / (1 - p[a]) + p[b] * p[a] / (1 - p[b]) for a, b in itertools.combinations(range(len(p)), 2)
    }


def test_random_draws_follow_the_codes_sampling_distribution():
    """Gumbel-top-k (kvbench) and ``np.random.choice(replace=False, p=softmax)`` (the code): same pair law."""
    logits = np.array([0.0, 1.0, 2.0, -1.0])
    exact = _successive_sampling_pairs(np.exp(logits))
    draws = 6000
    ours = sample_without_replacement(
        torch.tensor(logits).expand(draws, 4), 2, torch.Generator().manual_seed(1)
    ).tolist()  # fmt: skip
    rng = np.random.RandomState(1)
    p = np.exp(logits) / np.exp(logits).sum()
    theirs = [rng.choice(4, size=2, replace=False, p=p).tolist() for _ in range(draws)]
    for sample in (ours, theirs):
        counts = {pair: 0 for pair in exact}
        for a, b in sample:
            counts[tuple(sorted((a, b)))] += 1
        for pair, prob in exact.items():
            assert abs(counts[pair] / draws - prob) < 4 * math.sqrt(prob * (1 - prob) / draws) + 1e-3, (pair, prob)


# ============================================================================================ reference parity
@pytest.mark.parametrize(
    "seed, kv_heads, groups, granularity, budget, length",
    [
        (0, 2, 1, "query_head", "100L", 400),
        (1, 2, 2, "query_head", "0.2x", 500),  # the code's own ratio budget: its int(ratio S) split
        (2, 2, 2, "kv_head", "120L", 600),  # FlashAttention path: KV head h takes query head h's scores
        (3, 1, 4, "kv_head", "64L", 300),
    ],
)
def test_selection_matches_the_reference_code(seed, kv_heads, groups, granularity, budget, length):
    keys, queries = _layer(seed, kv_heads, groups, length)
    method = dataclasses.replace(_nacl(sink_tokens=4, kv_head_scores="head_index"), gqa_granularity=granularity)
    expand = groups if granularity == "query_head" else 1
    cache, session = _run_session(method, budget, [(keys, queries)], expand=expand, prompt_ids=list(range(length)))
    kept = _kept(cache)
    tiers = session.kept_scores(0)  # per head, the scorer's tiers of the kept tokens: 3 protected, 2 proxy, 1 drawn

    parsed = parse_budget(budget)
    split = split_budget(parsed.mean_per_layer(length), 0.01, 0.12, 0.07, sink_tokens=4)
    if budget == "0.2x":  # the code's counts: int(ratio x S) each, the sinks inside the protected ones
        assert (split.sinks + split.recent, split.proxy, split.random) == (int(0.01 * length), int(0.12 * length),
                                                                           int(0.07 * length))  # fmt: skip
    ref_query = queries.permute(1, 0, 2).numpy()
    ref_key = keys.repeat_interleave(expand, dim=0).permute(1, 0, 2).numpy()
    reference = ref_kvcache_eviction(ref_query, ref_key, proxy_row_count(length, 0.01), split.sinks, split.recent,
                                     split.proxy, split.random, np.random.RandomState(seed))  # fmt: skip
    assert len(kept) == len(reference)
    for head, (scores, sinks, proxy, drawn, recent, removed) in enumerate(reference):
        positions = torch.tensor(kept[head])
        part = {tier: set(positions[tiers[head] == tier].tolist()) for tier in (3.0, 2.0, 1.0)}
        assert len(positions) == split.total
        assert part[3.0] == set(sinks.tolist()) | set(recent.tolist())
        # The proxy-kept tokens: the reference's top-C_p (a differing token may only be a float32 near-tie).
        for token in part[2.0] ^ set(proxy.tolist()):
            assert abs(scores[token] - np.sort(scores[split.sinks : length - split.recent])[-split.proxy]) < 1e-5
        # The drawn ones: C_r of the candidates the proxy part left (the reference's own draw is one such set).
        assert len(part[1.0]) == len(drawn) == split.random
        assert part[1.0] <= set(removed.tolist()) and set(drawn.tolist()) <= set(removed.tolist())


def test_group_variant_reduces_the_query_heads_of_a_kv_head():
    keys, queries = _layer(5, 1, 2, 200)
    method = method_from_yaml(
        "nacl", gqa_granularity="kv_head", gqa_agg="mean",
        params={"min_eviction_seqlen": 0, "sink_tokens": 0, "kv_head_scores": "group", "proxy_token_keep_ratio": 1.0,
                "random_token_keep_ratio": 0.0, "token_protect_ratio": 0.0},
    )  # fmt: skip
    cache, _ = _run_session(method, "30L", [(keys, queries)])
    sums = proxy_scores(queries[:, -2:], keys, 16**-0.5).mean(dim=0)  # 2 proxy rows (1 % of 200)
    assert sorted(_kept(cache)[0]) == sorted(torch.topk(sums, 30).indices.tolist())


# ============================================================================================ budgets and seeding
@pytest.mark.parametrize(
    "length, budget, sinks", [(300, "40L", 256), (300, "64L", 2), (1000, "256L", 8), (90, "89L", 0)]
)
def test_every_head_keeps_exactly_its_budget(length, budget, sinks):
    layers = [_layer(seed, 2, 2, length) for seed in range(3)]
    cache, session = _run_session(_nacl(sink_tokens=sinks), budget, layers, expand=2, prompt_ids=list(range(length)))
    value = int(parse_budget(budget).value)
    split = split_budget(value, 0.01, 0.12, 0.07, sinks)
    for layer in range(3):
        for positions in _kept(cache, layer):
            assert len(positions) == len(set(positions)) == value
            assert set(range(split.sinks)) | set(range(length - split.recent, length)) <= set(positions)
    assert session.record.requested_per_layer == session.record.achieved_per_layer == [value] * 3
    assert session.record.evicted


def test_prompts_up_to_the_trigger_are_not_compressed():
    keys, queries = _layer(0, 2, 1, 300)
    method = method_from_yaml("nacl", params={"min_eviction_seqlen": 300})
    cache, session = _run_session(method, "40L", [(keys, queries)])
    assert [len(p) for p in _kept(cache)] == [300, 300]
    assert session.record.requested_per_layer == [300] and not session.record.evicted
    cache, _ = _run_session(method_from_yaml("nacl", params={"min_eviction_seqlen": 299}), "40L", [(keys, queries)])
    assert [len(p) for p in _kept(cache)] == [40, 40]


def test_random_eviction_is_seeded_per_sample_and_layer():
    layers = [_layer(seed, 2, 1, 400) for seed in range(2)]
    ids = list(range(400))

    def kept(seed: int, prompt_ids: list[int]) -> list[list[list[int]]]:
        cache, _ = _run_session(_nacl(sink_tokens=4, seed=seed), "100L", layers, prompt_ids=prompt_ids)
        return [_kept(cache, layer) for layer in range(2)]

    first = kept(0, ids)
    assert kept(0, ids) == first  # same seed, same prompt: identical selections
    other_seed, other_prompt = kept(1, ids), kept(0, ids[::-1])
    assert other_seed != first and other_prompt != first
    # Only the drawn part moves: the protected and proxy-kept tokens are the same.
    split = split_budget(100, 0.01, 0.12, 0.07, 4)
    for variant in (other_seed, other_prompt):
        for a_layer, b_layer in zip(first, variant, strict=True):
            for a, b in zip(a_layer, b_layer, strict=True):
                assert len(set(a) & set(b)) >= split.total - split.random
    # Heads and layers draw differently (the paper's head-wise and layer-wise diversity).
    assert first[0][0] != first[0][1] and first[0][0] != first[1][0]


def test_bad_settings_name_the_valid_choices():
    with pytest.raises(ValueError, match="decode_eviction"):
        method_from_yaml("nacl", decode_eviction=True)
    with pytest.raises(ValueError, match=r"unknown method.params key.*'window'"):  # NACL has no observation window
        method_from_yaml("nacl", window=8)
    with pytest.raises(ValueError, match="valid: softmax, uniform"):
        method_from_yaml("nacl", params={"random_distribution": "gumbel"})
    with pytest.raises(ValueError, match="valid keys"):
        method_from_yaml("nacl", params={"proxy_ratio": 0.1})


# ============================================================================================ end to end
def test_runner_end_to_end_is_reproducible(tmp_path: Path):
    """``python run.py method=nacl`` on the tiny model, twice: the cache is cut to the budget, predictions agree."""
    register_configs()
    rows = []
    for attempt in ("a", "b"):
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose("config", overrides=[
                "method=nacl", "method.params.min_eviction_seqlen=0", "budget=64L", "task.lengths=[1024]",
                "task.num_samples=1", "task.datasets=[niah_single_1k]", f"run.output_root={tmp_path / attempt}",
                "run.progress=false", "run.print_table=false",
            ])  # fmt: skip
        Runner(validate_run(cfg)).run()
        folder = tmp_path / attempt / "tiny" / "tiny_niah" / "nacl" / "64L" / "niah_single_1k"
        metrics = json.loads((folder / "metrics.json").read_text())
        assert metrics["cache"]["budget_exact"] and metrics["cache"]["samples_evicted"] == 1
        settings = metrics["settings"]
        assert settings["resolved"]["random_distribution"] == "softmax" and "pooling" not in settings
        rows.append([json.loads(line) for line in (folder / "predictions.jsonl").read_text().splitlines()])
    assert [r["prediction"] for r in rows[0]] == [r["prediction"] for r in rows[1]]
    assert [r["cache"] for r in rows[0]] == [r["cache"] for r in rows[1]]
