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
from kvbench.eviction.base import build_method
from kvbench.eviction.kvpress_decoding import IntervalDecodingPolicy
from kvbench.inference.eviction import EvictionSession
from kvbench.inference.prefill import forward_logits
from tests.methods.helpers import method_from_yaml
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


def test_snapkv_kvpress_decode_interval_4_keeps_the_newest_tokens_where_kvpress_does() -> None:
    """``python run.py method=snapkv_kvpress method.params.decode_interval=4 budget=64/layer``, as the command line
    composes it, is kvpress's ``PrefillDecodingPress(SnapKVPress(0.5), DecodingPress(SnapKVPress(), 4, 64))`` on the
    recorded tiny Llama (S 128, float32 and bfloat16): every compression step keeps kvpress's positions -- its
    ``max + 1`` window, the last 64 rows of its cache order: the tokens generated since the last compression and the
    tail of its top-k order -- or another top-k of kvpress's tied scores."""
    import kvbench
    from kvbench.app.validation import validate
    from tests.methods.decoding_replay import replay_case
    from tests.methods.wrapper_replay import KeptTally
    from tests.parity.kvpress_claims import claims_of

    cfg = kvbench.compose_config("snapkv_kvpress", "64/layer", overrides=["method.params.decode_interval=4"])
    method = validate(cfg)[0]
    claim = claims_of("PrefillDecodingPress_SnapKVPress_window64")[0]
    tally, compressions = KeptTally(), 0
    for case in load_recording(claim.recording).cases:
        if kvpress_n_kept(case.length, case.compression_ratio) != 64:
            continue
        tally.cases += 1
        replay_case(claim, case, "per_layer", tally, method)
        previous = case.length  # the first position decoded since the last compression
        for before, after in zip(case.steps[1:], case.steps[2:], strict=False):  # the decoding forwards
            if len(after[0][0]) < len(before[0][0]) + 1:
                compressions += 1
                newest = set(range(previous, max(after[0][0]) + 1))
                assert len(newest) >= 4 and all(newest <= set(head) for layer in after for head in layer)
                previous = max(after[0][0]) + 1
    assert tally.cases == 2 and compressions == 2 * 5 and tally.differ == 0
    assert tally.same + tally.tied_valid == tally.selections and tally.same >= 2 * 2 * 2 * 5


def test_heads_of_unequal_length_are_scored_on_their_own_tokens() -> None:
    """A ragged layer (an Ada-KV prefill) under a window scorer's decoding press: each head keeps what it keeps when
    it is the only head of its layer -- its softmax never sees another head's padding."""
    method = method_from_yaml("snapkv_kvpress", window=2, decode_interval=1, decode_target=5)
    policy = method.decode_policy
    generator = torch.Generator().manual_seed(5)
    keys, values = torch.randn(2, 2, 12, 8, generator=generator)  # [K/V, H, S, D]
    new_key, new_value = torch.randn(2, 2, 1, 8, generator=generator)
    query = torch.randn(4, 1, 8, generator=generator)  # two query heads per stored head

    def kept(heads: list[int], lengths: list[int]) -> list[list[int]]:
        cache = KVBenchCache(1)
        cache.update(keys[None, heads], values[None, heads], 0)
        layer = cache.headwise_layers[0]
        layer.keep([torch.arange(length) for length in lengths])
        state = policy.new_state()
        state.rotary = lambda positions, dtype: (torch.ones(len(positions), 8), torch.zeros(len(positions), 8))
        policy.start_layer(state, 0, layer, [5] * len(heads))
        cache.update(new_key[None, heads], new_value[None, heads], 0)
        policy.step(state, 0, layer, query[[q for h in heads for q in (2 * h, 2 * h + 1)]], 8**-0.5)
        return [sorted(p.tolist()) for p in layer.positions]

    ragged = kept([0, 1], [12, 7])
    assert [len(head) for head in ragged] == [5, 5]
    assert ragged == kept([0], [12]) + kept([1], [7])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_snapkv_decoding_presses_store_kvpress_cache_order(dtype: str) -> None:
    """SnapKV's decoding presses (``keeps_selection_order``) store each compression's kept tokens in kvpress's cache
    order (``torch.topk``'s, new tokens after them): the model's attention sums over the cache as kvpress's does, so
    the bfloat16 layer inputs -- and every selection, in both dtypes -- are kvpress's (0 differ).  Where no tie parted
    the caches, every layer and head ends holding kvpress's positions in kvpress's order."""
    from tests.methods.decoding_replay import replay_case
    from tests.methods.wrapper_replay import KeptTally
    from tests.parity.kvpress_claims import claims_of

    ordered, same = 0, 0
    for recording in ("DecodingPress_SnapKVPress_interval5", "PrefillDecodingPress_SnapKVPress"):
        claim = claims_of(recording)[0]
        for case in load_recording(recording).cases:
            if case.dtype != dtype:
                continue
            tally = KeptTally()
            cache = replay_case(claim, case, "cr", tally)
            assert tally.differ == 0, (recording, case.inputs, tally)
            same += tally.same
            if tally.tied_valid == 0:
                assert [[p.tolist() for p in layer.positions] for layer in cache.headwise_layers] == case.kept
                ordered += 1
    assert ordered >= 4 and same > 0
