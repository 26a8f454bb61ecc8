"""The results site's breakdowns: sub-scores read generically from ``metrics.json`` ``scores`` (LongBench v2's
buckets, SCBench's turns) and the reasoning tasks' accuracy vs generated length, on small hand-written run folders."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from kvbench.reporting.headless import find_chromium
from kvbench.storage.writers import METRICS_FILE, PREDICTIONS_FILE, run_dir
from tests.reporting.test_dashboards import embedded_data

MODEL = "tiny"


def write_run(
    root: Path, task: str, dataset: str, method: str, budget: str, scores: dict[str, float], new_tokens: list[int]
) -> None:
    """One run folder with one dataset: its ``metrics.json`` (``scores`` as given) and a ``predictions.jsonl`` row
    per generated length."""
    folder = run_dir(root, MODEL, task, method, budget, None) / dataset
    folder.mkdir(parents=True)
    metrics = {
        "model": MODEL,
        "task": task,
        "dataset": dataset,
        "method": method,
        "budget": budget,
        "tag": None,
        "metric": "accuracy",
        "score": scores["score"],
        "scores": scores,
        "n_samples": len(new_tokens),
        "question_mode": "aware",
        "config_hash": "test",
    }
    (folder / METRICS_FILE).write_text(json.dumps(metrics), encoding="utf-8")
    rows = [{"id": str(i), "prediction": "x", "answers": ["y"], "new_tokens": n} for i, n in enumerate(new_tokens)]
    (folder / PREDICTIONS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    lb = {"score": 40.0, "easy": 50.0, "hard": 30.0, "short": 60.0, "medium": 35.0, "long": 25.0, "n_scored": 8.0}
    write_run(root, "longbench_v2", "longbench_v2", "full", "full", lb, [1, 1])
    write_run(root, "longbench_v2", "longbench_v2", "snapkv", "128L", {**lb, "score": 20.0, "hard": 10.0}, [1, 1])
    turns = {"score": 45.0, "turn_0": 70.0, "turn_1/kv": 20.0, "turn_10/kv": 5.0}
    write_run(root, "scbench", "scbench_kv", "snapkv", "128L", turns, [3])
    reasoning = {"score": 30.0, "ci_low": 10.0, "ci_high": 60.0, "n_questions": 3.0, "pass_at_n": 50.0}
    write_run(root, "reasoning", "gsm8k", "full", "full", reasoning, [100, 300])
    write_run(root, "reasoning", "gsm8k", "snapkv", "64L", {**reasoning, "score": 10.0}, [500, 700])
    write_run(root, "reasoning", "gsm8k", "snapkv", "128L", {**reasoning, "score": 20.0}, [400])
    write_run(root, "reasoning", "gsm8k", "full", "64L", {**reasoning, "score": 31.0}, [200])  # full: one point
    write_run(root, "tiny_niah", "niah", "snapkv", "128L", {"score": 80.0, "nulls": 1.0}, [2])  # a count: no table
    lm_eval = {"score": 55.0, "acc,none": 55.0, "acc_stderr,none": 3.0, "acc_norm,none": 60.0}
    write_run(root, "lmeval", "arc_easy", "snapkv", "128L", lm_eval, [1])
    return root


@pytest.fixture(scope="module")
def site(runs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from kvbench.reporting.site import build_site

    out = tmp_path_factory.mktemp("site")
    build_site(runs, out)
    return out


def test_breakdown_tables_hold_every_sub_score_in_display_order(site: Path) -> None:
    tables = {t["dataset"]: t for t in embedded_data(site / "index.html")["breakdowns"]}
    assert set(tables) == {"longbench_v2", "scbench_kv", "gsm8k", "arc_easy"}  # niah has only its headline
    assert [c["key"] for c in tables["arc_easy"]["columns"]] == ["acc,none", "acc_norm,none"]  # no standard error
    lb = tables["longbench_v2"]
    assert [c["label"] for c in lb["columns"]] == ["Easy", "Hard", "Short", "Medium", "Long"]  # n_scored: a count
    assert [(r["method"], r["budget"]) for r in lb["rows"]] == [("full", "full"), ("snapkv", "128L")]
    assert lb["rows"][1]["score"] == 20.0
    assert lb["rows"][1]["values"] == {"easy": 50.0, "hard": 10.0, "short": 60.0, "medium": 35.0, "long": 25.0}
    sc = tables["scbench_kv"]
    assert [c["key"] for c in sc["columns"]] == ["turn_0", "turn_1/kv", "turn_10/kv"]  # turns in numeric order
    assert [c["label"] for c in sc["columns"]][1] == "turn 1 · kv"
    assert sc["rows"][0]["values"]["turn_10/kv"] == 5.0
    assert [c["key"] for c in tables["gsm8k"]["columns"]] == ["pass_at_n"]  # no interval ends, no counts


def test_reasoning_accuracy_against_mean_generated_length(site: Path) -> None:
    charts = embedded_data(site / "index.html")["length_charts"]
    assert [(c["task"], c["dataset"]) for c in charts] == [("reasoning", "gsm8k")]
    series = {s["method"]: s["points"] for s in charts[0]["series"]}
    assert [(p["budget"], p["x"], p["y"]) for p in series["snapkv"]] == [("64L", 600.0, 10.0), ("128L", 400.0, 20.0)]
    assert [(p["x"], p["y"]) for p in series["full"]] == [(200.0, 30.0)]


@pytest.mark.skipif(find_chromium() is None, reason="no Chromium to render the page")
def test_breakdowns_render_in_headless_chromium(site: Path) -> None:
    from kvbench.reporting.headless import HeadlessChromium

    cells = (
        "[...document.querySelectorAll('table.breakdown[data-dataset=longbench_v2] tr.breakdown-row')]"
        ".map(tr => [...tr.querySelectorAll('td.bd-cell')].map(td => [td.dataset.column, td.textContent]))"
    )
    with HeadlessChromium() as browser:
        browser.open(site / "index.html")
        assert browser.evaluate("document.body.dataset.rendered") == "1"
        assert browser.errors == []
        shown = browser.evaluate(cells)
        assert shown[1] == [["easy", "50.0"], ["hard", "10.0"], ["short", "60.0"], ["medium", "35.0"], ["long", "25.0"]]
        drawn = "[...document.querySelectorAll('#length-plots .length-plot')].filter(d => d.querySelector('.main-svg'))"
        assert browser.evaluate(drawn + ".length") == 1


def test_make_tables_writes_the_breakdowns(runs: Path, tmp_path: Path) -> None:
    from kvbench.reporting.aggregate import load_runs
    from kvbench.reporting.breakdowns import write_breakdowns

    write_breakdowns(load_runs(runs), tmp_path)  # what scripts/tables.py writes beside runs_summary
    frame = pd.read_csv(tmp_path / "breakdowns.csv")
    snap = frame[(frame["dataset"] == "longbench_v2") & (frame["method"] == "snapkv")]
    assert dict(zip(snap["breakdown"], snap["value"], strict=True)) == {
        "easy": 50.0,
        "hard": 10.0,
        "short": 60.0,
        "medium": 35.0,
        "long": 25.0,
    }
    assert set(frame["dataset"]) == {"longbench_v2", "scbench_kv", "gsm8k", "arc_easy"}
    markdown = (tmp_path / "breakdowns.md").read_text(encoding="utf-8")
    assert "## tiny · scbench · scbench_kv" in markdown
    assert "| method | budget | mode | score | turn 0 | turn 1 · kv | turn 10 · kv |" in markdown
    assert "| SnapKV | 128L | aware | 20.0 | 50.0 | 10.0 | 60.0 | 35.0 | 25.0 |" in markdown
