"""ComposedPress (issue #58) against NVIDIA/kvpress 0.5.5's recordings: per case, layer and head, kvbench keeps
kvpress's tokens (or, where kvpress's scores tie at a cut, another valid top-k of them), float32 and bfloat16."""

from __future__ import annotations

import pytest

from kvbench.eviction.base import build_method
from tests.methods.kvpress_replay import keep_one_layer
from tests.methods.wrapper_replay import KeptTally, cases_in, recent_queries_observation
from tests.parity.kvpress_claims import Claim, claim_of
from tests.reference_recordings import boundary_tie, case_inputs, kvpress_n_kept, load_recording

#: The observation window of the first stage's queries (its preset's window).
FIRST_WINDOW = {"snapkv_kvpress": 64, "keydiff": 1}
RECORDINGS = ["ComposedPress_SnapKVPress_KnormPress", "ComposedPress_KeyDiffPress_KnormPress"]


def replay_composed(claim: Claim, form: str, dtype: str) -> KeptTally:
    """``ComposedPress([first(r), KnormPress(0.5)])`` is the claim's ``stages=[first, knorm] ratios=[r]`` at the budget
    ``<max(1, int(n_1 / 2))>/layer``, ``n_1 = max(1, int(S (1 - r)))`` (``form``: only ``per_layer``), every case of the
    claim's recording in ``dtype``: per layer and head the same tokens as kvpress, another choice where kvpress's top-k
    picked among equal scores (SnapKV's window, all scored its maximum, when the first stage keeps fewer than the
    window; a tie at either cut), or different."""
    assert form == "per_layer", form
    first = dict(claim.knobs)["stages"][0]
    window = FIRST_WINDOW[first]
    recording = load_recording(claim.recording)
    first_press = recording.cases[0].score_calls[0].press
    tally = KeptTally()
    for case in cases_in(claim.recording, dtype, tally):
        method = claim.build(ratios=[case.compression_ratio])
        n_first = kvpress_n_kept(case.length, case.compression_ratio)
        budget = kvpress_n_kept(n_first, 0.5)
        for layer, inputs in enumerate(case_inputs(case)):
            kept = keep_one_layer(method, recent_queries_observation(case, layer, inputs, window), budget)
            first_scores, knorm = case.layer_scores(layer, first_press), case.layer_scores(layer, "KnormPress")
            for head, positions in enumerate(kept):
                if positions == sorted(case.kept[layer][head]):
                    tally.same += 1
                    continue
                window_tie = first == "snapkv_kvpress" and n_first < window
                tie = window_tie or boundary_tie(first_scores[head], n_first) or boundary_tie(knorm[head], budget)
                tied = tie and len(positions) == budget
                tally.tied_valid += tied
                tally.differ += not tied
    return tally


@pytest.mark.parametrize("press", RECORDINGS)
def test_composed_keeps_kvpress_tokens(press: str) -> None:
    tallies = [replay_composed(claim_of(press), "per_layer", dtype) for dtype in ("float32", "bfloat16")]
    heads = sum(t.selections for t in tallies)
    tied = sum(t.tied_valid for t in tallies)
    assert all(t.differ == 0 for t in tallies), tallies
    # SnapKV's window is scored its maximum: at n_1 = 64 (ratio 0.5) the window ties with the best candidate.
    assert heads == len(load_recording(press).cases) * 4 and tied <= heads // 8, (heads, tied)


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
