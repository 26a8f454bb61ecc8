"""Quantized KV storage in kvbench's own machinery (issue #59): stored bytes equal the documented formula
(docs/kv_quant.md) recomputed from KIVI's and transformers' rules; the torch and paged backends store the same
dequantized states and generate the same tokens; the Triton append and paged decode attention (under
``TRITON_INTERPRET=1`` without a GPU) read the dequantized states; batched decoding gives batch 1's tokens.
"""

from __future__ import annotations

import math

import pytest
import torch

from kvbench import kernels
from kvbench.api import compose_config
from kvbench.budget import parse_budget
from kvbench.cache.kv_cache import BACKEND_ENV, HeadwiseLayer
from kvbench.cache.quantized import QuantizedHeadwiseLayer, QuantizedPagedLayer
from kvbench.config import KVQuantConfig
from kvbench.eviction.base import build_method
from kvbench.inference.batched_decode import DecodeRequest, generate_batched
from kvbench.inference.decode_pool import DECODE_PATHS, POOLED
from kvbench.inference.generate import generate
from kvbench.inference.prefill import prefill
from kvbench.resources import models_dir
from kvbench.tasks.tiny_niah import build_instance
from tests.kernel_devices import kernel_device

KIVI = KVQuantConfig(name="kivi4", scheme="kivi", nbits=4, value_nbits=2, group_size=16, residual_length=32)
HQQ = KVQuantConfig(name="hqq4", scheme="hqq", nbits=4, group_size=32, residual_length=16, axis_key=1, axis_value=1)
TRITON = pytest.param(
    "triton", marks=pytest.mark.skipif(not kernels.triton_available(), reason="triton is not installed")
)


@pytest.fixture(scope="module")
def tiny_niah():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import kvbench.attention.function  # noqa: F401  (registers attn_implementation="kvbench")

    folder = models_dir() / "tiny-niah"
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="kvbench")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    instance = build_instance("niah_multivalue", 40, 40.0, "kvq")
    ids = tokenizer(" ".join(instance.context + instance.question), add_special_tokens=False)["input_ids"]
    return model.eval(), tokenizer, ids


def kivi_formula_bytes(layer, spec: KVQuantConfig) -> int:
    """docs/kv_quant.md's formula from KIVI's rules: keys quantized below ``floor(seen / R) * R`` (per channel,
    groups of ``G`` positions), values below ``seen - R`` (per token, ``D / G`` groups); float32 scales and minima."""
    seen, size = layer.seen_tokens, 4
    key_cut, value_cut = seen // spec.residual_length * spec.residual_length, max(0, seen - spec.residual_length)
    total = 0
    for positions in layer.positions:
        positions = positions.long()
        keys, values = positions[positions < key_cut], int((positions < value_cut).sum())
        dim = 32
        total += math.ceil(spec.key_bits * keys.numel() * dim / 8) + math.ceil(spec.value_bits * values * dim / 8)
        total += 2 * size * (dim * (keys // spec.group_size).unique().numel() + values * dim // spec.group_size)
        total += (2 * positions.numel() - keys.numel() - values) * dim * size
    return total


def run_generate(tiny_niah, method: str, budget: str, spec: KVQuantConfig, tokens: int = 24):
    model, tokenizer, ids = tiny_niah
    return generate(
        model,
        tokenizer,
        ids,
        [],
        method=build_method(compose_config(method=method).method),
        budget=parse_budget(budget),
        question_mode="aware",
        max_new_tokens=tokens,
        stop_token_ids=set(),
        kv_quant=spec,
    )


def test_kivi_stored_bytes_equal_the_formula_on_both_backends(tiny_niah, monkeypatch) -> None:
    """SnapKV at half the prompt, KIVI K4V2 (groups of 16, residual 32), 24 decoded tokens (key blocks flushed while
    decoding): the record's stored bytes are the formula's, below the full cache's, and both backends agree on the
    tokens, the bytes and every stored state."""
    captured = {}
    for backend in ("torch", "paged"):
        monkeypatch.setenv(BACKEND_ENV, backend)
        model, _, ids = tiny_niah
        state = prefill(
            model,
            ids,
            [],
            method=build_method(compose_config(method="snapkv").method),
            budget=parse_budget("0.5x"),
            question_mode="aware",
            kv_quant=KIVI,
        )
        layers = state.cache.layers
        assert {type(layer) for layer in layers} == {
            QuantizedHeadwiseLayer if backend == "torch" else QuantizedPagedLayer
        }
        formula = sum(kivi_formula_bytes(layer, KIVI) for layer in layers)
        assert state.cache.stored_bytes() == formula
        captured[backend] = [[layer.head_kv(h) for h in range(layer.num_heads)] for layer in layers]
        output = run_generate(tiny_niah, "snapkv", "0.5x", KIVI)
        assert output.record.stored_bytes == formula  # the record's bytes: after the prefill (docs/results.md)
        captured[backend + "/output"] = output
    torch_out, paged_out = captured["torch/output"], captured["paged/output"]
    assert torch_out.token_ids == paged_out.token_ids
    assert torch_out.record.stored_bytes == paged_out.record.stored_bytes < torch_out.record.full_cache_bytes
    for torch_layer, paged_layer in zip(captured["torch"], captured["paged"], strict=True):
        for (k1, v1), (k2, v2) in zip(torch_layer, paged_layer, strict=True):
            assert torch.equal(k1, k2) and torch.equal(v1, v2)


def test_bytes_after_decoding_equal_the_formula(tiny_niah, monkeypatch) -> None:
    """After 24 decoded tokens (a key block flushed on the way) the cache's bytes are the formula's, and the record's
    peak is at least them."""
    from kvbench.inference import prefill as prefill_module

    built, original = [], prefill_module.build_cache

    def keep(model, method, kv_quant=None):
        built.append(original(model, method, kv_quant))
        return built[-1]

    monkeypatch.setattr(prefill_module, "build_cache", keep)
    output = run_generate(tiny_niah, "snapkv", "0.5x", KIVI)
    layers = built[0].layers
    assert layers[0].seen_tokens // 32 > (layers[0].seen_tokens - 24) // 32  # a key block was flushed decoding
    final = sum(kivi_formula_bytes(layer, KIVI) for layer in layers)
    assert built[0].stored_bytes() == final and output.record.peak_stored_bytes >= final


def test_transformers_scheme_stores_the_compressed_prompt_quantized(tiny_niah) -> None:
    """HQQ 4-bit: after the prefill and its eviction everything kept is quantized (no residual): bytes = codes + one
    scale and zero point per group of 32 elements, for keys and values."""
    model, _, ids = tiny_niah
    state = prefill(
        model,
        ids,
        [],
        method=build_method(compose_config(method="snapkv").method),
        budget=parse_budget("0.5x"),
        question_mode="aware",
        kv_quant=HQQ,
    )
    for layer in state.cache.layers:
        elements = layer.stored_tokens() * 32
        assert layer.key_threshold == layer.seen_tokens
        assert layer.stored_bytes() == 2 * (math.ceil(4 * elements / 8) + 2 * 4 * (elements // 32))


@pytest.mark.parametrize("impl", ["torch", TRITON])
def test_paged_append_and_decode_attention_read_the_dequantized_states(impl: str) -> None:
    """The paged layer's appends (Triton: ``paged_append``) and its split-K decode attention
    (``paged_decode_attention``) over the pools equal the torch layer's states and SDPA over them."""
    device = kernel_device(impl)
    gen = torch.Generator().manual_seed(3)
    torch_layer = QuantizedHeadwiseLayer(KIVI)
    paged = QuantizedPagedLayer(KIVI, page_size=8, impl=impl)
    keys, values = torch.randn(1, 2, 70, 32, generator=gen), torch.randn(1, 2, 70, 32, generator=gen)
    for start, stop in [(0, 50)] + [(t, t + 1) for t in range(50, 70)]:
        for layer, dev in ((torch_layer, torch.device("cpu")), (paged, device)):
            layer.update(keys[:, :, start:stop].to(dev), values[:, :, start:stop].to(dev))
            layer.attention_done()
    dense_keys, dense_values = torch_layer.dense_kv()
    assert not torch.equal(dense_keys, keys[0]) and not torch.equal(dense_values, values[0])  # quantized
    got_keys, got_values = paged.dense_kv()
    assert torch.equal(got_keys.cpu(), dense_keys) and torch.equal(got_values.cpu(), dense_values)
    query = torch.randn(2, 2, 32, generator=gen)
    got = kernels.paged_decode_attention(
        query.to(device),
        paged._flat(paged.k_pool),
        paged._flat(paged.v_pool),
        paged.block_table,
        paged.lengths,
        32**-0.5,
        8,
        70,
        impl=impl,
    )
    expected = torch.nn.functional.scaled_dot_product_attention(
        query[:, :, None], dense_keys[:, None].expand(-1, 2, -1, -1), dense_values[:, None].expand(-1, 2, -1, -1)
    )[:, :, 0]
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("spec", [KIVI, HQQ], ids=["kivi", "hqq"])
def test_pooled_batch_decodes_batch_one_tokens(tiny_niah, spec: KVQuantConfig, monkeypatch) -> None:
    """Two samples of different lengths decoded in one page pool (KIVI: key blocks and values quantized while
    decoding; HQQ: residual flushes) give each sample's batch-1 tokens and leave its prompt's tokens stored as batch 1
    leaves them (the decoded tokens' own states differ in float rounding: a batched forward is not batch 1's)."""
    from kvbench.inference import prefill as prefill_module

    model, tokenizer, ids = tiny_niah
    method = build_method(compose_config(method="streamingllm").method)  # decode-time eviction in the pool too
    requests = [DecodeRequest(ids, [], 14, set()), DecodeRequest(ids[:310], [], 14, set())]
    built, original = [], prefill_module.build_cache

    def keep(model, method, kv_quant=None):
        built.append(original(model, method, kv_quant))
        return built[-1]

    monkeypatch.setattr(prefill_module, "build_cache", keep)
    single = [
        generate(
            model,
            tokenizer,
            r.context_ids,
            [],
            method=method,
            budget=parse_budget("0.5x"),
            question_mode="aware",
            max_new_tokens=14,
            stop_token_ids=set(),
            kv_quant=spec,
        )
        for r in requests
    ]
    single_states = [[stored_heads(layer) for layer in cache.layers] for cache in built]
    thresholds = [[(layer.key_threshold, layer.value_threshold) for layer in cache.layers] for cache in built]
    built.clear()
    DECODE_PATHS.reset()
    batched = dict(
        generate_batched(
            model,
            tokenizer,
            requests,
            method=method,
            budget=parse_budget("0.5x"),
            question_mode="aware",
            decode_batch=2,
            kv_quant=spec,
        )
    )
    assert [batched[i].token_ids for i in range(2)] == [out.token_ids for out in single]
    assert DECODE_PATHS.taken() == [(POOLED, None)]
    for cache, states, request in zip(built, single_states, requests, strict=True):
        prompt = len(request.context_ids)
        for layer, heads in zip(cache.layers, states, strict=True):
            for (keys, values, positions), (got_keys, got_values, got_positions) in zip(
                heads, stored_heads(layer), strict=True
            ):
                assert torch.equal(got_positions, positions)
                old = positions < prompt // 16 * 16  # KIVI's key groups of 16 positions hold no decoded token
                assert torch.equal(got_keys[old], keys[old]) and torch.equal(got_values[old], values[old])
    assert [[(layer.key_threshold, layer.value_threshold) for layer in cache.layers] for cache in built] == thresholds
    first_layer_keys = [per_layer[0][0] for per_layer in thresholds]
    assert first_layer_keys[0] > 404 // 32 * 32 and first_layer_keys[1] > 310 // 32 * 32  # quantized while decoding


def stored_heads(layer) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per stored head: its keys, values and positions (copies, slot order)."""
    return [(*(t.clone() for t in layer.head_kv(h)), layer.positions[h].clone()) for h in range(layer.num_heads)]


@pytest.mark.skipif(
    not hasattr(HeadwiseLayer, "rewrite_values"),
    reason="the layers' rewrite_values (merged values, issue #58) is not in this tree yet",
)
@pytest.mark.parametrize("spec", [HQQ, KIVI], ids=["hqq", "kivi"])
def test_merged_values_are_stored_quantized(spec: KVQuantConfig) -> None:
    """kvpress quantizes a merging press's kept keys and merged values once: after ``keep`` and ``rewrite_values``
    the keys are unchanged by the rewrite and the values are the quantization of what was written."""
    from kvbench.cache.quant_schemes import hqq_roundtrip, kivi_values

    gen = torch.Generator().manual_seed(5)
    layer = QuantizedHeadwiseLayer(spec)
    layer.update(torch.randn(1, 2, 80, 32, generator=gen), torch.randn(1, 2, 80, 32, generator=gen))
    layer.attention_done()
    layer.keep(torch.arange(0, 80, 2).expand(2, -1))
    keys_before, _ = layer.dense_kv()
    keys_before = keys_before.clone()
    merged = [torch.randn(40, 32, generator=gen) for _ in range(2)]
    layer.rewrite_values(merged)
    keys, values = layer.dense_kv()
    assert torch.equal(keys, keys_before)
    written = torch.stack(merged)
    if spec.scheme == "hqq":
        assert torch.equal(values, hqq_roundtrip(written[None], 4, 1, 32)[0])
    else:  # positions below seen - R = 48 are quantized (24 kept tokens), the rest full precision
        assert torch.equal(values[:, :24], kivi_values(written[:, :24], 16, 2)) and torch.equal(
            values[:, 24:], written[:, 24:]
        )


@pytest.mark.parametrize("spec", [KIVI, HQQ], ids=["kivi", "hqq"])
def test_chunked_prefill_quantizes_as_a_one_shot_prefill(tiny_niah, spec: KVQuantConfig, monkeypatch) -> None:
    """A prompt fed in chunks (CPU's automatic chunking of long prompts, run.prefill_chunk) is quantized once after
    its last chunk, as the references' one-shot prefill: the same thresholds and bytes, the same states up to the
    chunked attention's float rounding; quantizing chunk by chunk would not be."""
    from kvbench.inference import prefill as prefill_module

    model, _, ids = tiny_niah
    method = build_method(compose_config(method="full").method)

    def stored(chunk: int) -> tuple[list, int]:
        state = prefill(model, ids, [], method=method, budget=parse_budget("full"), prefill_chunk=chunk, kv_quant=spec)
        layers = state.cache.layers
        return [(layer.key_threshold, layer.value_threshold, stored_heads(layer)) for layer in layers], sum(
            layer.stored_bytes() for layer in layers
        )

    def close(a: list, b: list, atol: float) -> bool:
        return all(
            ta[:2] == tb[:2]
            and all(
                torch.allclose(x, y, atol=atol)
                for ha, hb in zip(ta[2], tb[2], strict=True)
                for x, y in zip(ha, hb, strict=True)
            )
            for ta, tb in zip(a, b, strict=True)
        )

    one_shot, one_shot_bytes = stored(0)
    chunked, chunked_bytes = stored(100)
    assert chunked_bytes == one_shot_bytes and close(chunked, one_shot, atol=1e-4)
    monkeypatch.setattr(prefill_module, "hold_quantization", lambda cache, held: None)
    per_chunk, _ = stored(100)
    assert not close(per_chunk, one_shot, atol=1e-4)
