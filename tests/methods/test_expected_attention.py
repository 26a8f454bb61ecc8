"""Expected Attention against NVIDIA/kvpress's ``ExpectedAttentionPress`` (0.5.5, defaults, on the tiny Llama's
recorded prefill): float32 scores to rounding, bfloat16 scores to 1e-3, the same kept tokens (module docstring of
``kvbench/methods/expected_attention.py``: kvbench un-rotates the post-RoPE queries instead of recomputing them)."""

from __future__ import annotations

import torch

from kvbench.methods.base import build_method
from kvbench.methods.expected_attention import average_rotation, rotate_half, unrotate
from tests.methods.kvpress_replay import replay, rotary_observation
from tests.reference_recordings import load_recording


def test_expected_attention_scores_and_selections_match_kvpress_in_float32() -> None:
    """The float32 cases: scores within 1e-6 of kvpress's, kept tokens per head the same."""
    method = build_method({"name": "expected_attention", "family": "expected_attention"})
    tally = replay(method, "ExpectedAttentionPress", rotary_observation, score_atol=1e-6, dtypes=("float32",))
    assert tally.cases == 8 and tally.same + tally.tied_valid == tally.selections == 32


def test_expected_attention_in_bfloat16_keeps_kvpress_tokens() -> None:
    """The bfloat16 cases: scores within 1e-3 of kvpress's (un-rotated queries round differently from ``q_proj``'s),
    kept tokens per head the same or, where kvpress's bfloat16 scores tie at the cut, another valid top-k."""
    method = build_method({"name": "expected_attention", "family": "expected_attention"})
    tally = replay(method, "ExpectedAttentionPress", rotary_observation, score_atol=1e-3, dtypes=("bfloat16",))
    assert tally.cases == 8 and tally.same + tally.tied_valid == tally.selections == 32


def test_unrotate_inverts_the_rotation_and_the_average_rotation_is_its_mean() -> None:
    """``unrotate`` undoes ``x cos + rotate_half(x) sin``; the averaged matrix applied to a vector is the mean of
    the rotated vectors."""
    generator = torch.Generator().manual_seed(0)
    states = torch.randn(2, 5, 8, generator=generator)
    angles = torch.rand(5, 4, generator=generator) * 6
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    rotated = states * cos + rotate_half(states) * sin
    torch.testing.assert_close(unrotate(rotated, cos, sin), states)
    vector = states[0, 0]
    expected = (vector * cos + rotate_half(vector) * sin).mean(0)
    torch.testing.assert_close(vector @ average_rotation(cos, sin).T, expected)
    assert load_recording("ExpectedAttentionPress").cases[0].settings["n_future_positions"] == 512
