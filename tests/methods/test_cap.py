"""CAP-KV (kvpress's ``CapPress``, issue #58) against NVIDIA/kvpress 0.5.5's recordings: the scores of every recorded
tiny-Llama case equal kvpress's (float32 and bfloat16, from the layer's hidden states as kvpress), and kvbench's
session keeps kvpress's tokens (or another valid top-k of kvpress's scores where they tie at the cut)."""

from __future__ import annotations

from tests.methods.kvpress_replay import hidden_states_observation, replay
from tests.methods.wrapper_replay import KeptTally
from tests.parity.kvpress_claims import Claim, claim_of


def replay_cap(claim: Claim, form: str, dtype: str) -> KeptTally:
    """Every case of the claim's recording (``CapPress``) in ``dtype`` at ``budget=<max(1, int(S (1 - r)))>/layer``
    (``form``: only ``per_layer``): scores equal to kvpress's bit for bit (asserted), per layer and head kvpress's
    tokens, another valid top-k of its scores tied at the cut, or different."""
    assert form == "per_layer", form
    replayed = replay(
        claim.build(), claim.recording, hidden_states_observation, score_atol=0.0, dtypes=(dtype,), strict=False
    )
    differ = replayed.selections - replayed.same - replayed.tied_valid
    return KeptTally(replayed.cases, replayed.same, replayed.tied_valid, differ)


def test_cap_scores_and_keeps_kvpress_tokens() -> None:
    tallies = [replay_cap(claim_of("CapPress"), "per_layer", dtype) for dtype in ("float32", "bfloat16")]
    assert sum(t.cases for t in tallies) == 16 and sum(t.selections for t in tallies) == 64
    assert all(t.differ == 0 for t in tallies), tallies
