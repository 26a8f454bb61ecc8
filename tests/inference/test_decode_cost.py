"""What one decoding step costs, counted from outside (issue #32, #26 item 4): every decode policy on both storage
backends evicts in place -- no host synchronisation, no rebuild of the buffers or the page pool, no copy of what is
kept, a number of operations that does not grow with the number of heads -- and keeps the same tokens as the
plain definition of its rule (H2O's: tests/methods/test_h2o.py).

The operations are counted with a :class:`~torch.utils._python_dispatch.TorchDispatchMode` (every aten op the step
runs, the fresh memory it allocates, and the ops that force a device-to-host synchronisation); rebuilds and copied
rows come from the layers' public :class:`~kvbench.cache.base.StorageStats`.
"""

from __future__ import annotations

import logging

import pytest
import torch
from omegaconf import OmegaConf
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from kvbench.cache.kv_cache import KVBenchCache
from kvbench.run import generation
from tests.methods.helpers import method_from_yaml, run_method, with_step_hook

#: aten ops that read a device value back to the host (or whose output size depends on data): a sync on CUDA.
SYNC_OPS = {"_local_scalar_dense", "nonzero", "unique_dim", "_unique2", "masked_select", "item"}
#: Every decode policy kvbench has (preset name -> what differs).
POLICIES = ["streamingllm", "h2o", "tova", "tova_per_head", "ahakv", "cake"]
HEAD_DIM = 64


class OpCounter(TorchDispatchMode):
    """Counts the aten ops run inside it, the host syncs among them, and the largest fresh allocation."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.syncs: list[str] = []
        self.largest_allocation = 0  # elements of the largest output that is not a view of an input

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        self.ops.append(name)
        if name in SYNC_OPS:
            self.syncs.append(name)
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        inputs = {t.untyped_storage().data_ptr() for t in tensors}
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().data_ptr() not in inputs:
                self.largest_allocation = max(self.largest_allocation, tensor.numel())
        return out


def _policy(name: str):
    if name == "tova_per_head":
        return method_from_yaml("tova", params={"head_average": False}).decode_policy
    return method_from_yaml(name).decode_policy


def _cache_at_cap(backend: str, kv_heads: int, context: int, ragged: bool, seed: int = 0):
    """A one-layer cache holding ``context`` tokens per KV head (ragged: head ``h`` keeps ``context - 8h``)."""
    gen = torch.Generator().manual_seed(seed)
    cache = KVBenchCache(1, backend=backend)
    keys = torch.randn(1, kv_heads, context, HEAD_DIM, generator=gen)
    cache.update(keys, torch.randn(keys.shape, generator=gen), 0)
    layer = cache.headwise_layers[0]
    if ragged:
        layer.keep([torch.arange(8 * head, context) for head in range(kv_heads)])
    return cache, layer, gen


def _decode(cache, layer, policy, state, gen, steps: int, groups: int = 2) -> None:
    """``steps`` decoding steps at layer 0: append one token, then the policy's step (the sample's ``state``)."""
    heads = layer.num_heads
    for _ in range(steps):
        new = torch.randn(1, heads, 1, HEAD_DIM, generator=gen)
        cache.update(new, torch.randn(new.shape, generator=gen), 0)
        query = torch.randn(heads * groups, 1, HEAD_DIM, generator=gen)
        policy.step(state, 0, layer, query, HEAD_DIM**-0.5)


def _counted_steps(name: str, backend: str, kv_heads: int, ragged: bool = False, context: int = 96):
    cache, layer, gen = _cache_at_cap(backend, kv_heads, context, ragged)
    policy = _policy(name)
    state = policy.new_state()
    policy.start_layer(state, 0, layer, layer.head_lengths(), None)
    _decode(cache, layer, policy, state, gen, steps=2)  # warm-up: the first append makes room once
    before = (layer.stats.reallocations, layer.stats.rows_copied, layer.head_lengths())
    with OpCounter() as counter:
        _decode(cache, layer, policy, state, gen, steps=3)
    return counter, layer, before


@pytest.mark.parametrize("backend", ["torch", "paged"])
@pytest.mark.parametrize("ragged", [False, True], ids=["dense", "ragged"])
@pytest.mark.parametrize("name", POLICIES)
def test_a_decode_step_evicts_in_place_without_host_syncs(name: str, ragged: bool, backend: str) -> None:
    """Three steps at the cap: each head evicts one token by moving one row (3 x H rows), nothing is rebuilt,
    nothing is read back to the host, and the lengths stay at the caps."""
    counter, layer, (reallocations, rows_copied, lengths) = _counted_steps(name, backend, kv_heads=3, ragged=ragged)
    assert layer.head_lengths() == lengths
    assert layer.stats.reallocations == reallocations, "a decode step rebuilt the storage"
    assert layer.stats.rows_copied - rows_copied == 3 * layer.num_heads
    assert counter.syncs == []
    if backend == "torch":
        # No step copies the stored keys or values: its largest allocation (the scores) is far below one layer's K.
        assert counter.largest_allocation < layer.stored_tokens() * HEAD_DIM // 8


@pytest.mark.parametrize("backend", ["torch", "paged"])
@pytest.mark.parametrize("name", POLICIES)
def test_the_work_of_a_step_does_not_grow_with_the_number_of_heads(name: str, backend: str) -> None:
    """Vectorised over heads: a step at 2 and at 6 KV heads runs exactly the same operations."""
    few, _, _ = _counted_steps(name, backend, kv_heads=2)
    many, _, _ = _counted_steps(name, backend, kv_heads=6)
    assert few.ops == many.ops


@pytest.mark.parametrize("backend", ["torch", "paged"])
def test_appends_grow_the_storage_geometrically_and_reserve_prevents_growth(backend: str) -> None:
    """The full cache: 100 appends on 96 stored tokens rebuild the storage a handful of times (each growth adds at
    least 1/8, amortised O(1) per token); after ``reserve(100)`` not once."""
    for reserve, most in ((0, 7), (100, 0)):
        cache, layer, gen = _cache_at_cap(backend, 2, 96, ragged=False)
        cache.reserve(reserve)
        before = layer.stats.reallocations
        for _ in range(100):
            new = torch.randn(1, 2, 1, HEAD_DIM, generator=gen)
            cache.update(new, new.clone(), 0)
        assert layer.stats.reallocations - before <= most
        assert layer.head_lengths() == [196, 196]


def _sorted_positions(layer) -> list[list[int]]:
    return [sorted(p.tolist()) for p in layer.positions]


@pytest.mark.parametrize("ragged", [False, True], ids=["dense", "ragged"])
def test_streamingllm_in_place_keeps_the_sinks_and_the_most_recent_tokens(ragged: bool) -> None:
    cache, layer, gen = _cache_at_cap("torch", 2, 60, ragged)
    policy = _policy("streamingllm")
    caps = layer.head_lengths()
    state = policy.new_state()
    policy.start_layer(state, 0, layer, caps, None)
    _decode(cache, layer, policy, state, gen, steps=20)
    first = [0, 8]
    for head, positions in enumerate(_sorted_positions(layer)):
        sinks = [p for p in range(4) if p >= first[head] or not ragged]
        assert positions == sinks + list(range(80 - (caps[head] - len(sinks)), 80))


# ------------------------------------------------------------------------------------------ the query-head storage trap
def test_query_head_storage_above_the_full_cache_is_recorded_and_warned_once(tiny_llama, caplog) -> None:
    """SnapKV's reference layout (a cache per query head, GQA 2:1 here) at budget 0.75x stores 1.5x the full cache:
    the record says so, and a run warns once; the kv-head switch stays below the full cache."""
    model, tokenizer = tiny_llama
    query_heads = run_method(model, tokenizer, method_from_yaml("snapkv"), "0.75x", context=200, new=4).record
    assert (query_heads.stored_heads, query_heads.kv_heads) == (4, 2)
    assert query_heads.exceeds_full_cache
    assert query_heads.stored_bytes == pytest.approx(1.5 * query_heads.full_cache_bytes, rel=0.02)
    kv_heads = run_method(
        model, tokenizer, method_from_yaml("snapkv", gqa_granularity="kv_head"), "0.75x", context=200, new=4
    ).record
    assert (kv_heads.stored_heads, kv_heads.kv_heads) == (2, 2)
    assert not kv_heads.exceeds_full_cache
    assert kv_heads.stored_bytes == pytest.approx(0.75 * kv_heads.full_cache_bytes, rel=0.02)
    cfg = OmegaConf.create({"model": {"name": "tiny"}, "method": {"name": "snapkv"}, "budget": {"name": "r075"}})
    with caplog.at_level(logging.WARNING, logger="kvbench"):
        for record in (query_heads, query_heads, kv_heads):
            generation.warn_if_above_full(record, cfg)
    warnings = [r.message for r in caplog.records if "exceeds the full cache" in r.message]
    assert len(warnings) == 1 and "gqa_granularity=kv_head" in warnings[0]


def test_paged_prefill_allocates_its_pages_in_a_fixed_number_of_operations() -> None:
    """A prefill of 40 or of 4000 tokens (3 or 250 pages per head) runs the same operations: the page table is
    written in one vectorised step, not page by page."""
    counts = []
    for tokens in (40, 4000):
        cache = KVBenchCache(1, backend="paged")
        keys = torch.zeros(1, 4, tokens, 8)
        with OpCounter() as counter:
            cache.update(keys, keys, 0)
        counts.append(counter.ops)
        layer = cache.headwise_layers[0]
        assert layer.head_lengths() == [tokens] * 4 and layer.stats.reallocations == 1
        pages = [page for head in layer.pages for page in head]
        assert sorted(pages) == list(range(len(pages)))  # every page handed out once
    assert counts[0] == counts[1]


@pytest.mark.parametrize("backend", ["torch", "paged"])
@pytest.mark.parametrize("name", ["streamingllm", "h2o"])
def test_generation_at_the_cap_never_rebuilds_the_storage(tiny_llama, monkeypatch, name: str, backend: str) -> None:
    """End to end (tiny model, 4 layers, 30 steps at the cap): after the first step made room, no layer's storage is
    rebuilt again (#26: the paged pool was rebuilt and regrown at every layer on every step)."""
    monkeypatch.setenv("KVBENCH_CACHE_BACKEND", backend)
    model, tokenizer = tiny_llama
    method = method_from_yaml(name)
    rebuilds: list[list[int]] = []

    def after(layer_idx, layer, state):
        if layer_idx == 0:
            rebuilds.append([])
        rebuilds[-1].append(layer.stats.reallocations)

    method = with_step_hook(method, after)
    out = run_method(model, tokenizer, method, "64L", context=200, new=32)
    assert out.record.final_per_layer == [64] * 4
    assert len(rebuilds) == 31 and rebuilds[1] == rebuilds[-1]
