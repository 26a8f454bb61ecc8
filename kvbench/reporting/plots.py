"""Plots from the tidy runs table: score versus budget per method and model, and needle heatmaps.

* :func:`plot_score_vs_budget`: one PNG per model × task (× tag × question mode): x = budget (``<n>L`` and
  ``<n>/layer`` on a log2 axis of n, ``<r>x`` on the ratio), y = the mean score over the datasets that every
  plotted run has; the full cache is a dashed horizontal line.
* :func:`plot_needle_heatmaps`: one PNG per needle run (any task whose predictions record a needle depth and a
  context length in ``extra``), x = context length, y = depth, colour = mean per-sample score.  Per-sample scores
  are read from the row (``score`` / ``extra.score``) when present, else recomputed: the needle-grid word-set
  recall of :mod:`kvbench.metrics.synthetic` for ``needle_grid`` runs, RULER's ``string_match_all`` (share of
  reference strings contained in the prediction, case-insensitive) otherwise.  The heatmap itself is drawn by
  :func:`kvbench.tasks.needle_grid.plot_needle_heatmap`, the same function that writes each run's heatmap.

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

from kvbench.results import PREDICTIONS_FILE
from kvbench.tasks.needle_grid import plot_needle_heatmap

_BUDGET_RE = re.compile(r"^(?P<n>\d+(?:\.\d+)?)(?P<unit>L|/layer|x)$")


_NAMED_RE = {re.compile(r"^ratio(?P<n>\d+(?:\.\d+)?)$"): "x", re.compile(r"^(?P<n>\d+)perlayer$"): "/layer"}


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


def plot_score_vs_budget(runs: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """Write score-versus-budget plots; returns the PNG paths (none when there are no runs)."""
    out = Path(out_dir)
    written: list[Path] = []
    if runs.empty:
        return written
    out.mkdir(parents=True, exist_ok=True)
    runs = runs.assign(tag=runs["tag"].fillna(""))
    group_keys = ["model", "task", "tag", "question_mode"]
    for (model, task, tag, qmode), g in runs.groupby(group_keys, sort=True):
        per_run = g.groupby(["method", "budget"])["dataset"].apply(set)
        common = set.intersection(*per_run.tolist()) if len(per_run) else set()
        use = g[g["dataset"].isin(common)] if common else g
        means = use.groupby(["method", "budget"])["score"].mean().reset_index()
        means["parsed"] = means["budget"].map(budget_value)
        forms = sorted({p[0] for p in means["parsed"] if p is not None})
        full = means[means["budget"] == "full"]
        if not forms:
            forms = [""]
        for form in forms:
            fig, ax = plt.subplots(figsize=(6.4, 4.2))
            part = means[means["parsed"].map(lambda p, f=form: p is not None and p[0] == f)]
            for method, mg in part.groupby("method", sort=True):
                mg = mg.assign(x=mg["parsed"].map(lambda p: p[1])).sort_values("x")
                ax.plot(mg["x"], mg["score"], marker="o", label=method)
            for row in full.itertuples():
                ax.axhline(row.score, linestyle="--", color="grey", label=f"{row.method} (full cache)")
            if form in ("L", "/layer") and not part.empty and part["parsed"].map(lambda p: p[1]).min() > 0:
                ax.set_xscale("log", base=2)
            unit = {"L": "budget n (total n × layers)", "/layer": "tokens per layer", "x": "kept ratio"}.get(form, "")
            ax.set_xlabel(unit or "budget")
            n_ds = len(common) if common else g["dataset"].nunique()
            ax.set_ylabel(f"mean score over {n_ds} dataset(s)")
            title = f"{model} · {task}" + (f" · {tag}" if tag else "") + (f" · {qmode}" if qmode != "aware" else "")
            ax.set_title(title)
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
            fig.tight_layout()
            suffix = {"L": "L", "/layer": "per-layer", "x": "ratio"}.get(form, "full")
            name = "_".join(_safe(x) for x in ("score_vs_budget", model, task, tag, qmode, suffix) if x)
            path = out / f"{name}.png"
            fig.savefig(path, dpi=120)
            plt.close(fig)
            written.append(path)
    return written


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
    """One heatmap per run whose predictions carry needle depth and length (all of the run's datasets pooled)."""
    written: list[Path] = []
    if runs.empty:
        return written
    runs = runs.assign(tag=runs["tag"].fillna(""))
    for key, g in runs.groupby(["model", "task", "method", "budget", "tag", "question_mode"], sort=True):
        rows: list[dict[str, Any]] = []
        for metrics_path in g["path"]:
            pred = Path(metrics_path).parent / PREDICTIONS_FILE
            if pred.exists():
                rows.extend(_read_predictions(pred))
        model, task, method, budget, tag, qmode = key
        grid = needle_grid_from_predictions(rows, _scorer_for(task))
        if grid.empty or math.isnan(grid["score"].mean()):
            continue
        title = f"{model} · {task} · {method} · {budget}" + (f" · {tag}" if tag else "")
        name = "_".join(_safe(x) for x in ("needle", model, task, method, budget, tag, qmode) if x) + ".png"
        path = Path(out_dir) / name
        cells = [{"length": r.length, "depth": r.depth, "score": r.score / 100.0} for r in grid.itertuples()]
        written.append(plot_needle_heatmap(cells, path, title=title, vmax=1.0))
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
