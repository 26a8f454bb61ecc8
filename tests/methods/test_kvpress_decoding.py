"""kvpress's ``DecodingPress`` over any scorer (``method.params.decode_interval``) against NVIDIA/kvpress 0.5.5's
recordings: the recorded tiny Llama (float32 and bfloat16) prefills, takes a 4-token question in one forward and 10
single decoding steps (teacher-forced, the recorded ids), and every layer and head ends with kvpress's positions."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import kvbench.attention.function as attention
from kvbench.budget import parse_budget
from kvbench.cache.kv_cache import KVBenchCache
from kvbench.inference.eviction import EvictionSession
from kvbench.inference.prefill import forward_logits
from kvbench.methods.base import build_method
from kvbench.methods.kvpress_decoding import IntervalDecodingPolicy
from tests.reference_recordings import (
    DTYPES,
    RecordedCase,
    inputs_meta,
    kvpress_n_kept,
    load_recording,
    stored_input,
    tiny_llama_weights,
)

QUESTION = 4  # the recorder's question forward; the rest of decode_ids are single steps


def tiny_llama(dtype: str) -> LlamaForCausalLM:
    model = LlamaForCausalLM(LlamaConfig(**inputs_meta()["model_config"]))
    model.load_state_dict(tiny_llama_weights(DTYPES[dtype]), strict=False)
    model = model.to(DTYPES[dtype]).eval()
    model.set_attn_implementation(attention.ATTENTION_NAME)
    return model


def kept_after_decoding(
    case: RecordedCase, interval: int, budget: int, target: int = 0, ratio: float = 0.0
) -> list[list[list[int]]]:
    """kvbench's session over the case: prefill at ``budget``, the question, single steps; positions per head."""
    params = {"decode_interval": interval, "decode_target": target, "decode_ratio": ratio}
    cache = run_case(case, build_method({"name": "knorm", "family": "knorm", "params": params}), budget)
    return [[sorted(p.tolist()) for p in layer.positions] for layer in cache.headwise_layers]


def same_or_tied(case: RecordedCase, kept: list[list[list[int]]]) -> bool:
    """kvpress's positions, or positions swapped with tokens of the same key norm (KNorm's tie), per layer and head."""
    if kept == [[sorted(head) for head in layer] for layer in case.kept]:
        return True
    full = run_case(case, build_method({"name": "full", "family": "full"}), None)
    for layer, heads in enumerate(kept):
        norms = full.headwise_layers[layer].dense_kv()[0].float().norm(dim=-1)  # [H, S_total]
        for head, positions in enumerate(heads):
            swapped = sorted(set(positions) ^ set(case.kept[layer][head]))
            if len(positions) != len(case.kept[layer][head]) or len(set(norms[head][swapped].tolist())) > 1:
                return False
    return True


def run_case(case: RecordedCase, method, budget: int | None) -> KVBenchCache:
    """The case's prompt, question and single steps through ``method`` at ``<budget>/layer`` (``None``: no
    eviction); the cache at the end."""
    model = tiny_llama(case.dtype)
    ids = stored_input(f"{case.inputs}/input_ids")[0].tolist()
    decoded = stored_input(f"decode_ids/S{case.length}").flatten().tolist()
    cache = KVBenchCache(2)
    session = None if budget is None else EvictionSession(method, parse_budget(f"{budget}/layer"), cache)
    device = torch.device("cpu")
    with torch.no_grad():
        if session is not None:
            session.begin_prefill(len(ids))
        forward_logits(model, ids, 0, cache, session, device)
        if session is not None:
            session.begin_append()
        forward_logits(model, decoded[:QUESTION], len(ids), cache, session, device)
        if session is not None:
            session.begin_decode()
        for step, token in enumerate(decoded[QUESTION:]):
            forward_logits(model, [token], len(ids) + QUESTION + step, cache, session, device)
    return cache


def test_decoding_press_over_knorm_keeps_kvpress_tokens() -> None:
    """``DecodingPress(KnormPress, interval 4, target 48)`` and ``(interval 3, target 40, no buffer)``: the prompt
    kept whole (``budget=<S>/layer``), ``decode_target`` the press's target."""
    selections = 0
    for press in ("DecodingPress_KnormPress", "DecodingPress_KnormPress_buffer0"):
        for case in load_recording(press).cases:
            settings = case.settings
            kept = kept_after_decoding(case, settings["compression_interval"], case.length, settings["target_size"])
            assert kept == [[sorted(head) for head in layer] for layer in case.kept], (press, case.inputs)
            selections += sum(map(len, kept))
    assert selections == 2 * 4 * 2 * 2


def test_prefill_decoding_press_keeps_kvpress_tokens() -> None:
    """``PrefillDecodingPress``: KNorm at the case's ratio (budget ``<max(1, int(S (1 - r)))>/layer``), then
    ``DecodingPress`` interval 4, target 24 (``decode_target=24``); a prefill below the target grows to it."""
    cases = load_recording("PrefillDecodingPress_KnormPress").cases
    same = 0
    for case in cases:
        kept = kept_after_decoding(case, 4, kvpress_n_kept(case.length, case.compression_ratio), 24)
        assert same_or_tied(case, kept), (case.inputs, case.compression_ratio)
        same += kept == [[sorted(head) for head in layer] for layer in case.kept]
    assert len(cases) == 16 and same > 0


def test_compression_ratio_decoding_press_keeps_kvpress_tokens() -> None:
    """``CompressionRatioDecodingPress(KnormPress, interval 4, ratio r)``: the prompt kept whole
    (``budget=<S>/layer``), ``decode_ratio=r``; each compression cuts to ``max(1, int(seen (1 - r)))``."""
    cases = load_recording("CompressionRatioDecodingPress_KnormPress").cases
    same = 0
    for case in cases:
        kept = kept_after_decoding(
            case, case.settings["compression_interval"], case.length, ratio=case.compression_ratio
        )
        assert [len(layer[0]) for layer in kept] == [len(layer[0]) for layer in case.kept], case.inputs
        assert same_or_tied(case, kept), (case.inputs, case.dtype, case.compression_ratio)
        same += kept == [[sorted(head) for head in layer] for layer in case.kept]
    assert len(cases) == 16 and same > 0


def test_decode_ratio_is_a_ratio_and_excludes_decode_target() -> None:
    """A ratio outside ``[0, 1)`` and a ratio with a target are refused, naming the knob."""
    for params in (
        {"decode_interval": 4, "decode_ratio": 1.0},
        {"decode_interval": 4, "decode_ratio": 0.5, "decode_target": 8},
    ):
        with pytest.raises(ValueError, match="decode_ratio"):
            build_method({"name": "knorm", "family": "knorm", "params": params})


def test_interval_policy_counts_forwards_per_layer() -> None:
    """Nothing is cut before the ``interval``-th forward after the prefill; then each head is back at its cap."""
    from kvbench.methods.knorm import KNorm

    policy = IntervalDecodingPolicy(KNorm(), interval=2)
    cache = KVBenchCache(1)
    keys = torch.randn(1, 2, 6, 4, generator=torch.Generator().manual_seed(0))
    cache.update(keys, keys, 0)
    layer = cache.headwise_layers[0]
    state = policy.new_state()  # the sample's counters, caps and queries (its session's)
    policy.start_layer(state, 0, layer, [4, 4])
    query = torch.zeros(2, 1, 4)
    policy.step(state, 0, layer, query, 0.5)
    assert layer.head_lengths() == [6, 6]
    policy.step(state, 0, layer, query, 0.5)
    assert layer.head_lengths() == [4, 4]
    norms = keys[0, 0].norm(dim=-1)
    assert sorted(layer.positions[0].tolist()) == sorted((-norms).topk(4).indices.tolist())
