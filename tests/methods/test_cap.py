"""CAP-KV (kvpress's ``CapPress``, issue #58) against NVIDIA/kvpress 0.5.5's recordings: the scores of every recorded
tiny-Llama case equal kvpress's (float32 and bfloat16, from the layer's hidden states as kvpress), and kvbench's
session keeps kvpress's tokens (or another valid top-k of kvpress's scores where they tie at the cut)."""

from __future__ import annotations

from kvbench.eviction.base import build_method
from tests.methods.kvpress_replay import hidden_states_observation, replay


def test_cap_scores_and_keeps_kvpress_tokens() -> None:
    method = build_method({"name": "cap", "family": "cap"})
    tally = replay(method, "CapPress", hidden_states_observation, score_atol=0.0)
    assert tally.cases == 16 and tally.selections == 64 and tally.same + tally.tied_valid == 64
