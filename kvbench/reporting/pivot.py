"""The comparison at a glance: per model × task × question mode, methods × budgets of the mean score, each with its
difference to the full cache, and the headline series (mean score against the stored-bytes fraction).

:func:`pivots` builds the site's leaderboards.  One table per model, task and question mode (question-aware and
agnostic are never mixed); one row per method (and tag), one column per budget (ordered by tokens per layer); one
reference row, the full cache.  A cell holds:

* ``mean``: the run's mean over its datasets (``runs_summary.csv``'s ``mean``), averaged over seeds when several
  runs differ only by a seed tag (``seed1``, ``s2``, ``..._seed3``; ``seeds`` counts them) and its 95 % interval
  (summary.json's, for one seed);
* ``diff``: the paired difference to the full cache: per dataset, the mean over the samples both runs scored (matched
  by id, summary.json's ``per_sample``) of ``method − full``, averaged over the datasets; ``diff_ci95``: its 95 %
  percentile bootstrap interval (:data:`~kvbench.run.summary.BOOTSTRAP_RESAMPLES` resamples of the paired
  differences, each dataset seeded by its name, the datasets resampled together as for summary.json's averages).
  Runs without per-sample scores get ``mean − full mean`` and no interval;
* ``n``: samples per dataset (the smallest over the datasets, summed over seeds); ``small_n`` when under
  :data:`SMALL_N`;
* ``stored_fraction`` (bytes stored / the full cache's bytes, :func:`~kvbench.views.run_views.stored_fraction`),
  ``kept_fraction`` (tokens kept), ``prefill_s`` / ``decode_s`` (seconds per sample).

The full cache is one row: when ``method=full`` was run under several budgets (the budget does not change it) the
run under ``full`` is used (else the first) and a warning names the others.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvbench.reporting.aggregate import run_summary
from kvbench.reporting.dashboard_data import NO_EXPERIMENT, DashboardRuns, run_id
from kvbench.reporting.palette import method_colour, method_label
from kvbench.run.summary import bootstrap_means, percentile_interval
from kvbench.views.run_views import finite_number

#: Fewer samples per dataset than this: the cell is flagged (its interval is wide and unreliable).
SMALL_N = 10
_SEED_TAG = re.compile(r"(?:^|[-_~.])(?:seed|s)[-_=]?(\d+)$")


def seed_free_tag(tag: str | None) -> str:
    """The tag without a trailing seed part (``seed1`` -> ``""``, ``late_s2`` -> ``late``): runs whose tags differ
    only by a seed are aggregated into one row."""
    if not tag:
        return ""
    return _SEED_TAG.sub("", str(tag))


def _paired_diffs(run: dict[str, Any], full: dict[str, Any]) -> dict[str, list[float]] | None:
    """Per dataset of both runs, ``method − full`` per sample both scored (``None`` without per-sample scores)."""
    out: dict[str, list[float]] = {}
    for dataset, info in run.get("datasets", {}).items():
        mine = (info or {}).get("per_sample")
        ref = ((full.get("datasets") or {}).get(dataset) or {}).get("per_sample")
        if not mine or not ref:
            return None
        ref_by_id = dict(zip(ref["ids"], ref["scores"], strict=False))
        diffs = [s - ref_by_id[i] for i, s in zip(mine["ids"], mine["scores"], strict=False) if i in ref_by_id]
        if not diffs:
            return None
        out[dataset] = diffs
    return out or None


def paired_difference(per_dataset: dict[str, list[float]]) -> tuple[float, tuple[float, float]]:
    """Mean over datasets of each dataset's mean paired difference, and its 95 % bootstrap interval."""
    point = float(np.mean([np.mean(d) for d in per_dataset.values()]))
    resampled = np.mean(
        [bootstrap_means(d, seed=zlib.crc32(name.encode())) for name, d in sorted(per_dataset.items())], axis=0
    )
    return point, percentile_interval(resampled)


def _mean_of(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


def _flags(extras: dict[str, Any]) -> list[str]:
    return (["stand-in"] if extras.get("stand_in") else []) + (["synthetic"] if extras.get("synthetic") else [])


def _cell(runs: list[dict[str, Any]], full: dict[str, Any] | None) -> dict[str, Any]:
    """One pivot cell from the runs (one per seed) of one method × budget × question mode."""
    means = [r["mean"] for r in runs]
    extras = [r["extras"] for r in runs]
    n = sum(min((d.get("n_samples") or 0) for d in e.get("datasets", {}).values()) or 0 for e in extras)
    cell: dict[str, Any] = {
        "mean": float(np.mean(means)),
        "ci95": (extras[0].get("averages", {}).get("mean") or {}).get("ci95") if len(runs) == 1 else None,
        "seeds": len(runs),
        "n": n,
        "small_n": n < SMALL_N,
        "diff": None,
        "diff_ci95": None,
        "stored_fraction": _mean_of([e.get("stored_fraction") for e in extras]),
        "kept_fraction": _mean_of([e.get("kept_fraction") for e in extras]),
        "prefill_s": _mean_of([e.get("prefill_s") for e in extras]),
        "decode_s": _mean_of([e.get("decode_s") for e in extras]),
        "run_ids": [r["run_id"] for r in runs],
        "datasets": sorted(extras[0].get("datasets", {})),
        "flags": sorted({f for e in extras for f in _flags(e)}),
    }
    if full is not None:
        pooled: dict[str, list[float]] = {}
        for e in extras:
            diffs = _paired_diffs(e, full["extras"])
            if diffs is None:
                pooled = {}
                break
            for dataset, values in diffs.items():
                pooled.setdefault(dataset, []).extend(values)
        if pooled:
            cell["diff"], cell["diff_ci95"] = paired_difference(pooled)
        else:
            cell["diff"] = cell["mean"] - full["mean"]
    return cell


def _pick_full(fulls: list[dict[str, Any]], mode: str) -> tuple[dict[str, Any] | None, str | None]:
    """The full-cache run of a table (its question mode preferred, then the budget ``full``) and a warning when
    several were run."""
    if not fulls:
        return None, None
    ordered = sorted(fulls, key=lambda r: (r["question_mode"] != mode, r["budget"] != "full", r["budget"], r["tag"]))
    chosen = ordered[0]
    same_mode = [r for r in fulls if r["question_mode"] == chosen["question_mode"] and r["tag"] == chosen["tag"]]
    warning = None
    if len(same_mode) > 1:
        others = ", ".join(sorted(r["budget"] for r in same_mode if r is not chosen))
        warning = (
            f"method=full was run with {len(same_mode)} budgets ({chosen['budget']}, {others}): the budget does not "
            f"change the full cache; the reference row is the run under {chosen['budget']}"
        )
    return chosen, warning


def _run_entries(runs: DashboardRuns) -> list[dict[str, Any]]:
    """One entry per run: identity, its mean (``runs_summary.csv``), x (tokens per layer) and extras."""
    entries = []
    for rec in run_summary(runs.scores).to_dict("records"):
        rec["tag"] = rec["tag"] or None
        rid = run_id(rec)
        extras = runs.extras.get(rid, {})
        entries.append(
            {
                "run_id": rid,
                **{k: rec[k] for k in ("model", "task", "method", "budget", "question_mode")},
                "tag": rec["tag"] or "",
                "mean": float(rec["mean"]),
                "x": extras.get("budget_tokens_per_layer"),
                "experiment": extras.get("experiment") or NO_EXPERIMENT,
                "extras": extras,
            }
        )
    return entries


def pivots(runs: DashboardRuns) -> list[dict[str, Any]]:
    """The pivot tables (module docstring): ``{"model", "task", "question_mode", "budgets", "full", "rows",
    "warnings"}``; ``budgets``: ``[{"budget", "x"}]`` in column order; ``full``: the reference cell (``None``
    without a full-cache run); ``rows``: ``{"key", "method", "label", "colour", "tag", "cells": {budget: cell}}``
    ordered by the mean over their budgets, best first."""
    entries = _run_entries(runs)
    tables = []
    for model, task in sorted({(e["model"], e["task"]) for e in entries}):
        group = [e for e in entries if (e["model"], e["task"]) == (model, task)]
        fulls = [e for e in group if e["method"] == "full"]
        for mode in sorted({e["question_mode"] for e in group if e["method"] != "full"}) or ["aware"]:
            full, warning = _pick_full(fulls, mode)
            comp = [e for e in group if e["method"] != "full" and e["question_mode"] == mode]
            columns: dict[str, float | None] = {}
            for e in sorted(comp, key=lambda e: (e["x"] is None, e["x"] or 0, e["budget"])):
                columns.setdefault(e["budget"], e["x"])
            cells: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = {}
            for e in comp:
                row = cells.setdefault((e["method"], seed_free_tag(e["tag"])), {})
                row.setdefault(e["budget"], []).append(e)
            rows = []
            for (method, tag), by_budget in cells.items():
                row_cells = {b: _cell(rs, full) for b, rs in by_budget.items()}
                rows.append(
                    {
                        "key": f"{method}~{tag}" if tag else method,
                        "method": method,
                        "label": method_label(method) + (f" ~{tag}" if tag and tag != mode else ""),
                        "colour": method_colour(method),
                        "tag": tag,
                        "cells": row_cells,
                    }
                )
            rows.sort(key=lambda r: (-float(np.mean([c["mean"] for c in r["cells"].values()])), r["key"]))
            tables.append(
                {
                    "model": model,
                    "task": task,
                    "question_mode": mode,
                    "budgets": [{"budget": b, "x": x} for b, x in columns.items()],
                    "full": {**_cell([full], None), "budget": full["budget"]} if full is not None else None,
                    "rows": rows,
                    "warnings": [warning] if warning else [],
                }
            )
    return tables


def headline(tables: list[dict[str, Any]], paper: dict[tuple[str, ...], str] | None = None) -> list[dict[str, Any]]:
    """The headline chart's data per model × task: every (method, tag, question mode) a series of points
    ``{"budget", "x" (stored fraction), "y" (mean), "ci95", "paper" (the mean of the paper's printed values over
    the run's datasets, when every dataset has one)}``, the full cache's mean, and per question mode the memory
    frontier (:func:`memory_frontier`: the runs no other run beats with as few stored bytes).  Eviction and
    quantized storage (``snapkv+kivi4``: issue #59) are series alike, placed by the bytes they store."""
    charts: dict[tuple[str, str], dict[str, Any]] = {}
    for table in tables:
        chart = charts.setdefault(
            (table["model"], table["task"]),
            {"model": table["model"], "task": table["task"], "full": None, "series": []},
        )
        if table["full"] is not None and chart["full"] is None:
            chart["full"] = {"y": table["full"]["mean"], "ci95": table["full"]["ci95"]}
        for row in table["rows"]:
            points = []
            for budget in (b["budget"] for b in table["budgets"]):
                cell = row["cells"].get(budget)
                if cell is None or cell["stored_fraction"] is None:
                    continue
                points.append(
                    {
                        "budget": budget,
                        "x": cell["stored_fraction"],
                        "y": cell["mean"],
                        "ci95": cell["ci95"],
                        "small_n": cell["small_n"],
                        "paper": _paper_mean(paper or {}, table, row, budget, cell),
                    }
                )
            if points:
                chart["series"].append(
                    {
                        "method": row["method"],
                        "label": row["label"] + ("" if table["question_mode"] == "aware" else " (agnostic)"),
                        "colour": row["colour"],
                        "question_mode": table["question_mode"],
                        "points": points,
                    }
                )
    for chart in charts.values():
        chart["frontier"] = {
            mode: memory_frontier(chart["series"], mode, chart["full"])
            for mode in sorted({series["question_mode"] for series in chart["series"]})
        }
    return list(charts.values())


def memory_frontier(
    series: list[dict[str, Any]], mode: str, full: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The Pareto frontier of score against stored bytes over the ``mode`` series' points (and the full cache at
    stored fraction 1): ``[{"x", "y", "label", "budget"}]`` by increasing ``x``, each scoring strictly more than every
    point that stores as few bytes or fewer -- where a memory budget is best spent, whether by eviction,
    quantization or both."""
    points = [
        {"x": float(p["x"]), "y": float(p["y"]), "label": s["label"], "budget": p["budget"]}
        for s in series
        if s["question_mode"] == mode
        for p in s["points"]
    ]
    if full is not None:
        points.append({"x": 1.0, "y": float(full["y"]), "label": "full cache", "budget": "full"})
    frontier: list[dict[str, Any]] = []
    for point in sorted(points, key=lambda p: (p["x"], -p["y"])):
        if not frontier or point["y"] > frontier[-1]["y"]:
            frontier.append(point)
    return frontier


def _paper_mean(
    paper: dict[tuple[str, ...], str], table: dict[str, Any], row: dict[str, Any], budget: str, cell: dict[str, Any]
) -> float | None:
    """The mean of the paper's printed values over the datasets of the cell's run, if the paper prints them all."""
    key = (table["model"], table["task"], row["method"], budget, row["tag"], table["question_mode"])
    values = [finite_number(str(paper.get((*key, d), "")).split(" ")[0]) for d in cell["datasets"]]
    if not values or any(v is None for v in values):
        return None
    return float(np.mean(values))
