"""LagKV against NVIDIA/kvpress's ``LagKVPress`` (0.5.5): the recency fallback below ``n_sink + 2 lag_size`` tokens,
the lag path (S=300 with the defaults; every length with ``lag_size=16``), and the same kept tokens (a valid top-k
of kvpress's rank scores where they tie)."""

from __future__ import annotations

import pytest
import torch

from kvbench.eviction.base import build_method
from tests.methods.kvpress_replay import keys_values_observation, replay
from tests.reference_recordings import load_recording


@pytest.mark.parametrize(("press", "lag_size"), [("LagKVPress", 128), ("LagKVPress_lag16", 16)])
def test_lagkv_scores_and_selections_match_kvpress(press: str, lag_size: int) -> None:
    """Every recorded case: scores bit for bit, kept tokens per head (a valid top-k where rank scores tie)."""
    method = build_method({"name": "lagkv", "family": "lagkv", "params": {"lag_size": lag_size}})
    tally = replay(method, press)
    assert tally.max_score_error == 0.0
    assert tally.same + tally.tied_valid == tally.selections > 0
    if lag_size == 16:
        assert tally.tied_valid > 0  # rank scores tie across partitions: the comparison is really by top-k


def test_short_contexts_keep_the_most_recent_tokens_as_kvpress() -> None:
    """Below ``n_sink + 2 lag_size`` kvpress scores a ramp: sinks 1, then increasing with position."""
    case = load_recording("LagKVPress").cases[0]
    keys = torch.randn(2, 64, 16)
    scores = build_method({"name": "lagkv", "family": "lagkv"}).scorer.score(
        keys_values_observation(case, 0, {"keys": keys[None], "values": keys[None]})
    )
    assert torch.equal(scores[:, :4], torch.ones(2, 4))
    assert bool((scores[:, 5:] > scores[:, 4:-1]).all())
