"""Compactor against NVIDIA/kvpress's ``CompactorPress`` (0.5.5, chunk_size 32, blending = the case's compression
ratio as kvpress's default, on the tiny Llama's recorded prefill; the leverage sketch from the global generator).

The leverage part's pre-RoPE keys come from the layer's recorded hidden states through its ``k_proj`` (what a model
path gives): scores bit for bit and kvpress's kept tokens in float32 and bfloat16.  The fallback without hidden
states (the stored keys un-rotated) is close in float32 and counted in bfloat16.
"""

from __future__ import annotations

import torch

from kvbench.eviction.base import WindowObservation, build_method
from tests.methods.kvpress_replay import hidden_states_observation, replay, rotary_observation


def compactor_for(case):
    params = {"chunk_size": 32, "blending": case.compression_ratio}
    return build_method({"name": "compactor", "family": "compactor", "params": params})


def reseed(_case) -> None:
    torch.manual_seed(1234)  # what the recorder did before every case


def test_compactor_scores_and_selections_match_kvpress_exactly() -> None:
    """From hidden states, float32 and bfloat16: the ``CompactorPress`` scores equal to kvpress's, kept tokens per
    head the same or a valid top-k at a tie (measured: 52 same, 12 at an exact tie, 0 differ of 64)."""
    tally = replay(compactor_for, "CompactorPress", hidden_states_observation, score_atol=0.0, before_case=reseed,
                   score_press="CompactorPress")  # fmt: skip
    assert tally.cases == 16 and tally.same + tally.tied_valid == tally.selections == 64
    assert tally.max_score_error == 0.0


def test_unrotated_fallback_is_close_to_kvpress() -> None:
    """Without hidden states: float32 scores within 1e-5, every kept set kvpress's or a valid top-k; bfloat16 scores
    agree to 0.1 (un-rotated keys round differently) and most kept sets (measured: 31 of 32) are kvpress's or a
    valid top-k."""
    tally = replay(compactor_for, "CompactorPress", rotary_observation, score_atol=1e-5, before_case=reseed,
                   score_press="CompactorPress", dtypes=("float32",))  # fmt: skip
    assert tally.cases == 8 and tally.same + tally.tied_valid == tally.selections == 32
    tally = replay(compactor_for, "CompactorPress", rotary_observation, score_atol=0.1, before_case=reseed,
                   score_press="CompactorPress", dtypes=("bfloat16",), strict=False)  # fmt: skip
    assert tally.cases == 8 and tally.same + tally.tied_valid >= 0.9 * tally.selections


def test_blending_defaults_to_the_ratio_the_layer_budget_keeps() -> None:
    """``blending: null``: ``1 - budget / S`` (kvpress's compression ratio), 0.35 without a layer budget."""
    scorer = build_method({"name": "compactor", "family": "compactor"}).scorer
    keys = torch.zeros(2, 200, 16)
    observation = WindowObservation(0, 1, keys[:, -1:], keys, keys, 0.25)
    assert scorer.blending_weight(observation) == 0.35
    observation.layer_budget = 50
    assert scorer.blending_weight(observation) == 0.75
