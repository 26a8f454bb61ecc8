"""TOVA (kvbench/methods/tova.py) as ``src/tova_cache.py`` (kvbench issue #23): nothing protected, the same tokens for
every head, a reduction after every forward including a multi-token append."""

from __future__ import annotations

import torch

from kvbench.budget import parse_budget
from kvbench.cache.kv_cache import KVBenchCache
from kvbench.inference.eviction import EvictionSession
from tests.methods.helpers import LayerIndex, method_from_yaml
from tests.parity.test_reference_parity import ref_window_probs


def _tova_session(keys, queries, budget, **overrides):
    method = method_from_yaml("tova", **overrides)
    cache = KVBenchCache(1)
    cache.update(keys[None], keys[None].clone(), 0)
    session = EvictionSession(method, parse_budget(budget), cache)
    session.begin_prefill(keys.shape[1])
    session.after_attention(LayerIndex(0), queries[None], keys.shape[-1] ** -0.5)
    return method, cache, session


def test_tova_prefill_keeps_the_plain_top_k_of_the_head_averaged_last_query() -> None:
    gen = torch.Generator().manual_seed(4)
    keys, queries = torch.randn(2, 60, 16, generator=gen), torch.randn(4, 60, 16, generator=gen)
    queries[:, -1] = -keys[:, -1].repeat_interleave(2, dim=0) * 3  # the last token barely attends to itself
    _, cache, _ = _tova_session(keys, queries, "20L")
    mean = ref_window_probs(queries, keys, 1)[:, -1].mean(dim=0)  # reference: mean over all query heads
    expected = sorted(torch.topk(mean, 20).indices.tolist())
    assert 59 not in expected  # the reference does not protect the last prompt token
    for positions in cache.headwise_layers[0].positions:
        assert positions.tolist() == expected
    _, protected, _ = _tova_session(keys, queries, "20L", params={"protect_recent": True})
    assert 59 in protected.headwise_layers[0].positions[0].tolist()


def test_tova_decoding_may_evict_the_newest_token_and_reduces_after_an_append() -> None:
    gen = torch.Generator().manual_seed(5)
    keys, queries = torch.randn(2, 60, 16, generator=gen), torch.randn(4, 60, 16, generator=gen)
    _, cache, session = _tova_session(keys, queries, "20L")
    layer = cache.headwise_layers[0]
    # Question-agnostic append of 5 tokens: the reference reduces right after this forward.
    session.begin_append()
    new_keys = torch.randn(2, 5, 16, generator=gen)
    cache.update(new_keys[None], new_keys[None].clone(), 0)
    session.after_attention(LayerIndex(0), torch.randn(1, 4, 5, 16, generator=gen), 0.25)
    assert layer.head_lengths() == [20, 20]
    # A decoding step whose query ignores the token it just added: that token is evicted (nothing protected).
    session.begin_decode()
    newest = torch.randn(2, 1, 16, generator=gen)
    cache.update(newest[None], newest[None].clone(), 0)
    query = -newest.repeat_interleave(2, dim=0) * 5  # [H_q, 1, D], pointing away from the new key
    session.after_attention(LayerIndex(0), query[None], 0.25)
    assert layer.head_lengths() == [20, 20]
    assert 65 not in layer.positions[0].tolist()
    assert layer.positions[0].tolist() == layer.positions[1].tolist()  # head-averaged: every head the same
