"""R-KV (``method=rkv``): the reference's kept tokens, in its cache order, at the prefill and while decoding.

Parity: ``tests/fixtures/reference/rkv/R1KV.json`` (recorded by ``scripts/reference/record_rkv.py`` from
Zefan-Cai/R-KV at d15c9767, outside kvbench): one ``R1KV.update_kv`` call on seeded tensors, the decode flow of
``rkv/modeling.py`` over seeded streams and over layer 0 of the tiny random Llama, and the whole tiny Llama
teacher-forced with that flow on every layer, float32 and bfloat16.  kvbench runs
the same inputs through its eviction session (one layer) and must hold the same tokens per head, in the same order.
Then: batched decoding gives the batch-1 tokens, and the knobs are checked.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from kvbench.budget import parse_budget
from kvbench.cache.kv_cache import KVBenchCache
from kvbench.inference.eviction import EvictionSession
from tests.methods.helpers import LayerIndex, method_from_yaml

RECORDING = Path(__file__).resolve().parents[1] / "fixtures" / "reference" / "rkv"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@cache
def recording() -> dict:
    return json.loads((RECORDING / "R1KV.json").read_text())


@cache
def tensors() -> dict[str, torch.Tensor]:
    return load_file(RECORDING / "streams.safetensors")


def kvbench_cache_order(case: dict) -> tuple[list[list[int]], list[int]]:
    """The positions kvbench holds per head at the end of ``case``, in the reference cache's order (the policy's),
    and the tokens whose decoding forward compressed the cache."""
    dtype = DTYPES[case["dtype"]]
    keys = tensors()[f"{case['tensors']}/keys"].to(dtype)  # [1, H_kv, T, D]
    queries = tensors()[f"{case['tensors']}/queries"].to(dtype)  # [1, H_q, T or W, D]
    buffer = case.get("divide_length", 128)
    method = method_from_yaml("rkv", window=case["window"], params={"buffer": buffer})
    prompt = case.get("prompt", keys.shape[2])
    cache = KVBenchCache(1)
    session = EvictionSession(method, parse_budget(f"{case['budget']}/layer"), cache)
    scaling = keys.shape[-1] ** -0.5
    session.begin_prefill(prompt)
    cache.update(keys[:, :, :prompt], torch.zeros_like(keys[:, :, :prompt]), 0)
    session.after_attention(LayerIndex(0), queries[:, :, :prompt], scaling)
    session.begin_decode()
    layer, compressed_at = cache.layers[0], []
    keep = layer.keep
    layer.keep = lambda indices: (compressed_at.append(layer.seen_tokens - 1), keep(indices))  # a spy, this layer only
    for token in range(prompt, case.get("total", prompt)):
        step = slice(token, token + 1)
        cache.update(keys[:, :, step], torch.zeros_like(keys[:, :, step]), 0)
        session.after_attention(LayerIndex(0), queries[:, :, step], scaling)
    order = session.decode_state.order[0]
    return [layer.positions[head][order[head]].tolist() for head in range(layer.num_heads)], compressed_at


def kvbench_tiny_llama(case: dict) -> tuple[list[list[list[int]]], list[int]]:
    """The tiny Llama (both layers) teacher-forced over the case's ids through kvbench's session with ``method=rkv``:
    per layer the positions per head in the reference cache's order, and the tokens whose forward compressed layer 0
    (0: the prefill)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from kvbench import attention
    from kvbench.inference.prefill import forward_logits
    from tests.reference_recordings import inputs_meta, tiny_llama_weights

    dtype = DTYPES[case["dtype"]]
    model = LlamaForCausalLM(LlamaConfig(**inputs_meta()["model_config"]))
    model.load_state_dict(tiny_llama_weights(dtype), strict=False)
    model = model.to(dtype).eval()
    model.set_attn_implementation(attention.ATTENTION_NAME)
    ids = tensors()["tiny_llama/input_ids"][0, : case["total"]].tolist()
    method = method_from_yaml("rkv", window=case["window"], params={"buffer": case["divide_length"]})
    cache = KVBenchCache(2)
    session = EvictionSession(method, parse_budget(f"{case['budget']}/layer"), cache)
    prompt, compressed_at = case["prompt"], []
    with torch.no_grad():
        session.begin_prefill(prompt)
        forward_logits(model, ids[:prompt], 0, cache, session, torch.device("cpu"))
        if cache.layers[0].head_lengths()[0] < prompt or prompt == case["budget"]:
            compressed_at.append(0)
        session.begin_decode()
        layer0, keep = cache.layers[0], cache.layers[0].keep
        layer0.keep = lambda indices: (compressed_at.append(layer0.seen_tokens - 1), keep(indices))  # a spy
        for position in range(prompt, len(ids)):
            forward_logits(model, ids[position : position + 1], position, cache, session, torch.device("cpu"))
    kept = []
    for idx, layer in enumerate(cache.layers):
        order = session.decode_state.order[idx]
        kept.append([layer.positions[head][order[head]].tolist() for head in range(layer.num_heads)])
    return kept, compressed_at


def test_the_tiny_llama_keeps_the_reference_tokens_in_its_order() -> None:
    """The whole tiny Llama, teacher-forced (prompt, then one token per forward), R-KV compressing both layers as
    rkv/modeling.py does (layer 1 sees layer 0's compressed cache): the same tokens in the same order per layer and
    head, compressed at the same forwards, float32 and bfloat16."""
    cases = [case for case in recording()["cases"] if case["kind"] == "model"]
    assert {case["dtype"] for case in cases} == {"float32", "bfloat16"}
    for case in cases:
        kept, compressed_at = kvbench_tiny_llama(case)
        assert compressed_at == case["compressed_at"], case["dtype"]
        assert kept == case["kept_per_layer"], (case["dtype"], case["prompt"])


def test_kvbench_keeps_the_reference_tokens_in_its_order_on_every_recorded_case() -> None:
    """Every case and KV head: the same kept positions in the same cache order (which the next compression's
    max-pooling runs over)."""
    cases = [case for case in recording()["cases"] if case["kind"] != "model"]
    differ = []
    for case in cases:
        got, compressed_at = kvbench_cache_order(case)
        if case["kind"] == "stream":
            assert compressed_at == [token for token in case["compressed_at"] if token > 0], case
        for head, expected in enumerate(case["kept"]):
            if got[head] != expected:
                differ.append((case["tensors"], case["dtype"], head, sorted(got[head]) == sorted(expected)))
    assert not differ, differ
    assert {c["dtype"] for c in cases} == {"float32", "bfloat16"}
    assert {c.get("source", "seeded") for c in cases} == {"seeded", "tiny_llama_layer0"}
    compressions = sum(len(c["compressed_at"]) for c in cases if c["kind"] == "stream")
    assert compressions >= 80  # prefill and decode compressions replayed (84 recorded)


def test_the_cache_is_compressed_when_the_buffer_fills() -> None:
    """Between two compressions the cache grows by up to the buffer; after each compressing forward (every 10 tokens
    fed) it holds the budget."""
    generator = torch.Generator().manual_seed(2)
    keys, queries = torch.randn(1, 2, 100, 16, generator=generator), torch.randn(1, 4, 100, 16, generator=generator)
    method = method_from_yaml("rkv", params={"buffer": 10})
    cache = KVBenchCache(1)
    session = EvictionSession(method, parse_budget("24/layer"), cache)
    session.begin_prefill(30)
    cache.update(keys[:, :, :30], keys[:, :, :30], 0)
    session.after_attention(LayerIndex(0), queries[:, :, :30], 0.25)
    session.begin_decode()
    lengths = [cache.layers[0].head_lengths()[0]]
    for token in range(30, 100):
        cache.update(keys[:, :, token : token + 1], keys[:, :, token : token + 1], 0)
        session.after_attention(LayerIndex(0), queries[:, :, token : token + 1], 0.25)
        lengths.append(cache.layers[0].head_lengths()[0])
    assert lengths[0] == 24 and max(lengths) == 24 + 9  # the 10th token's forward appends it, then compresses
    assert [token for token, length in zip(range(30, 100), lengths[1:], strict=True) if length == 24] == list(
        range(30, 100, 10)
    )


def test_bad_rkv_knobs_name_the_valid_choices() -> None:
    with pytest.raises(ValueError, match="retain_direction"):
        method_from_yaml("rkv", params={"retain_direction": "middle"})
    with pytest.raises(ValueError, match="mix_lambda"):
        method_from_yaml("rkv", params={"mix_lambda": 2.0})
    with pytest.raises(ValueError, match=r"\['pooling'\] for family 'rkv'; valid keys: buffer"):
        method_from_yaml("rkv", pooling="avg")
    generator = torch.Generator().manual_seed(0)
    keys, queries = torch.randn(1, 2, 30, 16, generator=generator), torch.randn(1, 4, 30, 16, generator=generator)
    cache = KVBenchCache(1)
    session = EvictionSession(method_from_yaml("rkv"), parse_budget("8/layer"), cache)
    session.begin_prefill(30)
    cache.update(keys, keys, 0)
    with pytest.raises(ValueError, match=r"budget above method\.params\.window=8, got 8"):
        session.after_attention(LayerIndex(0), queries, 0.25)


@pytest.mark.parametrize("mode", ["aware", "agnostic"])
def test_rkv_batched_decoding_gives_the_batch_one_tokens(mode: str) -> None:
    """A small buffer (4) so the caches are compressed while decoding: batch 3 gives batch 1's tokens and records."""
    from kvbench.inference.batched_decode import generate_batched
    from kvbench.inference.generate import generate
    from tests.inference.test_batch_decode import _model, _requests

    model, tokenizer = _model("tiny-random-llama")
    requests = _requests(model.config.vocab_size, 3, set())
    method, budget = method_from_yaml("rkv", params={"buffer": 4}), parse_budget("16L")
    alone = [
        generate(model, tokenizer, r.context_ids, r.question_ids, method=method, budget=budget, question_mode=mode,
                 max_new_tokens=r.max_new_tokens, stop_token_ids=r.stop_token_ids)
        for r in requests
    ]  # fmt: skip
    batched = dict(
        generate_batched(model, tokenizer, requests, method=method, budget=budget, question_mode=mode, decode_batch=3)
    )
    for index, expected in enumerate(alone):
        assert batched[index].token_ids == expected.token_ids, f"sample {index}"
        assert batched[index].record.to_json() == expected.record.to_json(), f"sample {index}: cache record"
    assert any(
        final < achieved + len(r.token_ids) - 1
        for r in alone
        for final, achieved in zip(r.record.final_per_layer, r.record.achieved_per_layer, strict=True)
    )  # the policy evicted while decoding
