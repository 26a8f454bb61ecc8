"""Baseline methods on hand-built tensors (known answers) and on a tiny model (budgets kept exactly)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from kvbench.budget import parse_budget
from kvbench.cache.kv_cache import KVBenchCache
from kvbench.config import MethodConfig
from kvbench.inference.eviction import EvictionSession
from kvbench.inference.generate import generate
from kvbench.methods.base import WindowObservation, build_method, method_families
from kvbench.methods.snapkv import PyramidLayerAllocator, WindowVoteScorer
from kvbench.methods.token_scores import ScoreOptions, window_attention
from kvbench.models.loading import build_builtin

CONF = Path(__file__).resolve().parents[2] / "conf"


def method_from_yaml(name: str, **overrides):
    """Build a method exactly as its conf/method/<name>.yaml describes it."""
    raw = OmegaConf.load(CONF / "method" / f"{name}.yaml")
    raw.pop("defaults", None)
    node = OmegaConf.merge(OmegaConf.structured(MethodConfig), raw)
    for key, value in overrides.items():
        node[key] = value
    return build_method(node)


class _Layer(torch.nn.Module):
    def __init__(self, idx: int) -> None:
        super().__init__()
        self.layer_idx = idx


def _prefill_one_layer(method, budget: str, keys: torch.Tensor, query: torch.Tensor) -> KVBenchCache:
    """Store ``keys`` ([H, S, D]) in a one-layer cache and run the method's prefill compression with ``query``."""
    cache = KVBenchCache(1)
    cache.update(keys[None], keys[None].clone(), 0)
    session = EvictionSession(method, parse_budget(budget), cache)
    session.begin_prefill(keys.shape[1])
    session.after_attention(_Layer(0), query[None], keys.shape[-1] ** -0.5)
    session.begin_decode()
    return cache


def _dominant_case(seed: int = 0, context: int = 200, dominant: int = 57):
    gen = torch.Generator().manual_seed(seed)
    keys = torch.randn(2, context, 16, generator=gen) * 0.1
    query = torch.randn(4, context, 16, generator=gen) * 0.1
    direction = torch.randn(16, generator=gen)
    keys[:, dominant] = direction * 4  # every window query points at this key
    query[:, -32:] += direction
    return keys, query


@pytest.mark.parametrize("name", ["snapkv", "pyramidkv", "h2o", "tova"])
def test_key_dominating_the_window_attention_is_kept(name: str) -> None:
    keys, query = _dominant_case()
    cache = _prefill_one_layer(method_from_yaml(name), "40/layer", keys, query)
    for head in range(2):
        kept = cache.headwise_layers[0].positions[head].tolist()
        assert 57 in kept
        assert len(kept) == 40


def test_streamingllm_keeps_exactly_sinks_and_most_recent() -> None:
    keys, query = _dominant_case()
    cache = _prefill_one_layer(method_from_yaml("streamingllm"), "40/layer", keys, query)
    for head in range(2):
        assert cache.headwise_layers[0].positions[head].tolist() == [0, 1, 2, 3, *range(200 - 36, 200)]


def test_snapkv_scores_use_window_queries_only() -> None:
    keys, query = _dominant_case()
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


@pytest.fixture(scope="module")
def tiny_llama():
    model, tokenizer = build_builtin("tiny-random-llama", seed=7)
    model.set_attn_implementation("kvbench")
    return model.eval(), tokenizer


def _run(model, tokenizer, method, budget: str, mode: str = "aware", context: int = 300, new: int = 12):
    ids = torch.randint(3, 250, (context + 20,), generator=torch.Generator().manual_seed(3)).tolist()
    return generate(
        model,
        tokenizer,
        ids[:context],
        ids[context:],
        method=method,
        budget=parse_budget(budget),
        question_mode=mode,
        max_new_tokens=new,
        stop_token_ids=set(),
    )


@pytest.mark.parametrize("name", ["streamingllm", "h2o", "tova"])
@pytest.mark.parametrize("mode", ["aware", "agnostic"])
def test_decode_time_policies_keep_the_cache_at_its_budget(tiny_llama, name: str, mode: str) -> None:
    model, tokenizer = tiny_llama
    out = _run(model, tokenizer, method_from_yaml(name), "64L", mode=mode, new=16)
    assert out.record.final_per_layer == [64] * 4
    assert len(out.token_ids) == 16


@pytest.mark.parametrize("name", ["snapkv", "pyramidkv", "h2o", "tova", "streamingllm"])
@pytest.mark.parametrize("granularity", ["kv_head", "query_head"])
def test_achieved_equals_allocation_per_layer_and_head(tiny_llama, name: str, granularity: str) -> None:
    model, tokenizer = tiny_llama
    method = method_from_yaml(name, gqa_granularity=granularity, decode_eviction=False)
    record = _run(model, tokenizer, method, "64L", new=1).record
    heads = 2 if granularity == "kv_head" else 4
    assert record.requested_per_head == record.achieved_per_head
    assert all(len(h) == heads for h in record.achieved_per_head)
    assert record.requested_per_layer == record.achieved_per_layer
    # 4 layers, 300 tokens, 64L: PyramidKV's integer schedule (window 8) spends exactly 4 x 64 here.
    assert sum(record.requested_per_layer) == 64 * 4
    if name == "pyramidkv":
        assert record.requested_per_layer[0] > record.requested_per_layer[-1]
    else:
        assert record.requested_per_layer == [64] * 4
    # Real memory: bytes = kept tokens x (keys + values) x head_dim x itemsize (float32).
    kept_tokens = sum(sum(h) for h in record.achieved_per_head)
    assert record.cache_bytes == kept_tokens * 2 * 16 * 4
    assert record.evicted


def test_budget_at_or_above_context_evicts_nothing_and_says_so(tiny_llama) -> None:
    model, tokenizer = tiny_llama
    record = _run(model, tokenizer, method_from_yaml("snapkv"), "512L", context=300, new=1).record
    assert not record.evicted
    assert record.achieved_per_layer == record.requested_per_layer == [320] * 4


def test_window_outside_budget_adds_the_window(tiny_llama) -> None:
    model, tokenizer = tiny_llama
    method = method_from_yaml("snapkv", window_in_budget=False)
    record = _run(model, tokenizer, method, "64L", new=1).record
    assert record.achieved_per_layer == [64 + 32] * 4


def test_every_method_family_has_a_preset() -> None:
    presets = {OmegaConf.load(p).family for p in (CONF / "method").glob("*.yaml")}
    assert set(method_families()) <= presets
