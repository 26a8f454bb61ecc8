"""What the rebuilt tables and plots print: each paper's own precision and marks, one table per block where the paper
separates them, LaTeX floats that compile, plots with the paper's values overlaid, and the synthetic runs used to
show filled tables.  Synthetic runs of a handful of tables are written once per module (about 2 s)."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import matplotlib
import pandas as pd
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from kvbench.reporting import plots
from kvbench.reporting.aggregate import load_runs
from kvbench.reporting.cells import (
    NOT_PRINTED,
    NOT_RUN,
    column_decimals,
    format_diff,
    format_number,
    printed_decimals,
    tex_escape,
)
from kvbench.reporting.palette import method_colour
from kvbench.reporting.paper_refs import TABLES, errata_keys, load_reference
from kvbench.reporting.render import (
    MAX_LINES,
    LatexError,
    compile_pdf,
    latex_document,
    render_latex,
    render_markdown,
    table_blocks,
)
from kvbench.reporting.synthetic import row_targets, write_synthetic_runs
from kvbench.reporting.tables import build_all, compare_table, missing_runs, write_tables
from kvbench.storage.writers import PredictionLog, atomic_write_json, run_dir
from kvbench.views.conventions import MissingData

#: Tables whose synthetic runs the module writes: ±, one-decimal columns, illegible cells, a 37-row table, an
#: unrecoverable row, ratio budgets and per-category averages.
SYNTHETIC_TABLES = ["cake_t2", "cake_t5", "cake_t14", "adakv_late_t2", "adakv_late_ruler_text", "ahakv_t2", "xkv_t3"]


@pytest.fixture(scope="module")
def synthetic_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("synthetic_runs")
    assert write_synthetic_runs(root, SYNTHETIC_TABLES, noise=1.0, seed=0) > 0
    return root


@pytest.fixture(scope="module")
def comparisons(synthetic_root) -> dict[str, pd.DataFrame]:
    """Every table, compared with the synthetic runs (tables without them: every cell of ours missing)."""
    return build_all(load_runs(synthetic_root))


def _md(table: str, comparisons: dict[str, pd.DataFrame]) -> str:
    cmp = comparisons[table]
    return render_markdown(TABLES[table], cmp, missing_runs(cmp))


def _cells(line: str) -> list[str]:
    """A Markdown table line's cells, without the best / second-best marks."""
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    return [re.sub(r"^\*\*(.*)\*\*$|^<u>(.*)</u>$", lambda m: m.group(1) or m.group(2), c) for c in cells]


def _line(md: str, start: str) -> list[str]:
    return _cells(next(line for line in md.splitlines() if line.startswith(start)))


# ------------------------------------------------------------------------------------------------------- formats
def test_precision_is_read_off_the_printed_cells():
    assert printed_decimals("28.3 ± 0.2") == 1
    assert printed_decimals("1436") == 0 and printed_decimals("4.00") == 2 and printed_decimals("-") is None
    # A dropped trailing zero (CAKE's "64.0" among two-decimal scores) does not change the column's precision.
    assert column_decimals(["64.0", "83.09", "41.41", "2.94"]) == 2
    assert column_decimals(["8", "20"]) == 0 and column_decimals(["62.4", "97.6"]) == 1
    assert column_decimals(["", "-"]) == 2  # nothing to copy: the default
    assert format_number(28.314, 1) == "28.3" and format_number(float("nan"), 2) == NOT_RUN
    assert format_diff(-0.004, 2) == "0.00" and format_diff(1.5, 0) == "+2" and format_diff(float("nan"), 2) == ""


def test_tex_escape_is_ascii_and_escapes_specials():
    text = tex_escape("✓ Mean · Var ± 0.2, α=5 %, Δ #2 & a_b — Müller")
    assert text.isascii()
    for expected in ("\\checkmark{}", "$\\cdot$", "$\\pm$", "$\\alpha$", "\\%", "$\\Delta$", "\\#", "\\&", "a\\_b"):
        assert expected in text, expected
    assert "---" in text and "Muller" in text


def test_paper_cells_print_exactly_as_printed(comparisons):
    t2 = _md("cake_t2", comparisons)
    assert _line(t2, "|  | paper |")[2] == "28.36"
    assert _line(t2, "|  | paper | 28.3 ±")[2] == "28.3 ± 0.2"  # CAKE's "Random" row, not "28.30"
    assert "28.3 $\\pm$ 0.2" in render_latex(TABLES["cake_t2"], comparisons["cake_t2"])
    # Counts, runtimes and batch sizes are integers in the paper; so they are here.
    assert _line(_md("xkv_t4", comparisons), "| FullKV |") == ["FullKV", "1436", "7.18", "4.00", "8"]
    t4 = _md("cake_t4", comparisons)
    assert _line(t4, "| Multi-document QA |") == ["Multi-document QA", "3", "-"]  # the paper's own "-"
    # CAKE prints some full-cache cells with one decimal ("64.0"): kept.
    assert "64.0" in _line(_md("cake_t5", comparisons), "|  | paper |")


def test_ours_take_the_column_precision(comparisons):
    ruler = _md("adakv_late_ruler_text", comparisons)
    header = _line(ruler, "| Budget |")
    ours = _line(ruler, "| 80% | SnapKV | kvbench |")
    values = dict(zip(header, ours, strict=True))
    assert re.fullmatch(r"\d+\.\d\d", values["RULER-16K avg (13 tasks)"])  # printed 87.59
    assert re.fullmatch(r"\d+\.\d", values["S-NIAH-3"])  # printed 62.4
    # Ours on CAKE's "28.3 ± 0.2" row: the column's two decimals, the std stays in the paper's cell and note.
    t2 = _md("cake_t2", comparisons)
    assert re.fullmatch(r"\d+\.\d\d", _line(t2, "| Random | kvbench |")[2])
    assert "mean ± std" in t2


def test_not_run_and_not_printed_are_told_apart(synthetic_root):
    runs = load_runs(synthetic_root)
    runs = runs[~((runs["method"] == "snapkv") & (runs["budget"] == "128L"))]  # one row not run
    spec = TABLES["adakv_late_t2"]
    cmp = compare_table(spec, load_reference("adakv_late_t2"), runs)
    md = render_markdown(spec, cmp, missing_runs(cmp))
    block = md.split("### Llama-3.1-8B-Instruct · 128\n")[1].split("###")[0]
    header = _line(block, "| Method |")
    snap_ours = dict(zip(header, _line(block, "| SnapKV | kvbench |"), strict=True))
    assert set(list(snap_ours.values())[2:]) == {NOT_RUN}
    # Illegible paper cells are "?", while ours (a synthetic run) has a number there and no difference.
    lines = block.splitlines()
    i = lines.index(next(line for line in lines if line.startswith("| SLM (StreamingLLM) | kvbench |")))
    ours, paper, delta = (dict(zip(header, _cells(line), strict=True)) for line in lines[i : i + 3])
    illegible = [c for c in header[2:] if paper[c] == NOT_PRINTED]
    assert illegible and all(re.fullmatch(r"\d+\.\d\d", ours[c]) and delta[c] == "" for c in illegible)
    assert "not printed or illegible" in md and "not run by us" in md
    assert "snapkv / 128L" in md.split("Missing runs (")[1]


def test_rows_that_can_never_be_measured_print_the_paper_only(comparisons):
    t13 = _md("cake_t13", comparisons)
    assert "| kvbench |" not in t13 and "| Δ |" not in t13 and "Reference only" in t13
    assert _line(t13, "| Budget |")[:2] == ["Budget", "Method"]  # no ours/paper column
    t14 = _md("cake_t14", comparisons)
    lines = t14.splitlines()
    i = lines.index(next(line for line in lines if "H or V (unrecoverable)" in line))
    assert _cells(lines[i])[1] == "paper" and _cells(lines[i + 1])[0] == "H + V + Mean"
    assert missing_runs(comparisons["cake_t14"]).empty  # an unrecoverable row is not a run to make


def test_long_tables_are_split_per_block_as_the_paper_does(comparisons):
    t5 = _md("cake_t5", comparisons)
    blocks = re.findall(r"^### (.+)$", t5, flags=re.M)
    assert blocks == [f"Llama2-7B-Chat · {b}L" for b in (64, 128, 256, 512, 1024, 2048)]
    for part in t5.split("\n### ")[1:]:
        assert _line(part, "| Full |")[1] == "kvbench"  # the full cache heads every budget block
    for table in TABLES:
        md = _md(table, comparisons)
        bodies = re.findall(r"\|[-:|]+\|\n((?:\|.*\n)+)", md)
        # A longer body only where the table is already split one block apart (kvpress's leaderboard: 13 presses
        # at one ratio).
        if any(body.count("\n") > MAX_LINES for body in bodies):
            assert len(bodies) == len(table_blocks(comparisons[table])), table
    # Short tables stay whole: XKV's two ratios (10 rows) and the RULER numbers.
    assert "###" not in _md("adakv_late_ruler_text", comparisons)


def test_latex_is_complete_floats(comparisons):
    labels = []
    for table in TABLES:
        tex = render_latex(TABLES[table], comparisons[table])
        assert tex.isascii(), table
        n = tex.count("\\begin{table}")
        assert n >= 1 and tex.count("\\end{table}") == n, table
        for part in ("\\caption*{", "\\label{", "\\toprule", "\\bottomrule", "\\resizebox{\\ifdim\\width>\\linewidth"):
            assert tex.count(part) == n, (table, part)
        labels += re.findall(r"\\label\{([^}]+)\}", tex)
    assert len(labels) == len(set(labels))
    assert "SYNTHETIC" in render_latex(TABLES["cake_t2"], comparisons["cake_t2"])
    # One caption number (the paper's, in the text) and paper-facing section titles, not the table ids.
    assert "\\caption*{CAKE, Table 5: " in render_latex(TABLES["cake_t5"], comparisons["cake_t5"])
    document = latex_document(["cake_t5"])
    assert "\\section*{CAKE, Table 5: Llama2-7B-Chat" in document and "\\section{cake" not in document


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="no pdflatex (make setup-latex installs it)")
def test_every_generated_tex_compiles(comparisons, tmp_path):
    write_tables(comparisons, tmp_path)
    document = (tmp_path / "all_tables.tex").read_text()
    assert all(f"\\input{{{t}.tex}}" in document for t in TABLES)
    pdf = compile_pdf(tmp_path / "all_tables.tex")
    assert pdf.stat().st_size > 10_000
    log = (tmp_path / "all_tables.log").read_text(errors="replace")
    assert "Float too large" not in log


def test_compile_pdf_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    with pytest.raises(LatexError, match="texlive-latex-recommended"):
        compile_pdf(tmp_path / "all_tables.tex")


# ------------------------------------------------------------------------------------------------------ synthetic
def test_synthetic_targets_give_back_the_printed_aggregates():
    errata = errata_keys()
    checked = 0
    for table, spec in TABLES.items():
        if spec.kind != "scores":
            continue
        ref = load_reference(table)
        datasets = list(dict.fromkeys(ref.loc[ref["kind"] == "dataset", "dataset"]))
        for _, cells in ref.groupby("row"):
            first = cells.to_dict("records")[0]
            if not first["method"]:
                continue
            targets = row_targets(spec, cells, datasets)
            printed = cells[(cells["kind"] == "aggregate") & cells["value"].notna()]
            for column, value in zip(printed["column"], printed["value"], strict=True):
                if (table, first["model"], first["method"], first["budget"], column) in errata:
                    continue
                try:
                    got = spec.convention.aggregate(column, targets, datasets)
                except MissingData:
                    pytest.fail(f"{table} row {first['row']}: synthetic run lacks datasets for {column}")
                assert got == pytest.approx(value, abs=spec.tolerance + 1e-9), (table, first["row"], column)
                checked += 1
    assert checked > 500


def test_synthetic_runs_are_marked_everywhere(synthetic_root, comparisons):
    one = next(synthetic_root.rglob("metrics.json"))
    metrics = json.loads(one.read_text())
    assert metrics["synthetic"] is True and metrics["metric"] == "synthetic"
    assert load_runs(synthetic_root)["synthetic"].all()
    assert "Synthetic runs" in _md("cake_t5", comparisons)
    assert not comparisons["cake_t13"]["synthetic"].any()


# ---------------------------------------------------------------------------------------------------------- plots
def _panel(cmp: pd.DataFrame, column: str = "avg") -> pd.DataFrame:
    part = cmp[(cmp["column"] == column) & (cmp["method"] != "")].copy()
    part["x"] = [p[1] if p else float("nan") for p in part["budget"].map(plots.budget_value)]
    return part


def test_paper_panel_overlays_the_printed_values(comparisons):
    part = _panel(comparisons["cake_t5"])
    part.loc[(part["method"] == "h2o") & (part["budget"] != "128L"), "ours"] = float("nan")  # H2O ran one budget
    fig, ax = plt.subplots()
    methods = [m for m in dict.fromkeys(part["method"]) if m != "full"]
    plots.draw_paper_panel(ax, part, plots.method_colours(methods))
    lines = ax.get_lines()
    ours = [ln for ln in lines if ln.get_linestyle() == "-" and ln.get_marker() == "o"]
    paper = [ln for ln in lines if ln.get_linestyle() == "--" and ln.get_marker() == "o"]
    assert len(ours) == len(paper) == 6
    assert sorted(len(ln.get_xdata()) for ln in ours) == [1, 6, 6, 6, 6, 6]  # H2O: a marker, still drawn
    assert all(len(ln.get_xdata()) == 6 for ln in paper)
    # Full cache: horizontal lines (ours solid, paper dashed) at its average, not a point at some budget.
    full = part[part["method"] == "full"].iloc[0]
    flat = [ln for ln in lines if ln.get_marker() in ("None", None, "") and len(set(ln.get_ydata())) == 1]
    assert {(ln.get_linestyle(), round(float(ln.get_ydata()[0]), 6)) for ln in flat} == {
        ("-", round(full["ours"], 6)),
        ("--", round(full["paper"], 6)),
    }
    assert [t.get_text() for t in ax.get_xticklabels()] == ["64L", "128L", "256L", "512L", "1024L", "2048L"]
    plt.close(fig)


def test_paper_table_plots_are_written_per_table(comparisons, tmp_path):
    paths = plots.plot_paper_tables(comparisons, tmp_path)
    names = sorted(p.name for p in paths)
    # Tables with two budgets or more and runs of ours; single-budget tables (cake_t2, ahakv_t2) have no plot.
    assert names == ["paper_adakv_late_ruler_text.png", "paper_adakv_late_t2.png", "paper_cake_t1.png",
                     "paper_cake_t5.png", "paper_xkv_t3.png"]  # fmt: skip


def test_full_cache_run_at_a_budget_is_a_line(tmp_path):
    part = pd.DataFrame({"method": ["snapkv", "snapkv", "h2o"], "x": [64.0, 512.0, 64.0], "score": [40, 80, 30]})
    full = pd.DataFrame({"budget": ["64L"], "score": [90.0]})  # the demo's full cache ran "at" 64L
    fig, ax = plt.subplots()
    plots.draw_runs_panel(ax, part, full, "L")
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert list(lines["full cache"].get_ydata()) == [90.0, 90.0] and lines["full cache"].get_linestyle() == "--"
    # Lines are named and coloured by the one palette of every view (kvbench.reporting.palette).
    assert len(lines["SnapKV"].get_xdata()) == 2 and len(lines["H2O"].get_xdata()) == 1
    assert lines["SnapKV"].get_color() == method_colour("snapkv") != method_colour("h2o")
    plt.close(fig)


def test_runs_panel_draws_one_full_cache_line_and_interval_bands():
    part = pd.DataFrame({"method": ["snapkv", "snapkv"], "x": [64.0, 128.0], "score": [40.0, 80.0],
                         "low": [30.0, 70.0], "high": [50.0, 90.0]})  # fmt: skip
    full = pd.DataFrame({"budget": ["64L", "full"], "score": [91.0, 90.0]})  # method=full under two budgets
    fig, ax = plt.subplots()
    plots.draw_runs_panel(ax, part, full, "L")
    full_lines = [ln for ln in ax.get_lines() if ln.get_label() == "full cache"]
    assert len(full_lines) == 1 and list(full_lines[0].get_ydata()) == [90.0, 90.0]  # the run under "full"
    [band] = ax.collections
    ys = band.get_paths()[0].vertices[:, 1]
    assert min(ys) == 30.0 and max(ys) == 90.0
    plt.close(fig)


def test_needle_heatmaps_per_dataset_in_score_units(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(plots, "plot_needle_heatmap", lambda cells, path, **kw: calls.append((cells, path, kw)) or path)
    root = tmp_path / "runs"
    for dataset, hits in (("niah_single_2k", (True, True, False)), ("niah_multikey_2k", (True, False, False))):
        folder = run_dir(root, "tiny", "tiny_niah", "snapkv", "64L", "agnostic") / dataset
        atomic_write_json(folder / "metrics.json", {"model": "tiny", "task": "tiny_niah", "dataset": dataset,
                          "method": "snapkv", "budget": "64L", "tag": "agnostic", "question_mode": "agnostic",
                          "metric": "string_match_all", "score": 100.0 * sum(hits) / 3, "n_samples": 3,
                          "config_hash": "h"})  # fmt: skip
        log = PredictionLog(folder / "predictions.jsonl")
        for i, hit in enumerate(hits):
            log.append({"id": str(i), "prediction": "7 7" if hit else "", "answers": ["7 7"],
                        "extra": {"target_length": 2048, "depth": 50.0 * i}})  # fmt: skip
    plots.plot_needle_heatmaps(load_runs(root), tmp_path / "plots")
    names = [Path(path).name for _, path, _ in calls]
    assert names == [
        "needle_tiny_tiny_niah_snapkv_64L_agnostic_niah_multikey_2k.png",
        "needle_tiny_tiny_niah_snapkv_64L_agnostic_niah_single_2k.png",
    ]  # one per dataset; "agnostic" (tag and question mode) named once
    for _, _, kw in calls:
        assert kw["vmax"] == 100.0 and kw["score_key"] == "string_match_all (0-100)"
    single = calls[1][0]
    assert sum(c["string_match_all (0-100)"] for c in single) / len(single) == pytest.approx(200 / 3)


# ------------------------------------------------------------------------------------------------------------ CLI
def _cli():
    spec = importlib.util.spec_from_file_location(
        "tables_cli", Path(__file__).resolve().parents[2] / "scripts" / "tables.py"
    )
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    return cli


def test_cli_synthetic_demo_and_pdf(tmp_path, capsys):
    cli = _cli()
    out, figs = tmp_path / "tables", tmp_path / "plots"
    argv = ["--runs", str(tmp_path / "runs"), "--out", str(out), "--plots", str(figs), "--synthetic", "0.5",
            "--tables", "cake_t2", "xkv_t3"]  # fmt: skip
    if shutil.which("pdflatex"):
        argv.append("--pdf")
    assert cli.main(argv) == 0
    assert "28.3 ± 0.2" in (out / "cake_t2.md").read_text()
    assert (figs / "paper_xkv_t3.png").exists()
    assert shutil.which("pdflatex") is None or (out / "all_tables.pdf").exists()
    repo_runs = Path(__file__).resolve().parents[2] / "results" / "runs"
    with pytest.raises(SystemExit):
        cli.main(["--runs", str(repo_runs), "--synthetic", "1", "--out", str(out), "--no-plots"])
    assert "folder of their own" in capsys.readouterr().err


def test_paper_plot_draws_our_interval_from_the_runs_summary(synthetic_root, comparisons, tmp_path):
    runs = load_runs(synthetic_root)
    cmp = comparisons["cake_t5"]
    model = cmp.loc[cmp["method"] == "snapkv", "model"].iloc[0]
    mine = runs[(runs["model"] == model) & (runs["method"] == "snapkv") & (runs["task"] == "longbench")]
    # CAKE's "avg" is the LongBench-16 mean: summary.json's longbench16 average gives its interval.
    for path in mine.drop_duplicates("budget")["path"]:
        summary = {"averages": {"longbench16": {"score": 1.0, "ci95": [20.0, 30.0]}}}
        atomic_write_json(Path(path).parent.parent / "summary.json", summary)
    key = plots._average_key("cake_t5", "avg")
    assert key == "longbench16"
    panel = plots.with_run_intervals(cmp[(cmp["column"] == "avg") & (cmp["model"] == model)], runs, key)
    snap = panel[panel["method"] == "snapkv"]
    assert (snap["low"] == 20.0).all() and (snap["high"] == 30.0).all()
    assert panel[panel["method"] != "snapkv"]["low"].isna().all()  # the other runs have no summary.json
    panel = panel.assign(x=[p[1] if p else float("nan") for p in panel["budget"].map(plots.budget_value)])
    fig, ax = plt.subplots()
    plots.draw_paper_panel(ax, panel, plots.method_colours(list(dict.fromkeys(panel["method"]))))
    [band] = ax.collections  # snapkv's interval, and only its
    ys = band.get_paths()[0].vertices[:, 1]
    assert (min(ys), max(ys)) == (20.0, 30.0)
    plt.close(fig)
