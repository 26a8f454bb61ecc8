"""kvpress-variant presets of kvbench's existing families against NVIDIA/kvpress 0.5.5's recorded selections
(issue #43 item 9): kvbench's session at kvpress's budget (``<max(1, int(S (1 - ratio)))>/layer``) keeps, per head,
kvpress's tokens or another valid top-k of kvpress's scores where they tie at the cut."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvbench.eviction.base import WindowObservation
from tests.methods.helpers import method_from_yaml
from tests.methods.kvpress_replay import keep_one_layer, model_queries
from tests.reference_recordings import boundary_tie, case_inputs, is_valid_topk, kvpress_n_kept, load_recording


@pytest.mark.parametrize(
    ("preset", "press", "window"),
    [
        ("snapkv_kvpress", "SnapKVPress", 64),
        ("snapkv_kvpress", "SnapKVPress_window16", 16),
        ("tova_kvpress", "TOVAPress", 1),
    ],
)
def test_window_scorer_kvpress_presets_keep_kvpress_tokens(preset: str, press: str, window: int) -> None:
    """Every recorded tiny-Llama case (float32 and bfloat16): the candidates' scores within rounding of kvpress's,
    kept tokens per head the same or a valid top-k where kvpress's scores tie at the cut."""
    method = method_from_yaml(preset, window=window)
    same = tied = 0
    for case in load_recording(press).cases:
        n_kept = kvpress_n_kept(case.length, case.compression_ratio)
        for layer, inputs in enumerate(case_inputs(case)):
            keys, values = inputs["keys"][0], inputs["values"][0]
            queries = model_queries(case, layer, inputs)[:, -window:]
            observation = WindowObservation(layer, 2, queries, keys, values, keys.shape[-1] ** -0.5)
            reference = case.layer_scores(layer)
            ours = method.scorer.score(observation).float()
            if ours.shape[0] != keys.shape[0]:
                ours = ours.view(keys.shape[0], -1, ours.shape[-1]).mean(1)
            # snapkv_kvpress averages the window rows as kvpress's SnapKVPress (issue #54; it summed them before)
            torch.testing.assert_close(ours[:, :-window], reference[:, :-window], atol=1e-3, rtol=1e-2)
            for head, positions in enumerate(keep_one_layer(method, observation, n_kept)):
                if positions == sorted(case.kept[layer][head]):
                    same += 1
                    continue
                assert boundary_tie(reference[head], n_kept), (case.inputs, case.dtype, layer, head)
                assert is_valid_topk(reference[head], positions), (case.inputs, case.dtype, layer, head)
                tied += 1
    assert same + tied == len(load_recording(press).cases) * 4 and same > 0


def test_streamingllm_kvpress_preset_keeps_kvpress_tokens() -> None:
    """``streamingllm_kvpress`` on every recorded tensor case (float32 and bfloat16): kvbench's scores equal
    kvpress's ``StreamingLLMPress.score`` and every head keeps kvpress's tokens, or, at a budget of 4 or fewer (kvpress
    keeps a ``torch.topk`` subset of the tied sinks), another valid top-k of kvpress's scores."""
    method = method_from_yaml("streamingllm_kvpress")
    assert method.decode_policy is None and not method.keep_window
    recording = load_recording("StreamingLLMPress")
    same = tied = small_budget = 0
    for case in recording.cases:
        n_kept = kvpress_n_kept(case.length, case.compression_ratio)
        keys = case_inputs(case)[0]["keys"][0]
        observation = WindowObservation(0, 1, torch.zeros(keys.shape[0], 1, keys.shape[-1]), keys, keys, 0.25)
        reference = case.layer_scores(0)
        ours = method.scorer.score(dataclasses.replace(observation, layer_budget=n_kept))
        assert torch.equal(ours, reference), (case.inputs, case.compression_ratio)
        small_budget += 2 * (n_kept <= 4)
        for head, positions in enumerate(keep_one_layer(method, observation, n_kept)):
            if positions == sorted(case.kept[0][head]):
                same += 1
            else:
                assert boundary_tie(reference[head], n_kept) and is_valid_topk(reference[head], positions), case.inputs
                tied += 1
    assert same + tied == len(recording.cases) * 2 and same > 0
    # 48 cases x 2 heads; at a budget of 4 or fewer (S=16 at 0.75 and 0.875, S=37 at 0.875; 2 dtypes: 12 heads)
    # kvpress keeps sinks 0..3 or a subset of them, kvbench the most recent sinks: the same at 4, a valid top-k below.
    assert (len(recording.cases), same, tied, small_budget) == (48, 92, 4, 12)


def test_streamingllm_preset_of_the_paper_is_unchanged() -> None:
    """``streamingllm`` (the paper's) still protects the last prompt token and ranks by recency: at a budget of 3
    it keeps the most recent sinks and the last token, where the kvpress preset keeps sinks only."""
    keys = torch.randn(2, 16, 8)
    observation = WindowObservation(0, 1, torch.zeros(2, 1, 8), keys, keys, 0.25)
    paper = keep_one_layer(method_from_yaml("streamingllm"), observation, 3)
    kvpress = keep_one_layer(method_from_yaml("streamingllm_kvpress"), observation, 3)
    assert paper == [[2, 3, 15]] * 2 and kvpress == [[1, 2, 3]] * 2
