"""The dashboards (issue #35): ``kvbench report`` (the offline results site, opened in headless Chromium) and
``kvbench wandb-report --dry-run`` (the W&B report's specification), built from real run folders of the tiny model.

The runs (module fixture): the tiny model on two tiny_niah datasets (1K tokens, 2 samples each), the full cache,
StreamingLLM and SnapKV at 64L and 128L, and question-agnostic SnapKV at 64L -- the README's tiny grid, smaller.
The browser test starts Chromium once and is skipped only where no Chromium is installed (``make setup-browser``).
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvbench.reporting.headless import find_chromium

REPO = Path(__file__).resolve().parents[2]
DATASETS = ["niah_single_1k", "niah_multikey_1k"]
GRID = [
    ("full", "full", None),
    ("streamingllm", "64L", None),
    ("streamingllm", "128L", None),
    ("snapkv", "64L", None),
    ("snapkv", "128L", None),
    ("snapkv", "64L", "agnostic"),
]


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run folders of :data:`GRID` (through ``kvbench.evaluate``: one model load for all six runs)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import kvbench
    from kvbench.resources import models_dir

    out = tmp_path_factory.mktemp("grid")
    model = AutoModelForCausalLM.from_pretrained(models_dir() / "tiny-niah")
    tokenizer = AutoTokenizer.from_pretrained(models_dir() / "tiny-niah")
    for method, budget, mode in GRID:
        kvbench.evaluate(
            model,
            tokenizer,
            method=method,
            budget=budget,
            task="tiny_niah",
            question_mode=mode,
            limit=2,
            output_dir=out,
            model_config="tiny",
            overrides=["task.lengths=[1024]", f"task.datasets=[{','.join(DATASETS)}]"]
            + ([f"run.tag={mode}"] if mode else []),
            progress=False,
        )
    return out / "runs"


def aggregate_summary(runs: Path, out: Path) -> dict[str, dict[str, float]]:
    """``scripts/aggregate.py``'s ``runs_summary.csv`` for ``runs``: run id -> column -> value."""
    spec = importlib.util.spec_from_file_location("aggregate_script", REPO / "scripts" / "aggregate.py")
    aggregate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(aggregate)
    assert aggregate.main(["--runs", str(runs), "--out", str(out / "runs.csv")]) == 0
    rows = {}
    for row in csv.DictReader(io.StringIO((out / "runs_summary.csv").read_text())):
        suffix = f"~{row['tag']}" if row["tag"] else ""
        run_id = f"{row['model']}/{row['task']}/{row['method']}/{row['budget']}{suffix}/{row['question_mode']}"
        rows[run_id] = {c: float(row[c]) for c in [*DATASETS, "mean"]}
    return rows


def embedded_data(index: Path) -> dict[str, Any]:
    text = index.read_text(encoding="utf-8")
    start = text.index('<script id="kvbench-data" type="application/json">') + len(
        '<script id="kvbench-data" type="application/json">'
    )
    return json.loads(text[start : text.index("</script>", start)].replace("<\\/", "</"))


def run_kvbench(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvbench", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_site_leaderboard_equals_aggregate_and_is_incremental(grid: Path, tmp_path: Path) -> None:
    from kvbench.reporting.site import build_site

    expected = aggregate_summary(grid, tmp_path / "tables")
    assert len(expected) == len(GRID)
    first = build_site(grid, tmp_path / "site")
    assert (first.n_runs, first.cache_hits) == (len(GRID), 0)
    html = first.index.read_text(encoding="utf-8")
    assert "http://" not in html.split("<script id")[0] and "https://" not in html.split("<script id")[0]
    assert '<script src="plotly.min.js">' in html and (tmp_path / "site" / "plotly.min.js").stat().st_size > 1e6
    data = embedded_data(first.index)
    [board] = data["leaderboards"]
    shown = {row["run_id"]: {c: cell["score"] for c, cell in row["cells"].items()} for row in board["rows"]}
    assert shown == expected
    summaries = {
        row["run_id"]: json.loads((grid / row["run_id"].rsplit("/", 1)[0] / "summary.json").read_text())
        for row in board["rows"]
    }
    for row in board["rows"]:
        intervals = {d["dataset"]: d["ci95"] for d in summaries[row["run_id"]]["datasets"]}
        assert {d: row["cells"][d]["ci95"] for d in DATASETS} == intervals
    # Best per budget and question mode among the compressed methods, per column.
    for row in board["rows"]:
        peers = [r for r in board["rows"] if (r["budget"], r["question_mode"]) == (row["budget"], row["question_mode"])]
        for column in [*DATASETS, "mean"]:
            scores = [r["cells"][column]["score"] for r in peers]
            expect_best = (
                row["method"] != "full"
                and len(peers) > 1
                and max(scores) != min(scores)
                and row["cells"][column]["score"] == max(scores)
            )
            assert row["cells"][column]["best"] == expect_best
    grids = data["needles"]["tiny/tiny_niah/snapkv/64L/aware"]
    assert sorted(grids) == sorted(DATASETS) and grids["niah_single_1k"]["lengths"] == [1024]
    x = {r["run_id"]: r["x"] for r in data["runs"]}
    assert x["tiny/tiny_niah/snapkv/128L/aware"] == 128.0

    # Incremental: an unchanged run folder comes from the cache; a rewritten one is read again.
    assert build_site(grid, tmp_path / "site").cache_hits == len(GRID)
    metrics = grid / "tiny/tiny_niah/snapkv/128L/niah_single_1k/metrics.json"
    payload = json.loads(metrics.read_text())
    metrics.write_text(json.dumps({**payload, "score": 12.5}))
    try:
        with pytest.warns(UserWarning, match="disagrees with its predictions.jsonl"):
            again = build_site(grid, tmp_path / "site")
        assert again.cache_hits == len(GRID) - 1
        [board] = embedded_data(again.index)["leaderboards"]
        row = next(r for r in board["rows"] if r["run_id"] == "tiny/tiny_niah/snapkv/128L/aware")
        # An edited score is never shown (issue #55): checked against its rows, it is left out and flagged.
        assert row["cells"]["niah_single_1k"]["score"] is None and "disagrees" in row["flags"]
    finally:
        metrics.write_text(json.dumps(payload))


def test_made_up_runs_are_flagged_and_show_the_papers_values(tmp_path: Path) -> None:
    from kvbench.reporting.dashboard_data import leaderboards, load_dashboard_runs
    from kvbench.reporting.paper_refs import load_reference
    from kvbench.reporting.synthetic import write_synthetic_runs

    write_synthetic_runs(tmp_path, tables=["adakv_late_t2"], noise=0.0)
    runs = load_dashboard_runs(tmp_path)
    boards = leaderboards(runs)
    rows = [row for board in boards for row in board["rows"]]
    assert rows and all(row["flags"] == ["synthetic"] for row in rows)
    ref = load_reference("adakv_late_t2")
    printed = ref[(ref["kind"] == "dataset") & ref["value"].notna() & (ref["method"] != "")]
    found = 0
    for rec in printed.to_dict("records"):
        row = next(
            (
                r
                for b in boards
                for r in b["rows"]
                if (r["model"], r["task"], r["method"], r["budget"])
                == (rec["model"], rec["task"], rec["method"], rec["budget"])
            ),
            None,
        )
        if row is not None and rec["dataset"] in row["cells"]:
            assert row["cells"][rec["dataset"]]["paper"] == f"{rec['printed']} (adakv_late_t2)"
            found += 1
    assert found >= len(printed) // 2


def test_stand_in_data_is_flagged(grid: Path, tmp_path: Path) -> None:
    import shutil

    from kvbench.reporting.site import build_site

    runs = tmp_path / "runs"
    shutil.copytree(grid / "tiny/tiny_niah/snapkv/64L", runs / "tiny/tiny_niah/snapkv/64L")
    metrics = runs / "tiny/tiny_niah/snapkv/64L/niah_single_1k/metrics.json"
    payload = json.loads(metrics.read_text())
    payload["data_provenance"] = {"haystack": {"source": "stand-in", "path": "x.jsonl", "missing": "essays.json"}}
    metrics.write_text(json.dumps(payload))
    data = embedded_data(build_site(runs, tmp_path / "site").index)
    [run] = data["runs"]
    assert run["flags"] == ["stand-in"] and run["stand_in"] == ["niah_single_1k: haystack"]
    assert data["leaderboards"][0]["rows"][0]["flags"] == ["stand-in"]


def test_bad_input_exits_2_and_writes_nothing(grid: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    empty = tmp_path / "empty"
    empty.mkdir()
    corrupt = tmp_path / "corrupt"
    (corrupt / "m/t/snapkv/64L/d").mkdir(parents=True)
    (corrupt / "m/t/snapkv/64L/d/metrics.json").write_text('{"model": "m", "task": ')
    wandb = ["--entity", "e", "--project", "p", "--dry-run"]
    cases = [
        (["report", str(empty)], f"no runs under {empty}"),
        (["report", str(corrupt)], "corrupt/m/t/snapkv/64L/d/metrics.json"),
        (["report", str(grid), "--experiment", "nope"], "unknown experiment 'nope'"),
        # wandb-report reads the runs with the same checks
        (["wandb-report", str(grid), *wandb, "--experiment", "nope"], "experiments there: default"),
    ]
    for args, message in cases:
        result = run_kvbench(*args, "--out", str(out))
        assert result.returncode == 2, result.stderr
        assert message in result.stderr and result.stderr.startswith("error: ") and "Traceback" not in result.stderr
        assert not out.exists()


def test_wandb_report_dry_run_has_one_budget_panel_per_dataset(grid: Path, tmp_path: Path) -> None:
    wr = pytest.importorskip("wandb_workspaces.reports.v2")
    from wandb_workspaces.reports.v2 import internal

    out = tmp_path / "report.json"
    result = run_kvbench(
        "wandb-report", str(grid), "--entity", "me", "--project", "kv", "--experiment", "default", "--dry-run",
        "--out", str(out), "--title", "tiny grid",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = wr.Report._from_model(internal.ReportViewspec.model_validate(json.loads(out.read_text())))
    assert (report.entity, report.project, report.title) == ("me", "kv", "tiny grid")
    [grid_block] = [b for b in report.blocks if isinstance(b, wr.PanelGrid)]
    [runset] = grid_block.runsets
    assert (runset.entity, runset.project) == ("me", "kv")
    for key, value in (("model", "tiny"), ("task", "tiny_niah"), ("experiment", "default")):
        assert f'Config("panel.{key}") == {value!r}' in runset.filters
    lines = [p for p in grid_block.panels if isinstance(p, wr.LinePlot)]
    per_dataset = {p.y[0].name: p for p in lines if "/avg/" not in p.y[0].name}
    assert sorted(per_dataset) == sorted(f"tiny_niah/{d}/interval" for d in DATASETS)
    for name, panel in per_dataset.items():
        assert panel.x.name == "budget_tokens_per_layer" and panel.log_x
        # One line per method x question mode (x tag): the median of the three band rows (the score) with the
        # min-max band (the interval's ends), and the full cache across the budgets; no extra interval lines.
        assert isinstance(panel.groupby, wr.Config) and panel.groupby.name == "panel.group"
        dataset_key = name.removesuffix("/interval")
        assert [m.name for m in panel.y] == [name, f"full_cache/{dataset_key}"]
        assert (panel.groupby_aggfunc, panel.groupby_rangefunc) == ("median", "minmax")
        assert "(full cache: " in panel.title
    assert any(p.y[0].name == "tiny_niah/avg/mean/interval" for p in lines)
    # The palette: every group of the run set (method, question mode, tag) in its method's colour.
    from kvbench.reporting.palette import method_colour

    colours = {tuple(k.value for k in group.keys): colour for group, colour in grid_block.custom_run_colors.items()}
    assert colours and all(colour == method_colour(key[0]) for key, colour in colours.items())
    methods = {key[0] for key in colours}
    assert "snapkv" in methods and len(set(colours.values())) == len(methods)
    assert "kept fraction vs score" not in out.read_text() and "as a band" in out.read_text()
    [scatter] = [p for p in grid_block.panels if isinstance(p, wr.ScatterPlot)]
    assert scatter.x.name == "panel.stored_fraction" and scatter.y.name == "tiny_niah/avg"
    [parallel] = [p for p in grid_block.panels if isinstance(p, wr.ParallelCoordinatesPlot)]
    assert len(parallel.columns) == 4 + len(DATASETS) + 1
    # The run set: grouped by method, question mode and tag; its columns are the library's own names of the
    # config and summary keys (Config("panel.method") -> "config:panel.value.method": panel is a dict).
    assert len(runset.groupby) == 3 and all("panel" in str(g) for g in runset.groupby)
    from wandb_workspaces.reports.v2.interface import _metric_to_frontend_pc

    pinned = [_metric_to_frontend_pc(c) for c in runset.pinned_columns]
    assert [p.name for p in pinned[:3]] == ["panel.method", "panel.question_mode", "panel.budget"]
    assert all(isinstance(p, wr.Config) for p in pinned[:3])
    assert "summary:tiny_niah/niah_single_1k/ci95_low" in runset.column_order
    # A dry run needs no entity or project.
    bare = tmp_path / "bare.json"
    result = run_kvbench("wandb-report", str(grid), "--dry-run", "--out", str(bare))
    assert result.returncode == 0, result.stderr
    assert json.loads(bare.read_text())["spec"]["blocks"]
    missing = run_kvbench("wandb-report", str(grid), "--out", str(tmp_path / "x.json"))
    assert missing.returncode == 2 and "--entity is needed" in missing.stderr


def _blank_share(png: bytes) -> float:
    """Share of the screenshot's pixels that have its most common colour."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    counts = image.getcolors(maxcolors=1 << 24)
    return max(n for n, _ in counts) / (image.width * image.height)


@pytest.mark.skipif(find_chromium() is None, reason="no Chromium (make setup-browser)")
def test_site_in_headless_chromium(grid: Path, tmp_path: Path) -> None:
    from kvbench.reporting.headless import HeadlessChromium

    expected = aggregate_summary(grid, tmp_path / "tables")
    site = tmp_path / "site"
    result = run_kvbench("report", str(grid), "--out", str(site))
    assert result.returncode == 0, result.stderr
    rows_js = (
        "[...document.querySelectorAll('tr.lb-row')].map(tr => [tr.dataset.runId, "
        "Object.fromEntries([...tr.querySelectorAll('td.score')].map(td => [td.dataset.column, td.dataset.score, "
        "td.querySelector('.value').textContent]).map(([c, s, t]) => [c, [s, t]]))])"
    )
    with HeadlessChromium() as browser:
        browser.open(site / "index.html")
        assert browser.evaluate("document.body.dataset.rendered") == "1"
        assert browser.errors == []
        shown = dict(browser.evaluate(rows_js))
        assert {rid: {c: float(v[0]) for c, v in cells.items()} for rid, cells in shown.items()} == expected
        for rid, cells in shown.items():  # the printed text is the value with two decimals
            assert all(text == f"{expected[rid][c]:.2f}" for c, (_, text) in cells.items())
        drawn = "[...document.querySelectorAll('#{} .plot')].filter(div => div.querySelector('.main-svg')).length"
        assert browser.evaluate(drawn.format("budget-plots")) == len(DATASETS) + 1  # and the mean
        assert browser.evaluate(drawn.format("memory-plots")) == 2
        assert browser.evaluate(drawn.format("needles")) == len(GRID)  # one dataset, every run side by side
        # The headline chart: one per model x task, a line per method and question mode, the full cache a line.
        assert browser.evaluate(drawn.format("headline")) == 1
        names = browser.evaluate("document.querySelector('.headline-plot').data.map(t => t.name)")
        assert {"SnapKV ⚠ n<10", "StreamingLLM ⚠ n<10", "SnapKV (agnostic) ⚠ n<10", "Full cache"} <= set(names)
        # The pivot: aware and agnostic apart, one full-cache row each, a row per method, a column per budget.
        pivots = browser.evaluate(
            "[...document.querySelectorAll('table.pivot')].map(t => [t.dataset.questionMode,"
            " t.querySelectorAll('tr.full-row').length, [...t.querySelectorAll('tr.pivot-row')].map(r =>"
            " r.dataset.method), [...t.querySelectorAll('th.sortable')].map(th => th.dataset.sort)])"
        )
        aware_order = sorted(["snapkv", "streamingllm"], key=lambda m: -pivot_avg(grid, m))
        assert sorted(pivots) == [
            ["agnostic", 1, ["snapkv"], ["method", "avg", "64L"]],
            ["aware", 1, aware_order, ["method", "avg", "64L", "128L"]],
        ]
        assert "Δ full" in browser.evaluate("document.querySelector('table.pivot tr.pivot-row').innerText")
        # The predictions browser shows a prediction's text from predictions.jsonl.
        first = json.loads((grid / GRID_RUN / DATASETS[0] / "predictions.jsonl").read_text().splitlines()[0])
        browser.evaluate(select_js("pred-dataset", DATASETS[0]))
        browser.evaluate(select_js("pred-run", "tiny/tiny_niah/snapkv/64L/aware"))
        shown_texts = browser.evaluate("[...document.querySelectorAll('td.prediction')].map(td => td.textContent)")
        assert first["prediction"] in shown_texts
        assert first["prompt_end"][-40:] in browser.evaluate("document.getElementById('predictions').innerText")
        colours = swatches(browser)
        browser.evaluate(
            "(() => { const s = document.getElementById('filter-question_mode'); s.value = 'agnostic';"
            " s.dispatchEvent(new Event('change')); })()"
        )
        filtered = dict(browser.evaluate(rows_js))
        assert sorted(filtered) == ["tiny/tiny_niah/snapkv/64L~agnostic/agnostic"]
        assert browser.evaluate("document.querySelectorAll('tr.prov-row').length") == 1
        browser.evaluate(
            "(() => { const s = document.getElementById('filter-question_mode'); s.value = '';"
            " s.dispatchEvent(new Event('change')); })()"
        )
        assert len(browser.evaluate(rows_js)) == len(GRID)
        png = browser.screenshot()
        assert browser.errors == []
        # One palette: a second site with another set of methods gives SnapKV the same colour.
        subset = tmp_path / "subset"
        shutil.copytree(grid / GRID_RUN, subset / GRID_RUN)
        assert run_kvbench("report", str(subset), "--out", str(tmp_path / "site2")).returncode == 0
        browser.open(tmp_path / "site2" / "index.html")
        assert browser.errors == []
        assert swatches(browser)["snapkv"] == colours["snapkv"] != colours["streamingllm"]
        # The single-file page draws its plots with no other file beside it.
        single = tmp_path / "single"
        assert run_kvbench("report", str(grid), "--out", str(single), "--single-file").returncode == 0
        assert sorted(p.name for p in single.iterdir() if not p.name.startswith(".")) == ["index.html"]
        browser.open(single / "index.html")
        assert browser.errors == [] and browser.evaluate(drawn.format("headline")) == 1
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert _blank_share(png) < 0.95


GRID_RUN = "tiny/tiny_niah/snapkv/64L"


def select_js(select_id: str, value: str) -> str:
    """JavaScript that picks ``value`` in the ``<select id=select_id>`` and fires its change event."""
    return (
        f"(() => {{ const s = document.getElementById({select_id!r}); s.value = {value!r};"
        " s.dispatchEvent(new Event('change')); })()"
    )


def swatches(browser: Any) -> dict[str, str]:
    """Method -> the colour of its swatch in the pivot (the palette as the page shows it)."""
    return dict(
        browser.evaluate(
            "[...document.querySelectorAll('tr.pivot-row')].map(r => [r.dataset.method,"
            " r.querySelector('.swatch').style.background])"
        )
    )


def pivot_avg(grid: Path, method: str) -> float:
    """The mean over budgets of a method's aware runs' means (the pivot's first sort order)."""
    means = []
    for budget in ("64L", "128L"):
        summary = json.loads((grid / f"tiny/tiny_niah/{method}/{budget}/summary.json").read_text())
        means.append(summary["averages"]["mean"]["score"])
    return sum(means) / len(means)


def _copy_run(grid: Path, run: str, dest: Path, budget: str | None = None, tag: str | None = None) -> None:
    """Copy a run folder of the grid, rewriting its budget / tag (in the folder name and every metrics.json)."""
    model, task, method, old_budget = run.split("/")
    folder = dest / model / task / method / ((budget or old_budget) + (f"~{tag}" if tag else ""))
    shutil.copytree(grid / run, folder)
    for metrics in folder.glob("*/metrics.json"):
        payload = json.loads(metrics.read_text())
        metrics.write_text(json.dumps({**payload, "budget": budget or payload["budget"], "tag": tag or payload["tag"]}))


def test_pivot_pairs_samples_with_the_full_cache_and_keeps_one_full_row(grid: Path, tmp_path: Path) -> None:
    from kvbench.reporting.dashboard_data import load_dashboard_runs
    from kvbench.reporting.pivot import pivots

    runs = tmp_path / "runs"
    _copy_run(grid, "tiny/tiny_niah/full/full", runs)
    _copy_run(grid, "tiny/tiny_niah/full/full", runs, budget="64L")  # method=full under a second budget
    _copy_run(grid, GRID_RUN, runs)
    _copy_run(grid, GRID_RUN, runs, tag="seed1")  # a second seed of the same run
    [table] = pivots(load_dashboard_runs(runs))
    assert table["question_mode"] == "aware" and [b["budget"] for b in table["budgets"]] == ["64L"]
    assert table["full"]["budget"] == "full" and len(table["warnings"]) == 1
    assert "method=full was run with 2 budgets (full, 64L)" in table["warnings"][0]
    [row] = table["rows"]
    cell = row["cells"]["64L"]
    assert (row["label"], cell["seeds"], cell["n"]) == ("SnapKV", 2, 4)
    summaries = [json.loads((grid / r / "summary.json").read_text()) for r in (GRID_RUN, "tiny/tiny_niah/full/full")]
    per_sample = [{d["dataset"]: d["per_sample"] for d in s["datasets"]} for s in summaries]
    diffs = {}
    for dataset in DATASETS:
        mine, full = per_sample[0][dataset], dict(zip(*per_sample[1][dataset].values(), strict=True))
        diffs[dataset] = [s - full[i] for i, s in zip(mine["ids"], mine["scores"], strict=True)]
    expected = sum(sum(d) / len(d) for d in diffs.values()) / len(diffs)
    assert cell["diff"] == pytest.approx(expected)
    assert cell["diff_ci95"][0] <= cell["diff"] <= cell["diff_ci95"][1]
    # Two identical seeds pool the same differences twice: no interval end lies outside the differences' range.
    assert min(min(v) for v in diffs.values()) <= cell["diff_ci95"][0]
    assert cell["diff_ci95"][1] <= max(max(v) for v in diffs.values())
    assert cell["mean"] == pytest.approx(summaries[0]["averages"]["mean"]["score"])
    assert cell["stored_fraction"] > cell["kept_fraction"] > 0  # SnapKV stores a cache per query head
