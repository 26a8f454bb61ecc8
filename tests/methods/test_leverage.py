"""Leverage scores against NVIDIA/kvpress's ``LeverageScorePress`` (0.5.5, on the tiny Llama's recorded prefill, the
sketch drawn from the global generator after the recorder's ``torch.manual_seed(1234)``)."""

from __future__ import annotations

import torch

from kvbench.methods.base import build_method
from tests.methods.kvpress_replay import replay, rotary_observation


def reseed(_case) -> None:
    torch.manual_seed(1234)  # what the recorder did before every case


def test_leverage_scores_and_selections_match_kvpress_in_float32() -> None:
    """Float32: scores within 1e-5 (un-rotated keys instead of ``k_proj``'s), kept tokens per head the same or a
    valid top-k at a tie."""
    method = build_method({"name": "leverage", "family": "leverage"})
    tally = replay(method, "LeverageScorePress", rotary_observation, score_atol=1e-5, before_case=reseed,
                   dtypes=("float32",))  # fmt: skip
    assert tally.cases == 8 and tally.same + tally.tied_valid == tally.selections == 32


def test_leverage_in_bfloat16_is_close_to_kvpress() -> None:
    """Bfloat16: the un-rotated keys round differently from ``k_proj``'s, so scores agree to 0.1 and most (measured:
    28 of 32) kept sets are kvpress's or a valid top-k."""
    method = build_method({"name": "leverage", "family": "leverage"})
    tally = replay(method, "LeverageScorePress", rotary_observation, score_atol=0.1, before_case=reseed,
                   dtypes=("bfloat16",), strict=False)  # fmt: skip
    assert tally.cases == 8 and tally.same + tally.tied_valid >= 0.8 * tally.selections
