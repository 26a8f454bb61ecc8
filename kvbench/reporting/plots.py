"""Plots: score versus budget (per paper table, and per model × task of any runs) and needle heatmaps.

* :func:`plot_paper_tables`: one PNG per paper table with several budgets (``paper_<table>.png``): x = budget
  (the paper's labels; ``<n>L`` on a log2 axis), y = the table's summary column (its average or NeedleBench
  overall), one panel per model (and question mode).  Ours: solid lines with filled markers and, given the runs,
  their 95 % interval (``summary.json``'s average that equals the column) as a band; the paper's printed
  values: dashed lines with open markers, same colour per method (:mod:`kvbench.reporting.palette`); full
  cache: horizontal lines (solid ours, dashed the paper's).  A method with a single budget is still drawn (a
  marker).
* :func:`plot_score_vs_budget`: the same view of whatever runs exist (e.g. the tiny model's), per model × task
  (× tag × question mode): y = the mean score over the datasets every plotted run has, with each run's 95 %
  interval as a band (where the mean is over all of its datasets) and a note under 10 samples per dataset; the
  full-cache method is one horizontal line (the run under the budget ``full`` first) whatever budget it ran
  under.  A group with a single budget is skipped (nothing to plot
  against).
* :func:`plot_needle_heatmaps`: one PNG per needle run and dataset (any task whose predictions record a needle
  depth and a context length in ``extra``): x = context length, y = depth, colour = mean per-sample score on the
  dataset's own 0-100 scale (the title's overall score is on the same scale).  Per-sample scores are read from
  the row (``score`` / ``extra.score``, 0-100) when present, else recomputed: the needle-grid word-set recall of
  :mod:`kvbench.metrics.synthetic` for ``needle_grid`` runs, RULER's ``string_match_all`` (share of reference
  strings contained in the prediction, case-insensitive) otherwise.  The heatmap itself is drawn by
  :func:`kvbench.views.needle_heatmap.plot_needle_heatmap`, the same function that writes each run's heatmap.

Everything is written with the non-interactive Agg backend, so this runs on headless machines.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.lines import Line2D

from kvbench.reporting.palette import FULL_CACHE_COLOUR, method_colour, method_label
from kvbench.reporting.paper_refs import TABLES, load_reference
from kvbench.reporting.pivot import SMALL_N
from kvbench.storage.writers import PREDICTIONS_FILE
from kvbench.views.conventions import LONGBENCH14, LONGBENCH16
from kvbench.views.needle_heatmap import plot_needle_heatmap

_BUDGET_RE = re.compile(r"^(?P<n>\d+(?:\.\d+)?)(?P<unit>L|/layer|x|cr)$")


_NAMED_RE = {
    re.compile(r"^ratio(?P<n>\d+(?:\.\d+)?)$"): "x",
    re.compile(r"^(?P<n>\d+)perlayer$"): "/layer",
    re.compile(r"^cr(?P<n>\d+(?:\.\d+)?)$"): "cr",
}
_AXIS_LABEL = {
    "L": "budget n (total n × layers)",
    "/layer": "tokens per layer",
    "x": "kept ratio",
    "cr": "compression ratio (kvpress)",
}
_SUFFIX = {"L": "L", "/layer": "per-layer", "x": "ratio", "cr": "compression"}


def budget_value(budget: str) -> tuple[str, float] | None:
    """``("L", 128.0)`` for ``128L``; ``("/layer", 64.0)`` for ``64/layer`` or ``64perlayer``; ``("x", 0.2)`` for
    ``0.2x`` or ``ratio0.2``; ``None`` for ``full`` or unknown forms."""
    m = _BUDGET_RE.match(str(budget))
    if m:
        return m.group("unit"), float(m.group("n"))
    for pattern, unit in _NAMED_RE.items():
        m = pattern.match(str(budget))
        if m:
            return unit, float(m.group("n"))
    return None


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", str(text)).strip("-")


def _file_name(prefix: str, *parts: str) -> str:
    """``prefix_part_part.png`` from the non-empty parts, each once."""
    kept = list(dict.fromkeys(_safe(p) for p in parts if p))
    return "_".join([prefix, *kept]) + ".png"


def _mode_part(question_mode: str, tag: str) -> str:
    """The question mode worth naming: not the default (``aware``), nor one the tag already says
    (``agnostic`` in ``adakv_late_agnostic``)."""
    return "" if question_mode in ("", "aware") or question_mode in str(tag) else question_mode


def method_colours(methods: Sequence[str]) -> dict[str, Any]:
    """Each method's colour from the one palette of every view (:mod:`kvbench.reporting.palette`)."""
    return {m: method_colour(m) for m in methods}


def _budget_axis(ax: Any, form: str, xs: Sequence[float], labels: Sequence[str] | None = None) -> None:
    """Log2 axis for token budgets; ticks at the plotted budgets (with the paper's labels when given)."""
    if form in ("L", "/layer") and xs and min(xs) > 0:
        ax.set_xscale("log", base=2)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(list(labels) if labels else [f"{x:g}" for x in xs], fontsize=8)
    ax.minorticks_off()
    ax.set_xlabel(_AXIS_LABEL.get(form, "budget"))
    ax.grid(alpha=0.3)


# ----------------------------------------------------------------------------------------------- paper tables
def summary_column(cmp: pd.DataFrame) -> str | None:
    """The column a table's score-vs-budget plot shows: its average, NeedleBench overall, or its only column."""
    columns = list(dict.fromkeys(cmp["column"]))
    for name in ("avg", "overall"):
        if name in columns:
            return name
    return columns[0] if len(columns) == 1 else None


def draw_paper_panel(ax: Any, part: pd.DataFrame, colours: dict[str, Any]) -> None:
    """One model's panel from comparison cells of one column (plus ``x``, the budget's number): ours solid and the
    paper's dashed per method, full cache as horizontal lines (solid ours, dashed the paper's)."""
    comp = part[(part["method"] != "full") & part["x"].notna()]
    for method, mg in comp.groupby("method", sort=False):
        mg = mg.sort_values("x")
        ours, paper = mg[mg["ours"].notna()], mg[mg["paper"].notna()]
        ax.plot(ours["x"], ours["ours"], "-o", color=colours[method], markersize=5)
        if "low" in ours and ours["low"].notna().all() and len(ours):
            ax.fill_between(ours["x"], ours["low"], ours["high"], color=colours[method], alpha=0.15, linewidth=0)
        ax.plot(paper["x"], paper["paper"], "--o", color=colours[method], markersize=5, mfc="none", alpha=0.8)
    for rec in part[part["method"] == "full"].itertuples():
        if not pd.isna(rec.ours):
            ax.axhline(rec.ours, color="black", linestyle="-", linewidth=1)
        if not pd.isna(rec.paper):
            ax.axhline(rec.paper, color="black", linestyle="--", linewidth=1, alpha=0.7)
    ticks = comp.drop_duplicates("budget").sort_values("x")
    form = budget_value(ticks["budget"].iloc[0])[0] if len(ticks) else ""
    labels = [str(label) or str(budget) for label, budget in zip(ticks["budget_label"], ticks["budget"], strict=True)]
    _budget_axis(ax, form, list(ticks["x"]), labels)
    ax.set_xlabel("budget (the paper's labels)")
    ax.set_ylabel(str(part["column_label"].iloc[0]))


def _average_key(table: str, column: str) -> str | None:
    """The ``summary.json`` average that equals a table's summary column (its interval is that average's), if any."""
    spec = TABLES.get(table)
    if spec is None:
        return None
    convention = spec.convention
    if convention.name == "mean" and column == "avg":
        if convention.datasets:
            datasets = set(convention.datasets)
        else:  # the table's dataset columns (as compare_table averages them)
            ref = load_reference(table)
            datasets = set(ref.loc[ref["kind"] == "dataset", "dataset"])
        return {frozenset(LONGBENCH16): "longbench16", frozenset(LONGBENCH14): "longbench14"}.get(frozenset(datasets))
    if convention.name == "longbench21" and column == "avg":
        return "longbench21"
    if convention.name == "needlebench" and column == "overall":
        return "needlebench_overall"
    return "mean" if convention.name == "run_mean" else None


def with_run_intervals(data: pd.DataFrame, runs: pd.DataFrame | None, key: str | None) -> pd.DataFrame:
    """``data`` (comparison cells of one column) with ``low``/``high``: the 95 % interval of our value, read from
    the matching run's ``summary.json`` average ``key`` (NaN where there is none)."""
    lows, highs = [], []
    for rec in data.to_dict("records"):
        interval = None
        if runs is not None and key is not None and not runs.empty and not pd.isna(rec["ours"]):
            hit = runs[
                (runs["model"] == rec["model"])
                & (runs["task"] == rec["task"])
                & (runs["method"] == rec["method"])
                & (runs["budget"] == rec["budget"])
                & ((runs["tag"].isna()) if not rec["tag"] else (runs["tag"] == rec["tag"]))
            ]
            if rec["question_mode"] and rec["method"] != "full":
                hit = hit[hit["question_mode"] == rec["question_mode"]]
            if not hit.empty:
                interval = _summary_interval(Path(hit["path"].iloc[0]).parent.parent / "summary.json", key)
        lows.append(interval[0] if interval else math.nan)
        highs.append(interval[1] if interval else math.nan)
    return data.assign(low=lows, high=highs)


def _summary_interval(path: Path, key: str) -> list[float] | None:
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return ((payload.get("averages") or {}).get(key) or {}).get("ci95")


def plot_paper_table(
    table: str, cmp: pd.DataFrame, out_dir: str | Path, runs: pd.DataFrame | None = None
) -> Path | None:
    """``paper_<table>.png`` (see the module docstring); ``None`` when no model of the table has two budgets or
    no compressed row has a value of ours.  ``runs`` (:func:`~kvbench.reporting.aggregate.load_runs`' frame):
    where given, our lines get their 95 % intervals (the runs' ``summary.json``) as bands."""
    column = summary_column(cmp)
    if column is None:
        return None
    data = cmp[(cmp["column"] == column) & (cmp["method"] != "")].copy()
    data = with_run_intervals(data, runs, _average_key(table, column))
    data["x"] = [p[1] if p is not None else math.nan for p in data["budget"].map(budget_value)]
    compressed = data[(data["method"] != "full") & data["x"].notna()]
    if compressed["ours"].isna().all() or compressed.groupby(["model_label", "question_mode"])["x"].nunique().max() < 2:
        return None
    panels = list(dict.fromkeys(zip(data["model_label"], data["question_mode"], strict=True)))
    colours = method_colours(list(dict.fromkeys(compressed["method"])))
    width = 4.6 * len(panels) + 2.0
    fig, axes = plt.subplots(1, len(panels), figsize=(width, 4.0), squeeze=False)
    show_mode = data["question_mode"].nunique() > 1
    for ax, (model_label, mode) in zip(axes[0], panels, strict=True):
        draw_paper_panel(ax, data[(data["model_label"] == model_label) & (data["question_mode"] == mode)], colours)
        ax.set_title(f"{model_label} · {mode}" if show_mode else model_label, fontsize=9)
    handles = [Line2D([], [], color=c, marker="o", label=method_label(m)) for m, c in colours.items()]
    paper_name = spec.paper if (spec := TABLES.get(table)) is not None else "paper"
    handles += [
        Line2D([], [], color="black", linestyle="-", marker="o", label="kvbench\n(runs: solid, filled)"),
        Line2D([], [], color="black", linestyle="--", marker="o", mfc="none", label=f"as printed in {paper_name}"),
    ]
    if (data["method"] == "full").any():
        handles.append(
            Line2D([], [], color=FULL_CACHE_COLOUR, linewidth=1, label="full cache\n(solid kvbench, dashed paper)")
        )
    fig.legend(handles=handles, loc="center right", fontsize=8, frameon=False)
    title = f"{spec.paper}, {spec.title}" if spec is not None else table
    if bool(cmp["synthetic"].any()):
        title += "\nSYNTHETIC runs (paper values plus noise), not measurements"
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1 - 2.0 / width, 1))
    path = Path(out_dir) / _file_name("paper", table)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_paper_tables(
    comparisons: dict[str, pd.DataFrame], out_dir: str | Path, runs: pd.DataFrame | None = None
) -> list[Path]:
    """:func:`plot_paper_table` for every table that can be plotted (with the runs' intervals when given)."""
    paths = [plot_paper_table(table, cmp, out_dir, runs) for table, cmp in comparisons.items()]
    return [p for p in paths if p is not None]


# ------------------------------------------------------------------------------------------------------ any runs
def draw_runs_panel(ax: Any, part: pd.DataFrame, full: pd.DataFrame, form: str) -> None:
    """Score versus budget of runs: ``part`` (``method, x, score`` and optionally ``low``/``high``, the 95 %
    interval, drawn as a band) one line per method (a marker where a method ran one budget), ``full`` (``budget,
    score``) one horizontal dashed line: the run under the budget ``full`` if there is one, else the first."""
    for method, mg in part.groupby("method", sort=True):
        mg = mg.sort_values("x")
        colour = method_colour(method)
        ax.plot(mg["x"], mg["score"], "-o", color=colour, label=method_label(method))
        if {"low", "high"} <= set(mg.columns) and mg["low"].notna().all():
            ax.fill_between(mg["x"], mg["low"], mg["high"], color=colour, alpha=0.15, linewidth=0)
    if not full.empty:
        rec = full.sort_values("budget", key=lambda b: b != "full").iloc[0]
        ax.axhline(rec["score"], linestyle="--", color=FULL_CACHE_COLOUR, linewidth=1, label="full cache")
    _budget_axis(ax, form, sorted(part["x"].unique()))


def plot_score_vs_budget(runs: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """Write score-versus-budget plots of the runs; returns the PNG paths (none when no group has two budgets)."""
    out = Path(out_dir)
    written: list[Path] = []
    if runs.empty:
        return written
    runs = runs.assign(tag=runs["tag"].fillna(""))
    for (model, task, tag, qmode), g in runs.groupby(["model", "task", "tag", "question_mode"], sort=True):
        per_run = g.groupby(["method", "budget"])["dataset"].apply(set)
        common = set.intersection(*per_run.tolist()) if len(per_run) else set()
        use = g[g["dataset"].isin(common)] if common else g
        means = use.groupby(["method", "budget"])["score"].mean().reset_index()
        means = _with_intervals(means, use)
        means["parsed"] = means["budget"].map(budget_value)
        full = means[means["method"] == "full"]
        comp = means[(means["method"] != "full") & means["parsed"].notna()]
        for form in sorted({p[0] for p in comp["parsed"]}):
            part = comp[comp["parsed"].map(lambda p, f=form: p[0] == f)]
            part = part.assign(x=part["parsed"].map(lambda p: p[1]))
            if part["x"].nunique() < 2:
                continue  # one budget: nothing to plot against
            fig, ax = plt.subplots(figsize=(8.0, 4.2))
            draw_runs_panel(ax, part, full, form)
            n_ds = len(common) if common else g["dataset"].nunique()
            ax.set_ylabel(f"mean score over {n_ds} dataset(s)")
            n_min = int(pd.to_numeric(use["n_samples"], errors="coerce").min())
            if n_min < SMALL_N:
                ax.text(0.01, 0.01, f"n={n_min} samples per dataset: wide intervals", transform=ax.transAxes,
                        fontsize=8, color="#b26a00")  # fmt: skip
            mode = _mode_part(qmode, tag)
            title = " · ".join(x for x in (model, task, tag, mode) if x)
            ax.set_title(title + (" · SYNTHETIC" if bool(g["synthetic"].any()) else ""), fontsize=10)
            ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
            fig.tight_layout()
            path = out / _file_name("score_vs_budget", model, task, tag, mode, _SUFFIX[form])
            out.mkdir(parents=True, exist_ok=True)
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written.append(path)
    return written


def _with_intervals(means: pd.DataFrame, use: pd.DataFrame) -> pd.DataFrame:
    """``means`` with ``low``/``high``: summary.json's 95 % interval of each run's mean, when the plotted mean is
    over all of the run's datasets (else NaN: no band)."""
    lows, highs = [], []
    for rec in means.itertuples():
        rows = use[(use["method"] == rec.method) & (use["budget"] == rec.budget)]
        summary = Path(rows["path"].iloc[0]).parent.parent / "summary.json"
        interval = None
        try:
            payload = json.loads(summary.read_text(encoding="utf-8"))
            if len(payload.get("datasets") or []) == len(rows):
                interval = (payload.get("averages", {}).get("mean") or {}).get("ci95")
        except (OSError, ValueError):
            interval = None
        lows.append(interval[0] if interval else math.nan)
        highs.append(interval[1] if interval else math.nan)
    return means.assign(low=lows, high=highs)


def _string_match_all(prediction: str, references: Sequence[str]) -> float:
    """RULER ``string_match_all`` for one sample: share of references contained in the prediction (lower-cased)."""
    if not references:
        return 0.0
    pred = prediction.lower()
    return sum(ref.lower() in pred for ref in references) / len(references)


def _first(extra: dict[str, Any], keys: Sequence[str]) -> Any:
    for k in keys:
        if extra.get(k) is not None:
            return extra[k]
    return None


DEPTH_KEYS = ("depth", "depth_percent", "needle_depth")
LENGTH_KEYS = ("target_length", "context_length", "length")


def needle_grid_from_predictions(
    rows: Sequence[dict[str, Any]], scorer: Callable[[str, Sequence[str]], float] = _string_match_all
) -> pd.DataFrame:
    """``length, depth, score`` (score in 0-100, mean per cell) from prediction rows with needle metadata."""
    cells = []
    for row in rows:
        extra = row.get("extra") or {}
        depth, length = _first(extra, DEPTH_KEYS), _first(extra, LENGTH_KEYS)
        if depth is None or length is None:
            continue
        score = row.get("score", extra.get("score"))
        if score is None:
            score = 100.0 * scorer(str(row.get("prediction", "")), list(row.get("answers") or []))
        cells.append({"length": int(length), "depth": float(depth), "score": float(score)})
    if not cells:
        return pd.DataFrame(columns=["length", "depth", "score"])
    return pd.DataFrame(cells).groupby(["length", "depth"], as_index=False)["score"].mean()


def _read_predictions(path: Path) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:  # a torn last line of a killed run
                    continue
    return rows


def plot_needle_heatmaps(runs: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """One heatmap per run and dataset whose predictions carry needle depth and length (0-100 colour scale)."""
    written: list[Path] = []
    if runs.empty:
        return written
    runs = runs.assign(tag=runs["tag"].fillna(""))
    for rec in runs.sort_values(["model", "task", "method", "budget", "tag", "question_mode", "dataset"]).itertuples():
        pred = Path(rec.path).parent / PREDICTIONS_FILE
        if not pred.exists():
            continue
        grid = needle_grid_from_predictions(_read_predictions(pred), _scorer_for(rec.task))
        if grid.empty or math.isnan(grid["score"].mean()):
            continue
        mode = _mode_part(rec.question_mode, rec.tag)
        title = " · ".join(x for x in (rec.model, rec.method, rec.budget, rec.tag, mode) if x) + f"\n{rec.dataset}"
        name = _file_name("needle", rec.model, rec.task, rec.method, rec.budget, rec.tag, mode, rec.dataset)
        metric = f"{rec.metric or 'score'} (0-100)"
        cells = [{"length": r.length, "depth": r.depth, metric: r.score} for r in grid.itertuples()]
        written.append(plot_needle_heatmap(cells, Path(out_dir) / name, title=title, score_key=metric, vmax=100.0))
    return written


def _scorer_for(task: str) -> Callable[[str, Sequence[str]], float]:
    """Per-sample scorer (0-1) used when prediction rows carry no score: needle-grid recall or string match."""
    if task == "needle_grid":
        try:
            from kvbench.metrics.synthetic import needle_set_recall
        except ImportError:
            return _string_match_all
        return lambda prediction, _answers: needle_set_recall(prediction)
    return _string_match_all
