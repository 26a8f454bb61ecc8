"""ComposedPress (issue #58) against NVIDIA/kvpress 0.5.5's recordings: per case, layer and head, kvbench keeps
kvpress's tokens (or, where kvpress's scores tie at a cut, another valid top-k of them), float32 and bfloat16."""

from __future__ import annotations

import pytest
import torch

from kvbench.eviction.base import WindowObservation, build_method
from tests.methods.kvpress_replay import keep_one_layer, model_queries
from tests.reference_recordings import boundary_tie, case_inputs, is_valid_topk, kvpress_n_kept, load_recording


def observation_of(case, layer: int, inputs: dict, window: int) -> WindowObservation:
    keys, values = inputs["keys"][0], inputs["values"][0]
    queries = model_queries(case, layer, inputs)[:, -window:]
    return WindowObservation(layer, 2, queries, keys, values, keys.shape[-1] ** -0.5)


def same_or_tied(kept: list[int], reference: list[int], scores: torch.Tensor) -> bool:
    """kvpress's kept positions, or another valid top-k of kvpress's scores where they tie at the cut."""
    if kept == sorted(reference):
        return False
    assert len(kept) == len(reference) and boundary_tie(scores, len(kept)) and is_valid_topk(scores, kept)
    return True


@pytest.mark.parametrize(
    ("press", "first", "window"),
    [
        ("ComposedPress_SnapKVPress_KnormPress", "snapkv_kvpress", 64),
        ("ComposedPress_KeyDiffPress_KnormPress", "keydiff", 1),
    ],
)
def test_composed_keeps_kvpress_tokens(press: str, first: str, window: int) -> None:
    """``ComposedPress([first(r), KnormPress(0.5)])`` is ``stages=[first, knorm] ratios=[r]`` at the budget
    ``<max(1, int(n_1 / 2))>/layer``, ``n_1 = max(1, int(S (1 - r)))``."""
    recording = load_recording(press)
    first_press = recording.cases[0].score_calls[0].press
    heads = tied = 0
    for case in recording.cases:
        params = {"stages": [first, "knorm"], "ratios": [case.compression_ratio]}
        method = build_method({"name": "composed", "family": "composed", "params": params})
        n_first = kvpress_n_kept(case.length, case.compression_ratio)
        budget = kvpress_n_kept(n_first, 0.5)
        for layer, inputs in enumerate(case_inputs(case)):
            kept = keep_one_layer(method, observation_of(case, layer, inputs, window), budget)
            first_scores, knorm = case.layer_scores(layer, first_press), case.layer_scores(layer, "KnormPress")
            for head, positions in enumerate(kept):
                heads += 1
                assert len(positions) == budget
                if positions == sorted(case.kept[layer][head]):
                    continue
                # Only where kvpress's top-k picked among equal scores: SnapKV's window (all scored its maximum)
                # when the first stage keeps fewer than the window, or a tie at either cut.
                window_tie = first == "snapkv_kvpress" and n_first < window
                assert window_tie or boundary_tie(first_scores[head], n_first) or boundary_tie(knorm[head], budget)
                tied += 1
    # SnapKV's window is scored its maximum: at n_1 = 64 (ratio 0.5) the window ties with the best candidate.
    assert heads == len(recording.cases) * 4 and tied <= heads // 8, (heads, tied)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"stages": ["knorm", "dms"], "ratios": [0.5]}, "evicts by a threshold"),
        ({"stages": ["ada_snapkv", "knorm"], "ratios": [0.5]}, "allocates its own budgets"),
        ({"stages": ["knorm", "observed_attention"], "ratios": [0.5]}, "reads the prompt rows"),
        ({"stages": ["knorm", "nosuch"], "ratios": [0.5]}, "neither a method preset"),
        ({"stages": ["knorm", "keydiff"], "ratios": []}, "one ratio in"),
    ],
)
def test_a_stage_that_does_not_compose_is_refused_by_name(params: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_method({"name": "composed", "family": "composed", "params": params})
