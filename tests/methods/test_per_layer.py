"""PerLayerCompressionPress (issue #58) against NVIDIA/kvpress 0.5.5's recordings: per case, layer and head, kvbench
keeps kvpress's tokens (or, where kvpress's scores tie at the cut, another valid top-k of them), float32 and bfloat16;
the budget sets the size and the ratios its profile over the layers."""

from __future__ import annotations

import json

import pytest

from kvbench.budget import parse_budget
from kvbench.eviction.base import build_method
from kvbench.methods.per_layer import PerLayerRatioAllocator
from tests.methods.kvpress_replay import keep_one_layer
from tests.methods.test_composed import observation_of, same_or_tied
from tests.reference_recordings import case_inputs, kvpress_n_kept, load_recording


@pytest.mark.parametrize(
    ("press", "family", "window"),
    [
        ("PerLayerCompressionPress_KnormPress", "knorm", 1),
        ("PerLayerCompressionPress_SnapKVPress", "snapkv_kvpress", 64),
    ],
)
def test_per_layer_compression_keeps_kvpress_tokens(press: str, family: str, window: int) -> None:
    """``PerLayerCompressionPress(press, compression_ratios=[c_0, c_1])`` at the budget ``<mean c>cr``: layer ``l``
    keeps kvpress's ``max(1, int(S (1 - c_l)))`` tokens per head, kvpress's tokens."""
    recording = load_recording(press)
    heads = tied = 0
    for case in recording.cases:
        ratios = json.loads(case.settings["compression_ratios"])  # the recorder wrote the list's repr
        allocator = PerLayerRatioAllocator(ratios)
        mean = sum(ratios) / len(ratios)
        plan = allocator.start_sample(parse_budget(f"{mean!r}cr"), 2, case.length).budgets
        assert plan == [kvpress_n_kept(case.length, ratio) for ratio in ratios], (case.inputs, ratios)
        params = {"press": family.removesuffix("_kvpress"), "compression_ratios": ratios}
        if family == "snapkv_kvpress":
            params |= {"kernel_size": 5, "pooling": "avg", "pool_padding": "include", "gqa_reduce": "after_pool"}
            params |= {"score_dtype": "model"}
        method = build_method({"name": "pl", "family": "per_layer", "window": window, "params": params})
        for layer, inputs in enumerate(case_inputs(case)):
            kept = keep_one_layer(method, observation_of(case, layer, inputs, window), plan[layer])
            scores = case.layer_scores(layer)
            for head, positions in enumerate(kept):
                heads += 1
                tied += same_or_tied(positions, case.kept[layer][head], scores[head])
    # SnapKV: layer 1 keeps fewer than the 64-token window at ratios >= 0.5 (kvpress keeps any of the tied window)
    assert heads == len(recording.cases) * 4 and tied <= (heads // 3 if family == "snapkv_kvpress" else 0), tied


def test_per_layer_budgets_follow_the_budget_with_the_ratios_profile() -> None:
    """``64L`` keeps 64 per layer on average, more where the ratio is low; a ratio list of the wrong length is an
    error naming both counts."""
    allocator = PerLayerRatioAllocator([0.25, 0.5, 0.75])
    assert allocator.start_sample(parse_budget("64L"), 3, 1000).budgets == [96, 64, 32]
    assert allocator.start_sample(parse_budget("0.5cr"), 3, 101).budgets == [75, 50, 25]  # kvpress's int(S (1 - c))
    with pytest.raises(ValueError, match="3 ratios for a model with 4"):
        allocator.start_sample(parse_budget("64L"), 4, 1000)
