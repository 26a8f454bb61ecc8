"""PerLayerCompressionPress (issue #58) against NVIDIA/kvpress 0.5.5's recordings: per case, layer and head, kvbench
keeps kvpress's tokens (or, where kvpress's scores tie at the cut, another valid top-k of them), float32 and bfloat16;
the budget sets the size and the ratios its profile over the layers."""

from __future__ import annotations

import json

import pytest

from kvbench.budget import parse_budget
from kvbench.methods.per_layer import PerLayerRatioAllocator
from tests.methods.kvpress_replay import keep_one_layer
from tests.methods.wrapper_replay import KeptTally, cases_in, recent_queries_observation
from tests.parity.kvpress_claims import Claim, claim_of
from tests.reference_recordings import boundary_tie, case_inputs, is_valid_topk, kvpress_n_kept, load_recording

RECORDINGS = ["PerLayerCompressionPress_KnormPress", "PerLayerCompressionPress_SnapKVPress"]


def replay_per_layer(claim: Claim, form: str, dtype: str) -> KeptTally:
    """``PerLayerCompressionPress(press, compression_ratios=[c_0, c_1])`` at the budget ``<mean c>cr`` (``form``: only
    ``cr``), every case of the claim's recording in ``dtype``: layer ``l`` keeps kvpress's ``max(1, int(S (1 - c_l)))``
    tokens per head (asserted), per head kvpress's tokens, another valid top-k of its scores tied at the cut, or
    different."""
    assert form == "cr", form
    window = dict(claim.knobs).get("window", 1)  # the observation window of the wrapped press's queries
    tally = KeptTally()
    for case in cases_in(claim.recording, dtype, tally):
        ratios = json.loads(case.settings["compression_ratios"])  # the recorder wrote the list's repr
        allocator = PerLayerRatioAllocator(ratios)
        mean = sum(ratios) / len(ratios)
        plan = allocator.start_sample(parse_budget(f"{mean!r}cr"), 2, case.length).budgets
        assert plan == [kvpress_n_kept(case.length, ratio) for ratio in ratios], (case.inputs, ratios)
        method = claim.build(compression_ratios=ratios)
        for layer, inputs in enumerate(case_inputs(case)):
            kept = keep_one_layer(method, recent_queries_observation(case, layer, inputs, window), plan[layer])
            scores = case.layer_scores(layer)
            for head, positions in enumerate(kept):
                reference = sorted(case.kept[layer][head])
                if positions == reference:
                    tally.same += 1
                elif len(positions) == len(reference) and is_valid_topk(scores[head], positions):
                    tied = boundary_tie(scores[head], len(positions))
                    tally.tied_valid += tied
                    tally.differ += not tied
                else:
                    tally.differ += 1
    return tally


@pytest.mark.parametrize("press", RECORDINGS)
def test_per_layer_compression_keeps_kvpress_tokens(press: str) -> None:
    tallies = [replay_per_layer(claim_of(press), "cr", dtype) for dtype in ("float32", "bfloat16")]
    heads, tied = sum(t.selections for t in tallies), sum(t.tied_valid for t in tallies)
    assert all(t.differ == 0 for t in tallies), tallies
    # SnapKV: layer 1 keeps fewer than the 64-token window at ratios >= 0.5 (kvpress keeps any of the tied window)
    limit = heads // 3 if press.endswith("SnapKVPress") else 0
    assert heads == len(load_recording(press).cases) * 4 and tied <= limit, tied


def test_per_layer_budgets_follow_the_budget_with_the_ratios_profile() -> None:
    """``64L`` keeps 64 per layer on average, more where the ratio is low; a ratio list of the wrong length is an
    error naming both counts."""
    allocator = PerLayerRatioAllocator([0.25, 0.5, 0.75])
    assert allocator.start_sample(parse_budget("64L"), 3, 1000).budgets == [96, 64, 32]
    assert allocator.start_sample(parse_budget("0.5cr"), 3, 101).budgets == [75, 50, 25]  # kvpress's int(S (1 - c))
    with pytest.raises(ValueError, match="3 ratios for a model with 4"):
        allocator.start_sample(parse_budget("64L"), 4, 1000)
