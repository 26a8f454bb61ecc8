"""Aggregation and table rebuilding on synthetic run folders (a few methods, budgets, datasets; some missing)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from kvbench.reporting.aggregate import expand_settings, load_runs, run_summary
from kvbench.reporting.cells import NOT_RUN
from kvbench.reporting.paper_refs import TABLES, TableSpec, load_reference
from kvbench.reporting.plots import (
    budget_value,
    needle_grid_from_predictions,
    plot_paper_tables,
    plot_score_vs_budget,
)
from kvbench.reporting.render import render_latex, render_markdown
from kvbench.reporting.tables import build_all, compare_table, missing_runs, write_tables
from kvbench.storage.writers import PredictionLog, atomic_write_json, run_dir
from kvbench.views.conventions import LONGBENCH16, LONGBENCH21, Convention, MissingData


def write_metrics(
    root: Path,
    model: str,
    task: str,
    method: str,
    budget: str,
    dataset: str,
    score: float,
    tag: str | None = None,
    question_mode: str = "aware",
    folder: Path | None = None,
    settings: dict | None = None,
    n_samples: int = 10,
) -> Path:
    """Write one metrics.json as the runner does (``folder`` overrides the standard location; a run folder that
    holds ``predictions.jsonl`` must hold ``n_samples`` rows, or the views refuse the score)."""
    base = folder if folder is not None else run_dir(root, model, task, method, budget, tag)
    path = base / dataset / "metrics.json"
    atomic_write_json(
        path,
        {
            "model": model,
            "task": task,
            "dataset": dataset,
            "method": method,
            "budget": budget,
            "tag": tag,
            "metric": "score",
            "score": score,
            "scores": {"score": score},
            "n_samples": n_samples,
            "config_hash": "abc",
            "question_mode": question_mode,
            "dataset_settings": {},
            "scorer": {},
            "cache": {"mean_kept_fraction": 0.5, "mean_cache_bytes": 1024.0},
            "settings": settings if settings is not None else {"window": 32},
        },
    )
    return path


def write_full_run(root: Path, model: str, task: str, method: str, budget: str, scores: dict[str, float], **kw) -> None:
    for dataset, score in scores.items():
        write_metrics(root, model, task, method, budget, dataset, score, **kw)


# --------------------------------------------------------------------------------------------------- aggregation
def test_runs_are_discovered_from_metadata_not_paths(tmp_path):
    # A method no list knows about, in a folder whose path says something else entirely.
    write_metrics(tmp_path, "m1", "longbench", "brand_new_method", "128L", "qasper", 12.5, folder=tmp_path / "x" / "y")
    write_metrics(tmp_path, "m1", "longbench", "snapkv", "128L", "qasper", 20.0, tag="cake", settings={"a": {"b": 1}})
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "metrics.json").write_text("{not json")
    with pytest.warns(UserWarning):
        runs = load_runs(tmp_path)
    assert len(runs) == 2
    new = runs[runs["method"] == "brand_new_method"].iloc[0]
    assert (new["model"], new["task"], new["budget"], new["dataset"], new["score"]) == (
        "m1",
        "longbench",
        "128L",
        "qasper",
        12.5,
    )
    assert new["tag"] is None
    tagged = runs[runs["method"] == "snapkv"].iloc[0]
    assert tagged["tag"] == "cake"
    assert tagged["mean_kept_fraction"] == 0.5
    expanded = expand_settings(runs)
    assert expanded.loc[runs["method"] == "snapkv", "setting.a.b"].iloc[0] == 1


def test_load_runs_empty_and_missing_root(tmp_path):
    assert load_runs(tmp_path / "nowhere").empty
    assert list(load_runs(tmp_path).columns)[:4] == ["model", "task", "dataset", "method"]


def test_load_runs_strict_raises_on_incomplete_metrics(tmp_path):
    atomic_write_json(tmp_path / "a" / "metrics.json", {"model": "m", "task": "t"})
    with pytest.raises(ValueError, match="lacks"):
        load_runs(tmp_path, strict=True)


def test_run_summary_one_row_per_run(tmp_path):
    write_full_run(tmp_path, "m", "t", "snapkv", "64L", {"a": 10.0, "b": 30.0})
    write_full_run(tmp_path, "m", "t", "h2o", "64L", {"a": 5.0})
    summary = run_summary(load_runs(tmp_path)).set_index("method")
    assert summary.loc["snapkv", "mean"] == 20.0
    assert summary.loc["h2o", "n_datasets"] == 1
    assert math.isnan(summary.loc["h2o", "b"])


# --------------------------------------------------------------------------------------------------- conventions
def test_conventions():
    scores = {d: float(i) for i, d in enumerate(LONGBENCH21)}
    lb21 = Convention("longbench21")
    assert lb21.aggregate("avg", scores) == pytest.approx(sum(range(21)) / 21)
    assert lb21.aggregate("code", scores) == pytest.approx((scores["lcc"] + scores["repobench-p"]) / 2)
    nb = Convention("needlebench")
    nb_scores = {
        "single_retrieval_zh": 100.0,
        "single_retrieval_en": 80.0,
        "multi_retrieval_zh": 50.0,
        "multi_retrieval_en": 30.0,
        "multi_reasoning_zh": 20.0,
        "multi_reasoning_en": 0.0,
    }
    assert nb.aggregate("single_retrieval", nb_scores) == 90.0
    assert nb.aggregate("overall", nb_scores) == pytest.approx(0.4 * 90 + 0.3 * 40 + 0.3 * 10)
    with pytest.raises(MissingData) as err:
        Convention("mean").aggregate("avg", {"a": 1.0}, ["a", "b"])
    assert err.value.missing == ["b"]
    assert Convention("run_mean").aggregate("avg", {"x": 1.0, "y": 3.0}) == 2.0
    with pytest.raises(MissingData):
        Convention("run_mean", min_datasets=13).aggregate("avg", {"x": 1.0})


# --------------------------------------------------------------------------------------------------- tables
LLAMA2 = "llama2-7b-chat"


@pytest.fixture
def cake_runs(tmp_path) -> Path:
    """CAKE Table 1 rows for Llama2 at 128L: snapkv complete, cake without qmsum, pyramidkv absent, h2o untagged,
    tova with another paper's tag (must not be used), and streamingllm both tagged and untagged (tagged wins)."""
    ref = load_reference("cake_t1")
    paper = ref[(ref["model"] == LLAMA2) & (ref["budget"] == "128L") & (ref["kind"] == "dataset")]
    by_method = {m: dict(zip(g["dataset"], g["value"], strict=True)) for m, g in paper.groupby("method")}
    write_full_run(
        tmp_path,
        LLAMA2,
        "longbench",
        "snapkv",
        "128L",
        {d: v + 1.0 for d, v in by_method["snapkv"].items()},
        tag="cake",
    )
    cake = {d: v for d, v in by_method["cake"].items() if d != "qmsum"}
    write_full_run(tmp_path, LLAMA2, "longbench", "cake", "128L", cake, tag="cake")
    write_full_run(tmp_path, LLAMA2, "longbench", "h2o", "128L", by_method["h2o"])
    write_full_run(tmp_path, LLAMA2, "longbench", "tova", "128L", by_method["tova"], tag="xkv")
    write_full_run(tmp_path, LLAMA2, "longbench", "streamingllm", "128L", dict.fromkeys(LONGBENCH16, 0.0))
    write_full_run(tmp_path, LLAMA2, "longbench", "streamingllm", "128L", dict.fromkeys(LONGBENCH16, 50.0), tag="cake")
    return tmp_path


def _cell(cmp: pd.DataFrame, method: str, column: str, budget: str = "128L", model: str = LLAMA2) -> pd.Series:
    sel = cmp[
        (cmp["model"] == model) & (cmp["budget"] == budget) & (cmp["method"] == method) & (cmp["column"] == column)
    ]
    assert len(sel) == 1
    return sel.iloc[0]


def test_compare_table_values_missing_and_tags(cake_runs):
    spec = TABLES["cake_t1"]
    cmp = compare_table(spec, load_reference("cake_t1"), load_runs(cake_runs))
    # snapkv: every dataset +1 -> average +1, diff = ours - paper.
    snap = _cell(cmp, "snapkv", "avg")
    assert snap["diff"] == pytest.approx(1.0, abs=0.006)
    assert _cell(cmp, "snapkv", "qasper")["diff"] == pytest.approx(1.0)
    assert snap["tag"] == "cake"
    # cake lacks qmsum: that cell and the average are missing, the other datasets are there.
    assert math.isnan(_cell(cmp, "cake", "qmsum")["ours"])
    assert _cell(cmp, "cake", "qmsum")["missing"] == "dataset not run: qmsum"
    assert "qmsum" in _cell(cmp, "cake", "avg")["missing"]
    assert _cell(cmp, "cake", "trec")["diff"] == pytest.approx(0.0)
    # pyramidkv has no run at all; tova only has another paper's tag.
    assert _cell(cmp, "pyramidkv", "avg")["missing"] == "no run"
    assert _cell(cmp, "tova", "avg")["missing"] == "no run"
    # untagged runs are the fallback; the table's tag wins when both exist.
    assert _cell(cmp, "h2o", "avg")["diff"] == pytest.approx(0.0, abs=0.006)
    assert pd.isna(_cell(cmp, "h2o", "avg")["tag"])
    assert _cell(cmp, "streamingllm", "avg")["ours"] == 50.0
    # Another model / budget of the table: all missing.
    assert cmp[cmp["budget"] == "1024L"]["ours"].isna().all()


def test_best_and_second_marks(cake_runs):
    cmp = compare_table(TABLES["cake_t1"], load_reference("cake_t1"), load_runs(cake_runs))
    # Ours at 128L / Llama2 / trec: streamingllm 50 > snapkv 44.5 > h2o 38 (cake 48.5 too): 1 = streamingllm.
    assert _cell(cmp, "streamingllm", "trec")["ours_rank"] == 1
    assert _cell(cmp, "cake", "trec")["ours_rank"] == 2
    assert _cell(cmp, "h2o", "trec")["ours_rank"] == 0
    # The paper's own marks: CAKE is best on TREC at 128L (48.50), PyramidKV second (44.50).
    assert _cell(cmp, "cake", "trec")["paper_rank"] == 1
    assert _cell(cmp, "pyramidkv", "trec")["paper_rank"] == 2
    # Ties share the rank.
    ref = load_reference("cake_t1")
    tie = ref[(ref["model"] == LLAMA2) & (ref["budget"] == "1024L") & (ref["column"] == "trec")]
    assert (tie["value"] == 63.5).sum() == 4
    full = compare_table(TABLES["cake_t1"], ref, load_runs(cake_runs))
    ranks = full[(full["model"] == LLAMA2) & (full["budget"] == "1024L") & (full["column"] == "trec")]
    assert set(ranks.loc[ranks["paper"] == 63.5, "paper_rank"]) == {1}
    assert set(ranks.loc[ranks["paper"] == 61.0, "paper_rank"]) == {2}  # StreamingLLM: second distinct value
    assert set(ranks.loc[ranks["paper"] == 60.0, "paper_rank"]) == {0}  # H2O


def test_missing_runs_are_listed(cake_runs):
    cmp = compare_table(TABLES["cake_t1"], load_reference("cake_t1"), load_runs(cake_runs))
    miss = missing_runs(cmp)
    key = miss.set_index(["model", "budget", "method"])["what"]
    assert key[(LLAMA2, "128L", "pyramidkv")] == "no run"
    assert "datasets not run: qmsum" in key[(LLAMA2, "128L", "cake")]
    assert (LLAMA2, "128L", "snapkv") not in key.index
    # Every paper row without a complete run is listed once: 36 rows - snapkv, h2o, streamingllm.
    assert len(miss) == 36 - 3
    # ... with the command that makes its run: the table's experiment preset and the row's choices, which compose.
    command = miss.set_index(["model", "budget", "method"])["command"][(LLAMA2, "128L", "pyramidkv")]
    expected = f"python run.py +experiment=cake_t1 model={LLAMA2} task=longbench method=pyramidkv budget=128L"
    assert command == expected + " task.question_mode=aware"
    from kvbench.app.sweep import Composer

    composer = Composer()
    try:
        for line in miss["command"].drop_duplicates().head(3):
            cfg = composer.compose(line.split()[2:])
            assert cfg.run.tag == "cake" and cfg.model.name == LLAMA2
    finally:
        composer.close()


def test_markdown_and_latex_layout(cake_runs):
    spec = TABLES["cake_t1"]
    cmp = compare_table(spec, load_reference("cake_t1"), load_runs(cake_runs))
    md = render_markdown(spec, cmp, missing_runs(cmp))
    # 36 paper rows x 3 lines: printed as one sub-table per model x budget block, as the paper separates them.
    block = md.split("### Llama2-7B-Chat · 128L")[1].split("###")[0]
    lines = block.splitlines()
    header = next(line for line in lines if line.startswith("| Method"))
    assert "| NrtvQA |" in header and header.rstrip().endswith("| Avg. |")
    ours_snap = next(line for line in lines if line.startswith("| SnapKV | kvbench |"))
    assert NOT_RUN not in ours_snap
    ours_pyr = next(line for line in lines if line.startswith("| PyramidKV | kvbench |"))
    assert ours_pyr.count(NOT_RUN) == 17
    assert "**" in md and "<u>" in md
    assert "Missing runs" in md and "pyramidkv / 128L" in md
    tex = render_latex(spec, cmp)
    assert tex.startswith("% cake_t1") and tex.count("\\begin{table}") == 6 and "\\bottomrule" in tex
    assert "\\textbf{" in tex and "\\underline{" in tex and "--" in tex
    assert "Llama2-7B-Chat" in tex and "$\\Delta$" in tex


def test_question_mode_and_full_cache_sharing(tmp_path):
    """Agnostic tables use agnostic runs only; the full-cache row is shared (any question mode, its own tag)."""
    model = "llama3.1-8b-instruct"
    write_full_run(tmp_path, model, "longbench", "snapkv", "128L", dict.fromkeys(LONGBENCH16, 10.0), tag="adakv_late")
    write_full_run(tmp_path, model, "longbench", "full", "full", dict.fromkeys(LONGBENCH16, 40.0), tag="adakv_late")
    runs = load_runs(tmp_path)
    agn = compare_table(TABLES["adakv_late_t4"], load_reference("adakv_late_t4"), runs)
    assert _cell(agn, "snapkv", "avg", model=model)["missing"] == "no run"
    assert _cell(agn, "full", "avg", budget="full", model=model)["ours"] == 40.0
    aware = compare_table(TABLES["adakv_late_t2"], load_reference("adakv_late_t2"), runs)
    assert _cell(aware, "snapkv", "avg", model=model)["ours"] == 10.0
    # A dataset cell the paper lost (garbled) still shows ours, with no difference.
    nrtv = _cell(aware, "snapkv", "narrativeqa", model=model)
    assert nrtv["ours"] == 10.0 and math.isnan(nrtv["paper"]) and math.isnan(nrtv["diff"])


def test_needlebench_and_ahakv_aggregates_from_runs(tmp_path):
    nb = {
        "single_retrieval_zh": 90.0,
        "single_retrieval_en": 70.0,
        "multi_retrieval_zh": 20.0,
        "multi_retrieval_en": 40.0,
        "multi_reasoning_zh": 50.0,
        "multi_reasoning_en": 30.0,
    }
    model = "mistral-7b-instruct-v0.3"
    write_full_run(tmp_path, model, "needlebench", "cake", "512L", nb, tag="cake_nb32k")
    write_full_run(tmp_path, model, "needlebench", "snapkv", "512L", nb, tag="cake_nb8k")  # the 8K table's run
    lb = {d: 10.0 for d in LONGBENCH21} | {"lcc": 40.0, "repobench-p": 60.0}
    write_full_run(tmp_path, "gemma-7b-it", "longbench_full", "ahakv", "1000L", lb, tag="ahakv")
    runs = load_runs(tmp_path)
    t10 = compare_table(TABLES["cake_t10"], load_reference("cake_t10"), runs)
    assert _cell(t10, "cake", "single_retrieval", budget="512L", model=model)["ours"] == 80.0
    assert _cell(t10, "cake", "overall", budget="512L", model=model)["ours"] == pytest.approx(
        0.4 * 80 + 0.3 * 30 + 0.3 * 40
    )
    assert _cell(t10, "snapkv", "overall", budget="512L", model=model)["missing"] == "no run"
    t11 = compare_table(TABLES["cake_t11"], load_reference("cake_t11"), runs)
    assert _cell(t11, "snapkv", "overall", budget="512L", model=model)["ours"] == pytest.approx(53.0)
    aha = compare_table(TABLES["ahakv_t1"], load_reference("ahakv_t1"), runs)
    assert _cell(aha, "ahakv", "code", budget="1000L", model="gemma-7b-it")["ours"] == 50.0
    assert _cell(aha, "ahakv", "avg", budget="1000L", model="gemma-7b-it")["ours"] == pytest.approx(
        (19 * 10 + 100) / 21
    )


def test_measure_tables_are_reference_only(tmp_path):
    cmp = compare_table(TABLES["cake_t13"], load_reference("cake_t13"), load_runs(tmp_path))
    assert cmp["ours"].isna().all() and cmp["paper"].notna().all()
    assert missing_runs(cmp).empty  # not "missing runs": these tables are not built from accuracy runs


def test_unrecoverable_paper_row_is_marked(tmp_path):
    cmp = compare_table(TABLES["cake_t14"], load_reference("cake_t14"), load_runs(tmp_path))
    row2 = cmp[cmp["row"] == 2].iloc[0]
    assert row2["method"] == "" and row2["missing"] == "paper row has no recoverable method"


def test_write_all_tables_and_plots(cake_runs, tmp_path):
    out = tmp_path / "tables"
    runs = load_runs(cake_runs)
    comparisons = build_all(runs)
    missing = write_tables(comparisons, out)
    for tid in TABLES:
        for ext in ("md", "csv", "tex"):
            assert (out / f"{tid}.{ext}").stat().st_size > 0
    assert (out / "index.md").read_text().count("| [") == len(TABLES)
    listed = pd.read_csv(out / "missing_runs.csv")
    assert len(listed) == len(missing) > 0
    back = pd.read_csv(out / "cake_t1.csv")
    assert set(back.columns) >= {"paper", "ours", "diff", "missing"}
    # Our runs have one budget (128L): the paper's table has two, so its plot is drawn (ours as markers) ...
    plots = plot_paper_tables(comparisons, tmp_path / "plots")
    # (Table 5 prints the same Llama2 128L rows.)
    assert sorted(p.name for p in plots) == ["paper_cake_t1.png", "paper_cake_t5.png"]
    assert all(p.stat().st_size > 1000 for p in plots)
    # ... while the plot of the runs alone has nothing to draw against budget.
    assert plot_score_vs_budget(runs, tmp_path / "plots") == []


def test_custom_spec_on_a_tiny_reference(tmp_path):
    """A small hand-made table: two methods x two budgets x two datasets plus an average."""
    rows = []
    for r, (method, budget) in enumerate([("a", "64L"), ("b", "64L"), ("a", "128L"), ("b", "128L")], start=1):
        for col, val in (("d1", 10.0 * r), ("d2", 20.0 * r), ("avg", 15.0 * r)):
            rows.append(
                dict(table="toy", row=r, model="tiny", model_label="Tiny", task="tiny_niah", question_mode="",
                     method=method, method_label=method.upper(), budget=budget, budget_label=budget, column=col,
                     column_label=col.upper(), dataset="" if col == "avg" else col,
                     kind="aggregate" if col == "avg" else "dataset", value=val, note="")
            )  # fmt: skip
    ref = pd.DataFrame(rows)
    write_full_run(tmp_path, "tiny", "tiny_niah", "a", "64L", {"d1": 10.0, "d2": 20.0})
    write_full_run(tmp_path, "tiny", "tiny_niah", "b", "128L", {"d1": 50.0})
    cmp = compare_table(TableSpec("toy", "Toy", "toy"), ref, load_runs(tmp_path))
    got = cmp.set_index(["method", "budget", "column"])
    assert got.loc[("a", "64L", "avg"), "ours"] == 15.0 and got.loc[("a", "64L", "avg"), "diff"] == 0.0
    assert got.loc[("b", "128L", "d1"), "diff"] == pytest.approx(10.0)
    assert got.loc[("b", "128L", "avg"), "missing"] == "incomplete run, missing: d2"
    assert cmp["ours"].notna().sum() == 4
    assert set(missing_runs(cmp)["method"]) == {"a", "b"}


# --------------------------------------------------------------------------------------------------- plots
def test_budget_value():
    assert budget_value("128L") == ("L", 128.0)
    assert budget_value("0.2x") == ("x", 0.2)
    assert budget_value("64/layer") == ("/layer", 64.0)
    assert budget_value("ratio0.2") == ("x", 0.2)
    assert budget_value("128perlayer") == ("/layer", 128.0)
    assert budget_value("full") is None


def test_needle_grid_from_predictions(tmp_path):
    log = PredictionLog(tmp_path / "predictions.jsonl")
    for length in (1024, 2048):
        for depth in (0.0, 50.0):
            hit = not (length == 2048 and depth == 50.0)
            log.append(
                {
                    "id": f"{length}-{depth}",
                    "prediction": "the value is 4242" if hit else "no idea",
                    "answers": ["4242"],
                    "extra": {"target_length": length, "depth": depth},
                }
            )
    rows = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    grid = needle_grid_from_predictions(rows).set_index(["length", "depth"])["score"]
    assert grid[(1024, 0.0)] == 100.0 and grid[(2048, 50.0)] == 0.0
    assert len(grid) == 4


def test_cli_on_embedded_default_like_runs(tmp_path):
    """`make tables` on tiny runs (as `python run.py` writes them): tables, overview, plots and the paper check."""
    import importlib.util

    runs_root = tmp_path / "runs"
    for method, budget, score in (("snapkv", "64L", 40.0), ("snapkv", "512L", 80.0), ("full", "full", 90.0)):
        for dataset in ("niah_single_2k", "niah_multikey_2k"):
            write_metrics(runs_root, "tiny", "tiny_niah", method, budget, dataset, score, n_samples=3)
            log = PredictionLog(
                run_dir(runs_root, "tiny", "tiny_niah", method, budget, None) / dataset / "predictions.jsonl"
            )
            for i, depth in enumerate((0.0, 50.0, 100.0)):
                log.append(
                    {"id": f"{dataset}-{i}", "prediction": "612" if depth < 100 else "", "answers": ["612"],
                     "extra": {"target_length": 2048, "depth": depth}}
                )  # fmt: skip
    spec = importlib.util.spec_from_file_location(
        "tables_cli", Path(__file__).resolve().parents[2] / "scripts" / "tables.py"
    )
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    out, plots = tmp_path / "tables", tmp_path / "plots"
    rc = cli.main(["--runs", str(runs_root), "--out", str(out), "--plots", str(plots), "--check-paper"])
    assert rc == 0
    assert (out / "index.md").exists() and (out / "cake_t1.tex").exists()
    summary = pd.read_csv(out / "runs_summary.csv")
    assert len(summary) == 3 and set(summary["method"]) == {"snapkv", "full"}
    checks = pd.read_csv(out / "paper_checks.csv")
    assert (checks["within_tolerance"] | checks["erratum"]).all()
    pngs = sorted(p.name for p in plots.glob("*.png"))
    assert "score_vs_budget_tiny_tiny_niah_L.png" in pngs
    # One needle heatmap per run and dataset: 3 runs x 2 datasets.
    needles = [name for name in pngs if name.startswith("needle_tiny_tiny_niah_")]
    assert len(needles) == 6 and "needle_tiny_tiny_niah_snapkv_64L_niah_single_2k.png" in needles
