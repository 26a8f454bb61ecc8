"""The paged cache backend (kvbench/cache/paged.py) on CPU: same contents and logits as the torch backend, appends that
cost O(heads) whatever is stored (counted in rows written, not timed), compaction that frees memory, and the
stored-bytes bound."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from kvbench import kernels
from kvbench.budget import parse_budget
from kvbench.cache.base import StorageStats
from kvbench.cache.kv_cache import BACKEND_ENV, HeadwiseLayer, KVBenchCache
from kvbench.cache.paged import PagedLayer
from kvbench.config import MethodConfig
from kvbench.eviction.base import build_method
from kvbench.inference.generate import generate
from kvbench.kernels.paths import plan_attention, varlen_capability
from kvbench.models.loading import build_builtin
from tests.kernel_devices import kernel_device

CONF = Path(__file__).resolve().parents[2] / "conf"
IMPLS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(not kernels.triton_available(), reason="no triton"))]


def _check_invariants(layer: PagedLayer) -> None:
    """Pages are owned by one head or free, never both; the block table mirrors the host page lists."""
    owned = [page for pages in layer.pages for page in pages]
    assert len(owned) == len(set(owned))
    assert not set(owned) & set(layer.free_pages)
    assert len(owned) + len(layer.free_pages) == layer.num_pages
    for head, pages in enumerate(layer.pages):
        assert len(pages) == math.ceil(layer.host_lengths[head] / layer.page_size)
        assert layer.block_table[head, : len(pages)].tolist() == pages
    assert layer.lengths.tolist() == layer.host_lengths


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_paged_layer_holds_the_same_tokens_as_the_torch_layer(impl: str, page_size: int) -> None:
    """Random prefill, per-head evictions (repack and in-place), decode appends and a question chunk: the paged
    layer's keys, values and positions equal HeadwiseLayer's after every operation."""
    gen = torch.Generator().manual_seed(page_size)
    device = kernel_device(impl)  # compiled Triton reads only GPU memory: its tensors live on CUDA when there is one
    torch_layer, paged = HeadwiseLayer(), PagedLayer(page_size=page_size, impl=impl)

    def same() -> None:
        assert paged.head_lengths() == torch_layer.head_lengths()
        for head in range(3):
            for a, b in zip(paged.head_kv(head), torch_layer.head_kv(head), strict=True):
                assert torch.equal(a.cpu(), b)
            assert torch.equal(paged.positions[head].cpu(), torch_layer.positions[head])
        _check_invariants(paged)

    def feed(tokens: int) -> None:
        k, v = torch.randn(1, 3, tokens, 8, generator=gen), torch.randn(1, 3, tokens, 8, generator=gen)
        torch_layer.update(k, v)
        paged.update(k.to(device), v.to(device))

    def evict(counts: list[int], ordered: bool = False) -> None:
        keep = [
            torch.randperm(length, generator=gen)[:count]
            for length, count in zip(paged.head_lengths(), counts, strict=True)
        ]
        before = [positions.clone() for positions in torch_layer.positions]
        torch_layer.keep(keep, ordered)
        paged.keep([index.to(device) for index in keep], ordered)
        if ordered:  # stored in the order given (a decode policy's keeps_selection_order)
            assert all(torch.equal(p, b[k]) for p, b, k in zip(torch_layer.positions, before, keep, strict=True))

    feed(41)
    same()
    evict([5, 17, 40])  # large eviction: repack
    same()
    for _ in range(6):
        feed(1)
        evict([length - 1 for length in paged.head_lengths()])  # one token per head: in place
        same()
    feed(7)  # question chunk
    same()
    evict([9, 8, 7], ordered=True)
    same()
    evict([3, 3, 3])  # equal lengths again
    assert not paged.is_ragged
    same()
    keys, _ = paged.dense_kv()
    assert torch.equal(keys.cpu(), torch_layer.dense_kv()[0])


def test_append_cost_does_not_depend_on_cache_size() -> None:
    """A decode append stores exactly H rows at 1K and at 64K stored tokens, with no pool copy once reserved (the
    layer's StorageStats); without a reservation, pool growth copies are amortised to <= 1 / GROWTH_FRACTION rows per
    appended row."""
    heads, dim = 4, 8
    rows_per_step = {}
    for context in (1024, 65536):
        layer = PagedLayer(page_size=16, impl="torch")
        layer.update(torch.zeros(1, heads, context, dim), torch.zeros(1, heads, context, dim))
        layer.reserve(64)
        before, stored = StorageStats(**vars(layer.stats)), layer.stored_tokens()
        for _ in range(64):
            layer.update(torch.ones(1, heads, 1, dim), torch.ones(1, heads, 1, dim))
        assert layer.stats == before  # reserved: no growth, nothing copied
        rows_per_step[context] = (layer.stored_tokens() - stored) / 64
        _check_invariants(layer)
    assert rows_per_step == {1024: heads, 65536: heads}

    layer = PagedLayer(page_size=16, impl="torch")
    layer.update(torch.zeros(1, heads, 1024, dim), torch.zeros(1, heads, 1024, dim))
    for _ in range(4096):
        layer.update(torch.ones(1, heads, 1, dim), torch.ones(1, heads, 1, dim))
    decoded_rows = 4096 * heads
    assert layer.stats.rows_copied <= decoded_rows * 9  # geometric growth: bounded amortised copying
    assert layer.stats.rows_copied < 0.5 * (4096 * (1024 + 2048) * heads)  # far below cat's O(S) per step
    _check_invariants(layer)


@pytest.mark.parametrize(("kept", "page_size"), [(1024, 16), (2000, 16), (4096, 64)])
def test_stored_bytes_within_two_percent_of_kept_tokens(kept: int, page_size: int) -> None:
    """After a per-head eviction the pool holds <= 1.02 x kept tokens x bytes per token (pages are repacked)."""
    gen = torch.Generator().manual_seed(kept)
    heads, dim, context = 8, 16, 8192
    layer = PagedLayer(page_size=page_size, impl="torch")
    layer.update(torch.randn(1, heads, context, dim, dtype=torch.bfloat16), torch.zeros(1, heads, context, dim))
    counts = [kept + int(torch.randint(-kept // 4, kept // 4, (1,), generator=gen)) for _ in range(heads)]
    counts[0] += sum(kept for _ in range(heads)) - sum(counts)  # same total as a uniform kept per head
    layer.keep([torch.randperm(context, generator=gen)[:count] for count in counts])
    per_token = dim * 2 * 2  # K and V, bfloat16
    assert layer.stored_bytes() == sum(counts) * per_token
    assert layer.allocated_bytes() <= 1.02 * sum(counts) * per_token
    assert layer.allocated_bytes() <= (sum(counts) + heads * (page_size - 1)) * per_token
    assert not layer.free_pages
    layer.reserve(16)  # decode headroom is allocated exactly (no geometric slack)
    assert layer.num_pages == sum(math.ceil((count + 16) / page_size) for count in counts)


def test_auto_backend_is_torch_on_cpu_and_env_selects_paged(monkeypatch: pytest.MonkeyPatch) -> None:
    k = torch.randn(1, 2, 5, 4)
    auto = KVBenchCache(1)
    auto.update(k, k, 0)
    assert isinstance(auto.layers[0], HeadwiseLayer)
    monkeypatch.setenv(BACKEND_ENV, "paged")
    paged = KVBenchCache(1, expand_factor=2)
    paged.update(k, k, 0)
    assert isinstance(paged.layers[0], PagedLayer) and paged.head_lengths() == [[5, 5, 5, 5]]
    assert torch.equal(paged.headwise_layers[0].head_kv(3)[0], k[0, 1])
    with pytest.raises(ValueError):
        KVBenchCache(1, backend="cuda")


def _method_cfg(name: str):
    """conf/method/<name>.yaml as a MethodConfig node, with decode-time eviction on where the family has it."""
    raw = OmegaConf.load(CONF / "method" / f"{name}.yaml")
    raw.pop("defaults", None)
    node = OmegaConf.merge(OmegaConf.structured(MethodConfig), raw)
    if name in ("h2o", "tova", "streamingllm"):
        node.params.decode_eviction = True
    if name == "snapkv_kvpress":  # kvpress's decoding press: its cache stored in top-k order
        node.params.decode_interval = 4
    return node


@pytest.mark.parametrize("method_name", ["snapkv", "pyramidkv", "h2o", "tova", "streamingllm", "snapkv_kvpress"])
def test_paged_backend_generates_the_same_logits_as_torch_backend(
    method_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end on the tiny model with prefill eviction, a question chunk and decode-time eviction: the paged
    backend produces the same tokens, cache sizes and stored bytes as the torch backend (issue #40: stored bytes have
    one meaning on every backend; only the allocated bytes, free pages included, may differ)."""
    model, tokenizer = build_builtin("tiny-random-llama", seed=4)
    model.set_attn_implementation("kvbench")
    model.eval()
    ids = torch.randint(3, 250, (300,), generator=torch.Generator().manual_seed(9)).tolist()
    method_cfg = _method_cfg(method_name)
    outputs = {}
    for backend in ("torch", "paged"):
        monkeypatch.setenv(BACKEND_ENV, backend)
        outputs[backend] = generate(
            model,
            tokenizer,
            ids[:280],
            ids[280:],
            method=build_method(method_cfg),
            budget=parse_budget("48/layer"),
            question_mode="agnostic",
            max_new_tokens=12,
            stop_token_ids=set(),
        )
    torch_out, paged_out = outputs["torch"], outputs["paged"]
    assert paged_out.token_ids == torch_out.token_ids
    assert paged_out.record.achieved_per_head == torch_out.record.achieved_per_head
    assert paged_out.record.final_per_layer == torch_out.record.final_per_layer
    for field in ("stored_bytes", "peak_stored_bytes", "peak_prefill_bytes", "full_cache_bytes"):
        assert getattr(paged_out.record, field) == getattr(torch_out.record, field) > 0, field
    assert paged_out.record.allocated_bytes >= paged_out.record.stored_bytes
    assert torch_out.record.allocated_bytes >= torch_out.record.stored_bytes


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("page_size", [16, 256])
def test_paged_backend_on_cuda_matches_torch_backend(page_size: int) -> None:
    """On a GPU the paged backend runs the Triton append / split-K decode kernels (page 16) or varlen_attn
    (page 256, bfloat16: FlashAttention needs half precision): its logits match the torch backend's through prefill
    eviction, a question chunk and decoding, on the path planned for this machine (kvbench/kernels/paths.py)."""
    from kvbench.cache import paged

    dtype = torch.float32 if page_size == 16 else torch.bfloat16
    model, _ = build_builtin("tiny-random-llama", seed=6)
    model = model.to(device="cuda", dtype=dtype).eval()
    paged.ATTENTION_RECORD.reset()
    model.set_attn_implementation("kvbench")
    ids = torch.randint(3, 250, (1, 400), generator=torch.Generator().manual_seed(1)).cuda()
    logits = {}
    for backend in ("torch", "paged"):
        cache = KVBenchCache(model.config.num_hidden_layers, backend=backend, page_size=page_size)
        steps = []
        with torch.inference_mode():
            model(ids[:, :300], past_key_values=cache, position_ids=torch.arange(300, device="cuda")[None])
            gen = torch.Generator().manual_seed(3)
            for layer in cache.headwise_layers:
                layer.keep([torch.sort(torch.randperm(300, generator=gen)[: 40 + 30 * h]).values for h in range(2)])
            out = model(
                ids[:, 300:310], past_key_values=cache, position_ids=torch.arange(300, 310, device="cuda")[None]
            )
            steps.append(out.logits[0, -1])
            for step in range(310, 400):
                pos = torch.tensor([[step]], device="cuda")
                steps.append(model(ids[:, step : step + 1], past_key_values=cache, position_ids=pos).logits[0, -1])
        logits[backend] = torch.stack(steps).float().cpu()
    tolerance = 1e-3 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(logits["paged"], logits["torch"], rtol=tolerance, atol=tolerance)
    # The path planned for this machine ran; the only fallback is the documented one the plan names (torch 2.11's
    # varlen_attn has no block table: page 256 then decodes with the Triton kernel, recorded as a fallback).
    head_dim = getattr(model.config, "head_dim", None) or model.config.hidden_size // model.config.num_attention_heads
    plan = plan_attention(torch.device("cuda"), dtype, page_size, head_dim)
    record = paged.ATTENTION_RECORD.summary()
    assert record["calls"].get(plan.decode, 0) > 0, record
    assert set(record["fallbacks"]) == ({plan.fallback} if plan.fallback else set()), record
    if page_size == 256 and varlen_capability().paged:
        assert plan.fallback is None and record["calls"]["varlen_paged"] > 0, record


def test_every_layer_implements_the_evictable_layer_interface() -> None:
    """The torch, paged and sliding layers all declare EvictableLayer; the paged layer's update returns one LayerKV
    for the keys and another for the values, each naming its layer (what attention dispatches on); dense states come
    back as the tensors themselves (models reshape or cast them before attention; the attention function finds their
    layer through the cache), and attention_kv reads back what the chunk attends over."""
    from kvbench.cache.base import EvictableLayer, LayerKV
    from kvbench.cache.sliding import SlidingWindowLayer

    keys, values = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    for layer in (HeadwiseLayer(), PagedLayer(page_size=4, impl="torch"), SlidingWindowLayer(16)):
        assert isinstance(layer, EvictableLayer), type(layer).__name__
        key, value = layer.update(keys, values)
        if isinstance(layer, PagedLayer):
            assert isinstance(key, LayerKV) and isinstance(value, LayerKV) and key is not value
            assert key.layer is layer and value.layer is layer
        else:
            assert isinstance(key, torch.Tensor) and isinstance(value, torch.Tensor), type(layer).__name__
            key, value = LayerKV(layer, key), LayerKV(layer, value)
        read_keys, read_values = layer.attention_kv(key, value)
        assert torch.equal(read_keys, keys) and torch.equal(read_values, values)
        assert layer.stored_bytes() == 2 * 5 * 8 * 2 * 4 <= layer.allocated_bytes()
