"""Compactor against NVIDIA/kvpress's ``CompactorPress`` (0.5.5, chunk_size 32, blending = the case's compression
ratio as kvpress's default, on the tiny Llama's recorded prefill; the leverage sketch from the global generator)."""

from __future__ import annotations

import torch

from kvbench.methods.base import WindowObservation, build_method
from tests.methods.kvpress_replay import replay, rotary_observation


def compactor_for(case):
    params = {"chunk_size": 32, "blending": case.compression_ratio}
    return build_method({"name": "compactor", "family": "compactor", "params": params})


def reseed(_case) -> None:
    torch.manual_seed(1234)  # what the recorder did before every case


def test_compactor_scores_and_selections_match_kvpress_in_float32() -> None:
    """Float32: the ``CompactorPress`` scores within 1e-5, kept tokens per head the same or a valid top-k at a tie."""
    tally = replay(compactor_for, "CompactorPress", rotary_observation, score_atol=1e-5, before_case=reseed,
                   score_press="CompactorPress", dtypes=("float32",))  # fmt: skip
    assert tally.cases == 8 and tally.same + tally.tied_valid == tally.selections == 32


def test_compactor_in_bfloat16_is_close_to_kvpress() -> None:
    """Bfloat16: scores agree to 0.1 (un-rotated keys round differently) and most kept sets (measured: 31 of 32)
    are kvpress's or a valid top-k."""
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
