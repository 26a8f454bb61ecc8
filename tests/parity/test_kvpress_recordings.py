"""The recorded kvpress outputs (tests/fixtures/reference/kvpress/) are whole and self-consistent.

These tests check the fixtures and their loader (``tests/reference_recordings.py``), not a kvbench method: the inputs
load and match the checksums each recording names, the seeded tensors regenerate from the recorded seed, this
interpreter's transformers reproduces the tiny Llama's layer inputs from the stored weights, every kept set respects
kvpress's budget, and for the presses whose selection is a plain top-k of ``score()`` the kept set is a top-k of the
recorded scores. They also pin down RandomPress's seeding, which kvbench's Random method must reproduce.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from tests.reference_recordings import (
    DTYPES,
    case_inputs,
    checksum,
    inputs_meta,
    is_valid_topk,
    kvpress_n_kept,
    load_recording,
    recorded_presses,
    regenerate_tensor_inputs,
    stored_input,
    tiny_llama_weights,
)

PRESSES = recorded_presses()

# Presses whose kept set per layer and head is ``score().topk(k)`` of the named scorer's output (k per head from the
# kept list: PyramidKV's layer budgets differ from the uniform one).
TOPK_OF_SCORER = {
    "KnormPress": "KnormPress",
    "RandomPress": "RandomPress",
    "RandomPress_seed_None": "RandomPress",
    "ExpectedAttentionPress": "ExpectedAttentionPress",
    "KeyDiffPress": "KeyDiffPress",
    "LagKVPress": "LagKVPress",
    "LagKVPress_lag16": "LagKVPress",
    "NonCausalAttnPress": "NonCausalAttnPress",
    "LeverageScorePress": "LeverageScorePress",
    "CompactorPress": "CompactorPress",
    "CURPress": "CURPress",
    "QFilterPress_seeded_filters": "SeededQFilterPress",
    "SnapKVPress": "SnapKVPress",
    "SnapKVPress_window16": "SnapKVPress",
    "StreamingLLMPress": "StreamingLLMPress",
    "TOVAPress": "TOVAPress",
    "PyramidKVPress": "PyramidKVPress",
    "PyramidKVPress_window16": "PyramidKVPress",
    "ObservedAttentionPress": "ObservedAttentionPress",
    "CriticalKVPress_KnormPress": "CriticalKVPress",
    "CriticalKVPress_SnapKVPress": "CriticalKVPress",
}
# Presses that keep a different number of tokens per layer or head (checked by their totals below).
PER_LAYER_BUDGET = {"PyramidKVPress", "PyramidKVPress_window16"}
PER_HEAD_BUDGET = {"AdaKVPress_KnormPress", "AdaKVPress_SnapKVPress", "AdaKVPress_ExpectedAttentionPress"}
PER_HEAD_BUDGET |= {"CriticalAdaKVPress_SnapKVPress"}
DECODING = {"DecodingPress_KnormPress", "DecodingPress_KnormPress_buffer0", "CompressionRatioDecodingPress_KnormPress"}
DECODING |= {"PrefillDecodingPress_KnormPress"}
DECODING |= {"CAMPress_KnormPress"}
# Issue #58: DMS keeps what scores at least its threshold (per head), ComposedPress its last press's share of what the
# first kept, PerLayerCompressionPress one ratio per layer.
THRESHOLD = {"DMSPress_KnormPress", "DMSPress_SnapKVPress", "DMSPress_KnormPress_decoding"}
COMPOSED = {"ComposedPress_SnapKVPress_KnormPress", "ComposedPress_KeyDiffPress_KnormPress"}
PER_LAYER_RATIOS = {"PerLayerCompressionPress_KnormPress", "PerLayerCompressionPress_SnapKVPress"}
# LU-KV: per-head counts from its (seeded) curve, between 1 and S (checked against the curve in test_lukv.py).
CURVE_BUDGET = {"LUKVPress_KnormPress_seeded_curve", "LUKVPress_ExpectedAttentionPress_seeded_curve"}
# KVCompose: one budget over every layer (structured: int(L S (1 - c)) over layers, each head of a layer alike;
# unstructured: int(L H S (1 - c)) over every layer and head).
OVER_LAYERS = {"KVComposePress", "KVComposePress_unstructured"}


def test_kvcompose_keeps_its_budget_over_the_layers() -> None:
    for press in sorted(OVER_LAYERS):
        for case in load_recording(press).cases:
            counts = [[len(h) for h in heads] for heads in case.kept]
            layers, kv_heads = len(counts), len(counts[0])
            if press == "KVComposePress":
                assert all(len(set(row)) == 1 for row in counts), (press, case.inputs)
                assert sum(row[0] for row in counts) == kvpress_n_kept(layers * case.length, case.compression_ratio)
            else:
                total = kvpress_n_kept(layers * kv_heads * case.length, case.compression_ratio)
                assert sum(map(sum, counts)) == total, (press, case.inputs)


# ChunkKV keeps whole chunks: max(1, int(n_chunks * (1 - ratio))) of them, the last chunk possibly partial.
CHUNKED = {"ChunkKVPress_KnormPress", "ChunkKVPress_SnapKVPress"}


def test_the_recordings_cover_the_issue_presses() -> None:
    wanted = {"KnormPress", "RandomPress", "ExpectedAttentionPress", "KeyDiffPress", "LagKVPress", "SnapKVPress"}
    wanted |= {
        "ChunkKVPress_KnormPress",
        "BlockPress_KeyDiffPress",
        "AdaKVPress_KnormPress",
        "DecodingPress_KnormPress",
    }
    assert wanted <= set(PRESSES)
    assert set(TOPK_OF_SCORER) | PER_HEAD_BUDGET | DECODING <= set(PRESSES)


def test_an_unknown_recording_names_the_recorded_ones() -> None:
    with pytest.raises(ValueError, match="KnormPress"):
        load_recording("NoSuchPress")


@pytest.mark.parametrize("press", PRESSES)
def test_recording_parses_and_its_inputs_match_their_checksums(press: str) -> None:
    recording = load_recording(press)
    assert recording.versions["kvpress"].startswith("0.5.")
    assert tuple(int(x) for x in recording.versions["transformers"].split(".")[:2]) < (5, 3)
    assert recording.cases
    for name, expected in recording.inputs_checksums.items():
        assert checksum(stored_input(name)) == expected, name
    for case in recording.cases:
        layers = case_inputs(case)
        assert len(layers) == len(case.kept)
        for tensors in layers:
            assert tensors["keys"].dtype == DTYPES[case.dtype]
            assert tensors["keys"].shape[2] == case.length


def test_tensor_inputs_regenerate_from_the_recorded_seed() -> None:
    for name, tensor in regenerate_tensor_inputs().items():
        assert torch.equal(tensor, stored_input(name)), name


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_this_transformers_reproduces_the_tiny_llama_layer_inputs(attn: str) -> None:
    """The stored weights in this interpreter's transformers give the recorded keys (float32, tight tolerance)."""
    meta = inputs_meta()
    model = LlamaForCausalLM(LlamaConfig(**meta["model_config"], attn_implementation=attn))
    model.load_state_dict(tiny_llama_weights(torch.float32), strict=False)
    model.eval()
    for length in meta["model_lengths"]:
        prefix = f"model/{attn}/float32/S{length}"
        cache = DynamicCache()
        with torch.no_grad():
            model.model(input_ids=stored_input(f"{prefix}/input_ids"), past_key_values=cache)
        for layer in range(meta["model_config"]["num_hidden_layers"]):
            recorded = stored_input(f"{prefix}/layer{layer}/keys")
            torch.testing.assert_close(cache.layers[layer].keys, recorded, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("press", PRESSES)
def test_kept_positions_respect_kvpress_budget(press: str) -> None:
    for case in load_recording(press).cases:
        for layer, heads in enumerate(case.kept):
            for positions in heads:
                assert len(set(positions)) == len(positions)
                assert min(positions) >= 0
            if press in DECODING:
                assert len({len(h) for h in heads}) == 1
                continue
            if press in THRESHOLD:  # the sliding window kept; the kept fraction is kvpress's measured ratio
                window = case.settings["sliding_window_size"]
                assert all(min(case.length, window) <= len(h) for h in heads), (case.inputs, layer)
                continue
            assert max(max(h) for h in heads) < case.length
            budget = kvpress_n_kept(case.length, case.compression_ratio)
            if press == "ChunkPress_KnormPress":
                _check_per_chunk_budget(heads, case.length, case.compression_ratio, case.settings["chunk_length"])
            elif press in CHUNKED:
                _check_whole_chunks(heads, case.length, case.compression_ratio, case.settings["chunk_length"])
            elif press in COMPOSED:
                assert [len(h) for h in heads] == [kvpress_n_kept(budget, 0.5)] * len(heads), (case.inputs, layer)
            elif press in OVER_LAYERS:
                continue  # test_kvcompose_keeps_its_budget_over_the_layers
            elif press in CURVE_BUDGET:
                assert all(1 <= len(h) <= case.length for h in heads), (case.inputs, layer)
            elif press in PER_LAYER_RATIOS:
                ratio = json.loads(case.settings["compression_ratios"])[layer]
                assert [len(h) for h in heads] == [kvpress_n_kept(case.length, ratio)] * len(heads)
            elif press in PER_HEAD_BUDGET:
                assert sum(len(h) for h in heads) == budget * len(heads)
            elif press not in PER_LAYER_BUDGET:
                assert [len(h) for h in heads] == [budget] * len(heads), (case.inputs, layer)


def _check_per_chunk_budget(heads: list[list[int]], length: int, ratio: float, chunk: int) -> None:
    """ChunkPress: every chunk keeps ``max(1, int(chunk_size * (1 - ratio)))`` of its own tokens, on every head."""
    for positions in heads:
        for start in range(0, length, chunk):
            size = min(chunk, length - start)
            kept_here = [p for p in positions if start <= p < start + chunk]
            assert len(kept_here) == max(1, int(size * (1 - ratio))), (start, size)


def _check_whole_chunks(heads: list[list[int]], length: int, ratio: float, chunk: int) -> None:
    """Every KV head keeps the same sorted positions, made of whole chunks, as many as kvpress's chunk budget."""
    assert all(h == heads[0] for h in heads)
    assert heads[0] == sorted(heads[0])
    n_chunks = -(-length // chunk)
    if length < chunk:  # no complete chunk: ChunkKV falls back to the wrapped press's own compress
        assert len(heads[0]) == kvpress_n_kept(length, ratio)
        return
    chunks = {p // chunk for p in heads[0]}
    assert len(chunks) == max(1, int(n_chunks * (1 - ratio)))
    assert set(heads[0]) == {p for c in chunks for p in range(c * chunk, min((c + 1) * chunk, length))}


@pytest.mark.parametrize("press", sorted(TOPK_OF_SCORER))
def test_kept_sets_are_topk_of_the_recorded_scores(press: str) -> None:
    scorer = TOPK_OF_SCORER[press]
    for case in load_recording(press).cases:
        for layer, heads in enumerate(case.kept):
            scores = case.layer_scores(layer, scorer)
            for head, positions in enumerate(heads):
                assert is_valid_topk(scores[head], positions), (case.inputs, case.dtype, layer, head)


def _rand_like_kvpress(length: int, heads: int, dtype: torch.dtype, generator=None) -> torch.Tensor:
    return torch.rand(1, heads, length, generator=generator, dtype=dtype).float()[0]


def test_random_press_seeds_a_fresh_generator_on_every_score_call() -> None:
    """RandomPress(seed=s): each score() call draws torch.rand(B, H_kv, S, dtype=keys.dtype) from a new CPU generator
    seeded with s, so every layer gets the same scores."""
    for case in load_recording("RandomPress").cases:
        assert case.settings["seed"] == 0
        for layer in range(len(case.kept)):
            scores = case.layer_scores(layer)
            expected = _rand_like_kvpress(
                case.length, scores.shape[0], DTYPES[case.dtype], torch.Generator().manual_seed(0)
            )
            assert torch.equal(scores, expected)


def test_random_press_without_seed_draws_from_the_global_generator_layer_by_layer() -> None:
    """RandomPress(seed=None) draws from torch's global generator: layer 0 first, then layer 1 (recorded after
    torch.manual_seed of the recording's global seed)."""
    global_seed = inputs_meta()["seeds"]["global"]
    state = torch.random.get_rng_state()
    try:
        for case in load_recording("RandomPress_seed_None").cases:
            torch.manual_seed(global_seed)
            for layer in range(len(case.kept)):
                scores = case.layer_scores(layer)
                assert torch.equal(scores, _rand_like_kvpress(case.length, scores.shape[0], DTYPES[case.dtype]))
    finally:
        torch.random.set_rng_state(state)


def test_is_valid_topk_accepts_ties_and_rejects_a_lower_score() -> None:
    scores = torch.tensor([0.1, 0.5, 0.5, 0.9])
    assert is_valid_topk(scores, [3, 1])
    assert is_valid_topk(scores, [2, 3])
    assert not is_valid_topk(scores, [0, 3])
    assert not is_valid_topk(scores, [3, 3])
