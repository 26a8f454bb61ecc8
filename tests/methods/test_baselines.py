"""Every baseline family (kvbench/eviction/base.py's composition) on hand-built tensors (known answers) and on a
tiny model (budgets kept exactly); a family's own semantics are in its own file (test_streamingllm.py, ...)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from kvbench.eviction.base import method_families
from tests.methods.helpers import CONF, dominant_case, method_from_yaml, prefill_one_layer, run_method


@pytest.mark.parametrize("name", ["snapkv", "pyramidkv", "h2o", "tova"])
def test_key_dominating_the_window_attention_is_kept(name: str) -> None:
    keys, query = dominant_case()
    cache = prefill_one_layer(method_from_yaml(name), "40/layer", keys, query)
    for head in range(2):
        kept = cache.headwise_layers[0].positions[head].tolist()
        assert 57 in kept
        assert len(kept) == 40


@pytest.mark.parametrize("name", ["streamingllm", "h2o", "tova"])
@pytest.mark.parametrize("mode", ["aware", "agnostic"])
def test_decode_time_policies_keep_the_cache_at_its_budget(tiny_llama, name: str, mode: str) -> None:
    model, tokenizer = tiny_llama
    out = run_method(model, tokenizer, method_from_yaml(name), "64L", mode=mode, new=16)
    assert out.record.final_per_layer == [64] * 4
    assert len(out.token_ids) == 16


@pytest.mark.parametrize("name", ["snapkv", "pyramidkv", "h2o", "tova", "streamingllm"])
@pytest.mark.parametrize("granularity", ["kv_head", "query_head"])
def test_achieved_equals_allocation_per_layer_and_head(tiny_llama, name: str, granularity: str) -> None:
    model, tokenizer = tiny_llama
    method = method_from_yaml(name, gqa_granularity=granularity, decode_eviction=False)
    record = run_method(model, tokenizer, method, "64L", new=1).record
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
    assert record.stored_bytes == kept_tokens * 2 * 16 * 4
    assert record.evicted


def test_every_method_family_has_a_preset() -> None:
    """A YAML preset, or for a one-class method its default preset (``method=<family>`` with no YAML)."""
    import kvbench

    presets = {OmegaConf.load(p).family for p in (CONF / "method").glob("*.yaml")}
    for family in sorted(set(method_families()) - presets):
        assert kvbench.compose_config(method=family).method.family == family
