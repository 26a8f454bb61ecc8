"""kvpress-variant presets of kvbench's existing families against NVIDIA/kvpress 0.5.5's recorded selections
(issue #43 item 9): kvbench's session at kvpress's budget (``<max(1, int(S (1 - ratio)))>/layer``) keeps, per head,
kvpress's tokens or another valid top-k of kvpress's scores where they tie at the cut."""

from __future__ import annotations

import pytest
import torch

from kvbench.methods.base import WindowObservation
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
            # kvbench sums the window rows where kvpress averages them: the same ranking, scaled by the window
            torch.testing.assert_close(ours[:, :-window] / window, reference[:, :-window], atol=1e-3, rtol=1e-2)
            for head, positions in enumerate(keep_one_layer(method, observation, n_kept)):
                if positions == sorted(case.kept[layer][head]):
                    same += 1
                    continue
                assert boundary_tie(reference[head], n_kept), (case.inputs, case.dtype, layer, head)
                assert is_valid_topk(reference[head], positions), (case.inputs, case.dtype, layer, head)
                tied += 1
    assert same + tied == len(load_recording(press).cases) * 4 and same > 0


def test_streamingllm_kvpress_preset_keeps_kvpress_tokens() -> None:
    """``streamingllm_kvpress`` on every recorded tensor case (float32 and bfloat16): kvpress's tokens above a budget
    of 4; at 4 or fewer (the preset's documented difference) kvbench keeps the last token and the latest sinks where
    kvpress keeps sinks only."""
    method = method_from_yaml("streamingllm_kvpress")
    assert method.decode_policy is None
    same = tied = small_budget = 0
    for case in load_recording("StreamingLLMPress").cases:
        n_kept = kvpress_n_kept(case.length, case.compression_ratio)
        keys = case_inputs(case)[0]["keys"][0]
        observation = WindowObservation(0, 1, torch.zeros(keys.shape[0], 1, keys.shape[-1]), keys, keys, 0.25)
        reference = case.layer_scores(0)
        for head, positions in enumerate(keep_one_layer(method, observation, n_kept)):
            if n_kept <= 4:
                assert set(case.kept[0][head]) <= {0, 1, 2, 3}, case.inputs
                latest_sinks = list(range(4 - (n_kept - 1), 4))
                assert positions == [*latest_sinks, case.length - 1], (case.inputs, positions)
                small_budget += 1
            elif positions == sorted(case.kept[0][head]):
                same += 1
            else:
                assert boundary_tie(reference[head], n_kept) and is_valid_topk(reference[head], positions), case.inputs
                tied += 1
    assert same + tied + small_budget == len(load_recording("StreamingLLMPress").cases) * 2
    assert small_budget == 3 * 2 * 2  # (S=16 at 0.75 and 0.875, S=37 at 0.875) x 2 dtypes x 2 heads
