"""kvpress-variant PyramidKV (``pyramidkv_kvpress``: ``params.schedule: kvpress``) against NVIDIA/kvpress 0.5.5's
recorded ``PyramidKVPress`` (issue #43 item 9): the recorded tiny Llama (float32 and bfloat16), every layer's budget
as kvpress's, every head's kept tokens kvpress's or another valid top-k of kvpress's scores where they tie at the
cut."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvbench.budget import parse_budget
from kvbench.eviction.base import WindowObservation, build_method
from kvbench.eviction.kvpress_pyramid import KvpressPyramidAllocator, kvpress_pyramid_budgets
from tests.methods.helpers import method_from_yaml
from tests.methods.kvpress_replay import keep_one_layer, model_queries
from tests.reference_recordings import boundary_tie, case_inputs, is_valid_topk, kvpress_n_kept, load_recording


@pytest.mark.parametrize(("press", "window"), [("PyramidKVPress", 64), ("PyramidKVPress_window16", 16)])
def test_pyramidkv_kvpress_keeps_kvpress_layer_budgets_and_tokens(press: str, window: int) -> None:
    """The allocator's plan at ``<n>L`` is kvpress's per-layer count on every case; each layer's selection at that
    count is kvpress's (the window inside the budget, ties at the cut a valid top-k)."""
    method = method_from_yaml("pyramidkv_kvpress", window=window)
    cases = load_recording(press).cases
    same = tied = 0
    for case in cases:
        n_kept = kvpress_n_kept(case.length, case.compression_ratio)
        plan = method.layer_allocator.plan(parse_budget(f"{n_kept}L").total(case.length, 2), 2, case.length)
        assert plan == [len(layer[0]) for layer in case.kept], (case.inputs, case.compression_ratio, plan)
        for layer, inputs in enumerate(case_inputs(case)):
            keys, values = inputs["keys"][0], inputs["values"][0]
            queries = model_queries(case, layer, inputs)[:, -window:]
            observation = WindowObservation(layer, 2, queries, keys, values, keys.shape[-1] ** -0.5)
            reference = case.layer_scores(layer)
            for head, positions in enumerate(keep_one_layer(method, observation, plan[layer])):
                if positions == sorted(case.kept[layer][head]):
                    same += 1
                    continue
                where = (case.inputs, case.compression_ratio, layer, head)
                assert boundary_tie(reference[head], plan[layer]), where
                assert is_valid_topk(reference[head], positions), where
                tied += 1
    assert same + tied == len(cases) * 4 and same > 0


def test_kvpress_pyramid_budgets_fall_back_and_clamp_as_kvpress() -> None:
    """kvpress's float arithmetic: the pyramid's clamp at ``S - W``, the half-to-even rounding per layer, and its
    fall-back to ``max(1, round(n))`` on every layer when ``min < W`` (every window-64 recording)."""
    assert kvpress_pyramid_budgets(96, 16, 20, 2, 128) == [112, 80]  # max clamped at S - W = 112
    assert kvpress_pyramid_budgets(96, 64, 20, 2, 128) == [96, 96]  # min = 4.8 < 64: SnapKV's uniform budget
    assert kvpress_pyramid_budgets(0.4, 64, 20, 3, 128) == [1, 1, 1]  # never an empty layer
    budgets = kvpress_pyramid_budgets(3072, 64, 20, 36, 4096)  # Qwen3-8B at RULER 4K, ratio 0.25
    assert budgets[0] == 4032 and budgets[-1] == 2112 and abs(sum(budgets) - 36 * 3072) <= 36
    assert kvpress_pyramid_budgets(1024, 64, 20, 36, 4096) == [1024] * 36  # ratio 0.75: min 51.2 < 64


def test_pyramidkv_kvpress_schedule_is_a_pyramidkv_choice() -> None:
    """``params.schedule=kvpress`` is one of pyramidkv's schedules; a bad one names the valid choices."""
    method = build_method({"name": "p", "family": "pyramidkv", "window": 16, "params": {"schedule": "kvpress"}})
    assert method.layer_allocator.plan(2 * 24, 2, 48) == [32, 16]
    with pytest.raises(ValueError, match="kvpress"):
        build_method({"name": "p", "family": "pyramidkv", "params": {"schedule": "kv_press"}})


#: kvpress's ``get_layer_budget`` on a grid of contexts, ratios (mostly a fractional ``S (1 - c)``), windows, betas
#: and depths (``scripts/reference/record_kvpress_protocol.py``, kvpress 0.5.5).
LAYER_BUDGETS = Path(__file__).resolve().parents[1] / "fixtures" / "reference" / "kvpress_protocol"


def test_cr_budgets_give_kvpress_layer_budgets_from_the_unrounded_mean() -> None:
    """A ``<c>cr`` budget hands kvpress's unrounded ``S (1 - c)`` to the schedule: every layer of every recorded case
    keeps kvpress's count; planning from the rounded ``int(S (1 - c))`` (kvbench's earlier mean) differs in many."""
    recording = json.loads((LAYER_BUDGETS / "PyramidKVPress_layer_budgets.json").read_text())
    fractional = rounded_differs = 0
    for case in recording["cases"]:
        length, ratio, layers = case["q_len"], case["compression_ratio"], case["num_layers"]
        allocator = KvpressPyramidAllocator(case["beta"], case["window_size"])
        state = allocator.start_sample(parse_budget(f"{ratio}cr"), layers, length)
        assert state.budgets == case["budgets"], case
        n_kept = kvpress_n_kept(length, ratio)
        fractional += n_kept != length * (1 - ratio)
        rounded_differs += allocator.plan(n_kept * layers, layers, length) != case["budgets"]
    # The unrounded mean is kvpress's S (1 - c) for <c>cr only; <r>x and <n>L keep their own (rounded) means.
    assert parse_budget("0.3cr").unrounded_mean_per_layer(37) == 37 * (1 - 0.3) != parse_budget("0.3cr").total(37, 1)
    assert parse_budget("0.5x").unrounded_mean_per_layer(37) == 18  # round(18.5)
    assert parse_budget("9L").unrounded_mean_per_layer(37) == 9
    # 378 cases (215 with a fractional S (1 - c)), every layer kvpress's; the rounded mean missed 180 of them.
    assert (len(recording["cases"]), fractional, rounded_differs) == (378, 215, 180)
