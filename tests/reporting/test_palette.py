"""One colour and display name per method in every view (:mod:`kvbench.reporting.palette`), the seed tags the
leaderboard pools (:func:`kvbench.reporting.pivot.seed_free_tag`), the headline chart's series and paper markers
(:func:`kvbench.reporting.pivot.headline`) and the full-cache reference a W&B run logs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from kvbench.reporting.palette import EXTRA_COLOURS, METHOD_STYLES, method_colour, method_label, palette
from kvbench.reporting.pivot import seed_free_tag
from kvbench.run.wandb_logging import full_cache_values

REPO = Path(__file__).resolve().parents[2]


def test_every_fixed_method_exists_and_has_its_own_colour() -> None:
    configs = {p.stem for p in (REPO / "conf" / "method").glob("*.yaml")}
    assert set(METHOD_STYLES) <= configs
    colours = [s.colour for s in METHOD_STYLES.values()]
    assert len(set(colours)) == len(colours) and not set(colours) & set(EXTRA_COLOURS)
    assert all(re.fullmatch(r"#[0-9a-f]{6}", c) for c in [*colours, *EXTRA_COLOURS])
    assert (method_label("cake"), method_label("snapkv"), method_label("my_method")) == ("CAKE", "SnapKV", "my_method")


def test_a_methods_colour_does_not_depend_on_the_others_or_the_process() -> None:
    assert palette(["snapkv", "cake"])["snapkv"] == palette(["snapkv", "h2o", "xkv", "ahakv"])["snapkv"]
    code = "from kvbench.reporting.palette import method_colour; print(method_colour('cake_alloc_random'))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert other.stdout.strip() == method_colour("cake_alloc_random") in EXTRA_COLOURS


def test_seed_tags_are_pooled_other_tags_are_not() -> None:
    assert [seed_free_tag(t) for t in ("seed1", "s2", "late_seed3", "late_s4", None, "late", "agnostic")] == [
        "", "", "late", "late", "", "late", "agnostic"
    ]  # fmt: skip


def test_wandb_full_cache_reference_reads_the_sibling_full_run(tmp_path: Path) -> None:
    model_task = tmp_path / "tiny" / "tiny_niah"
    run = model_task / "snapkv" / "64L"
    run.mkdir(parents=True)
    assert full_cache_values(run, "tiny_niah") == {}
    for budget, score in (("64L", 50.0), ("full", 90.0)):
        (model_task / "full" / budget).mkdir(parents=True)
        summary = {"datasets": [{"dataset": "d1", "score": score}], "averages": {"mean": {"score": score}}}
        (model_task / "full" / budget / "summary.json").write_text(json.dumps(summary))
    # The run under the budget "full" is the reference when method=full ran under several budgets.
    assert full_cache_values(run, "tiny_niah") == {"full_cache/tiny_niah/d1": 90.0, "full_cache/tiny_niah/avg": 90.0}


def test_headline_has_one_line_per_method_and_the_papers_mean_as_a_marker() -> None:
    from kvbench.reporting.pivot import headline

    def cell(mean: float, stored: float | None) -> dict:
        return {"mean": mean, "ci95": [mean - 1, mean + 1], "small_n": False, "stored_fraction": stored,
                "run_ids": ["m/t/snapkv/64L/aware"], "datasets": ["a", "b"]}  # fmt: skip

    table = {
        "model": "m", "task": "t", "question_mode": "aware", "budgets": [{"budget": "64L"}, {"budget": "128L"}],
        "full": {"mean": 90.0, "ci95": [89.0, 91.0]},
        "rows": [{"method": "snapkv", "label": "SnapKV", "colour": "#1f77b4", "tag": "",
                  "cells": {"64L": cell(50.0, 0.06), "128L": cell(60.0, None)}}],
    }  # fmt: skip
    key = ("m", "t", "snapkv", "64L", "", "aware")
    printed = {(*key, "a"): "40.0 (x_t1)", (*key, "b"): "44.0 (x_t1)"}
    [chart] = headline([table], printed)
    assert chart["full"] == {"y": 90.0, "ci95": [89.0, 91.0]}
    [series] = chart["series"]
    # 128L has no stored-bytes fraction: no point (the x axis is bytes, never tokens).
    assert [(p["budget"], p["x"], p["y"], p["paper"]) for p in series["points"]] == [("64L", 0.06, 50.0, 42.0)]
    del printed[(*key, "b")]  # the paper prints one of the two datasets only
    assert headline([table], printed)[0]["series"][0]["points"][0]["paper"] is None
