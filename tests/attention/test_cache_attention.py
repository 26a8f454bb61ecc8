"""The cache + attention contract with transformers: correct attention over caches whose layers and heads hold
different numbers of tokens (prefill, question after compression, decode); exactness with no eviction (the full
cache equals transformers' generate) is in tests/methods/test_full.py."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AttentionInterface, DynamicCache

import kvbench.attention.function  # noqa: F401  (registers "kvbench")
from kvbench.attention.function import bottom_right_causal_mask, kvbench_attention_forward
from kvbench.cache.kv_cache import KVBenchCache, RaggedKV
from kvbench.models.loading import build_builtin

#: Cache storage backends every exactness test runs on (kvbench/cache/kv_cache.py torch storage, kvbench/cache/paged.py
#: pages).
BACKENDS = ["torch", "paged"]


def _masked_reference(query, keys, values, kept, scaling):
    """Dense eager attention over the *full* keys with an explicit mask: causal (bottom-right) and kept-only.

    query [1, Hq, q, D]; keys/values [1, Hkv, S, D]; kept [Hkv, S] bool.
    """
    num_q, num_kv = query.shape[1], keys.shape[1]
    groups = num_q // num_kv
    q_len, s_len = query.shape[2], keys.shape[2]
    causal = bottom_right_causal_mask(q_len, s_len, query.device)  # [q, S]
    mask = causal[None] & kept[:, None, :]  # [Hkv, q, S]
    mask = mask.repeat_interleave(groups, dim=0)[None]  # [1, Hq, q, S]
    k = keys.repeat_interleave(groups, dim=1)
    v = values.repeat_interleave(groups, dim=1)
    logits = (query @ k.transpose(-1, -2)) * scaling
    logits = logits.masked_fill(~mask, float("-inf"))
    return (torch.softmax(logits, dim=-1) @ v).transpose(1, 2)


class _Module(torch.nn.Module):
    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True
        self.layer_idx = 0


@pytest.mark.parametrize("q_len", [1, 5, 12])
def test_ragged_attention_equals_dense_masked_reference(q_len: int) -> None:
    """Per-head caches of different lengths: our attention == dense attention over everything with a mask that
    hides the evicted tokens, for decode (q=1), a question chunk (q=5) and prefill-like chunks (q=12)."""
    gen = torch.Generator().manual_seed(0)
    num_kv, groups, dim, seen = 2, 3, 8, 40
    keys = torch.randn(1, num_kv, seen + q_len, dim, generator=gen)
    values = torch.randn(1, num_kv, seen + q_len, dim, generator=gen)
    query = torch.randn(1, num_kv * groups, q_len, dim, generator=gen)
    kept = torch.zeros(num_kv, seen + q_len, dtype=torch.bool)
    kept[0, torch.randperm(seen, generator=gen)[:9]] = True
    kept[1, torch.randperm(seen, generator=gen)[:23]] = True
    kept[:, seen:] = True  # the new tokens are always stored
    ragged_k = RaggedKV([keys[:, h : h + 1, kept[h]] for h in range(num_kv)])
    ragged_v = RaggedKV([values[:, h : h + 1, kept[h]] for h in range(num_kv)])
    out, _ = kvbench_attention_forward(_Module(groups), query, ragged_k, ragged_v, None, scaling=dim**-0.5)
    expected = _masked_reference(query, keys, values, kept, dim**-0.5)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    # Same check on a dense (equal-length) layer that had evictions: both heads keep the same positions.
    kept_same = kept[1].expand(num_kv, -1)
    dense_k, dense_v = keys[:, :, kept[1]], values[:, :, kept[1]]
    out_dense, _ = kvbench_attention_forward(_Module(groups), query, dense_k, dense_v, None, scaling=dim**-0.5)
    torch.testing.assert_close(out_dense, _masked_reference(query, keys, values, kept_same, dim**-0.5))


_REFERENCE_KEPT: dict[int, torch.Tensor] = {}


def _reference_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Full-cache attention that hides the positions listed as evicted in _REFERENCE_KEPT (per layer)."""
    kept = _REFERENCE_KEPT.get(module.layer_idx)
    s_len = key.shape[2]
    if kept is None:
        kept_now = torch.ones(key.shape[1], s_len, dtype=torch.bool)
    else:
        kept_now = torch.ones(key.shape[1], s_len, dtype=torch.bool)
        kept_now[:, : kept.shape[1]] = kept
    return _masked_reference(query, key, value, kept_now, scaling), None


AttentionInterface.register("kvbench_test_masked_reference", _reference_attention)


@pytest.mark.parametrize("backend", BACKENDS)
def test_model_logits_with_unequal_layer_and_head_lengths_match_masked_reference(backend: str) -> None:
    """A whole model: evict different tokens per layer and per head after the context, then feed a 6-token
    question and decode 4 tokens.  Logits equal a full-cache run whose attention masks the same tokens --
    which also checks that explicit positions stay right after eviction."""
    model, _ = build_builtin("tiny-random-llama", seed=5)
    model.eval()
    reference = copy.deepcopy(model)
    model.set_attn_implementation("kvbench")
    reference.set_attn_implementation("kvbench_test_masked_reference")
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 250, (1, 60), generator=gen)
    context, question, decoded = ids[:, :50], ids[:, 50:56], ids[:, 56:]
    config = model.config
    cache = KVBenchCache(config.num_hidden_layers, backend=backend)
    ref_cache = DynamicCache()
    with torch.no_grad():
        model(context, past_key_values=cache, position_ids=torch.arange(50)[None])
        _REFERENCE_KEPT.clear()
        reference(context, past_key_values=ref_cache, position_ids=torch.arange(50)[None])
        for layer_idx, layer in enumerate(cache.headwise_layers):
            kept = torch.zeros(config.num_key_value_heads, 50, dtype=torch.bool)
            per_head = []
            for head in range(config.num_key_value_heads):
                count = 5 + 7 * layer_idx + 11 * head  # unequal per layer and per head
                idx = torch.sort(torch.randperm(50, generator=gen)[:count]).values
                kept[head, idx] = True
                per_head.append(idx)
            layer.keep(per_head)
            _REFERENCE_KEPT[layer_idx] = kept
        lengths = cache.head_lengths()
        assert len({tuple(x) for x in lengths}) == config.num_hidden_layers  # layers differ
        assert all(len(set(x)) == config.num_key_value_heads for x in lengths)  # heads differ

        ours = model(question, past_key_values=cache, position_ids=torch.arange(50, 56)[None]).logits
        theirs = reference(question, past_key_values=ref_cache, position_ids=torch.arange(50, 56)[None]).logits
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
        for step in range(decoded.shape[1]):
            pos = torch.tensor([[56 + step]])
            ours = model(decoded[:, step : step + 1], past_key_values=cache, position_ids=pos).logits
            theirs = reference(decoded[:, step : step + 1], past_key_values=ref_cache, position_ids=pos).logits
            torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
    assert cache.get_seq_length() == 60  # logical length = tokens seen
    assert cache.head_lengths()[0][0] == 5 + 10  # kept + question + decoded


def test_cache_really_frees_evicted_tokens() -> None:
    """Bytes held equal kept tokens x bytes per token, per head, after ragged and dense evictions."""
    from kvbench.cache.kv_cache import HeadwiseLayer

    layer = HeadwiseLayer()
    keys = torch.randn(1, 3, 30, 16, dtype=torch.bfloat16)
    layer.update(keys, keys.clone())
    assert layer.stored_bytes() == layer.allocated_bytes() == 3 * 30 * 16 * 2 * 2
    layer.keep([torch.arange(5), torch.arange(10), torch.arange(29)])
    assert layer.is_ragged and layer.head_lengths() == [5, 10, 29]
    assert layer.stored_bytes() == (5 + 10 + 29) * 16 * 2 * 2
    assert layer.allocated_bytes() == 3 * 29 * 16 * 2 * 2  # one buffer as wide as the longest head
    assert layer.positions[1].tolist() == list(range(10))
    layer.keep([torch.tensor([0, 4]), torch.tensor([3, 9]), torch.tensor([1, 28])])
    assert not layer.is_ragged and layer.keys.shape == (1, 3, 2, 16)
    assert layer.stored_bytes() == layer.allocated_bytes() == 3 * 2 * 16 * 2 * 2  # the old buffers are freed
    assert layer.positions[2].tolist() == [1, 28]
    with pytest.raises(IndexError):
        layer.keep([torch.tensor([5]), torch.tensor([0]), torch.tensor([0])])


@pytest.mark.parametrize("backend", BACKENDS)
def test_query_head_granularity_stores_one_sequence_per_query_head(backend: str) -> None:
    layer_cache = KVBenchCache(1, expand_factor=2, backend=backend)
    k = torch.randn(1, 2, 7, 4)
    layer_cache.update(k, k, 0)
    layer = layer_cache.headwise_layers[0]
    assert layer.head_lengths() == [7, 7, 7, 7]
    keys, _ = layer.dense_kv()
    assert keys.shape == (4, 7, 4)
    torch.testing.assert_close(keys[1], k[0, 0])
    torch.testing.assert_close(keys[2], k[0, 1])
