"""The data both dashboards are built from: the runs under a folder, checked, with their extras and leaderboards.

:func:`load_dashboard_runs` reads the runs exactly as ``scripts/aggregate.py`` does
(:func:`~kvbench.reporting.aggregate.load_runs`, strict: a corrupt ``metrics.json`` is an error, not a skipped
file), adds each run folder's extras (:func:`kvbench.views.run_views.read_run_extras`, reused from a cache for
unchanged folders) and keeps the runs of one experiment when asked.  :func:`leaderboards` builds one table per
model × task whose rows and values are :func:`~kvbench.reporting.aggregate.run_summary`'s (``runs_summary.csv``),
with each cell's 95 % interval, the paper's printed value where a paper table's row matches the run, and the best
compressed method per budget, question mode and column marked.

Bad input raises :class:`~kvbench.errors.KVBenchError` before anything is written: a folder without runs, an
unreadable ``metrics.json`` (naming the file), an experiment no run belongs to (naming the ones there are).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from kvbench.errors import KVBenchError
from kvbench.reporting.aggregate import RUN_KEY, load_runs, no_runs_found, not_a_runs_folder, run_summary
from kvbench.views.run_views import file_signature, finite_number, read_run_extras, run_folder_of

#: The columns that identify one run (one row of a leaderboard, one row of ``runs_summary.csv``).
RUN_ID_COLUMNS: tuple[str, ...] = tuple(k for k in RUN_KEY if k != "dataset")
#: Experiment label of a run whose config names none (made-up runs, hand-copied metrics).
NO_EXPERIMENT = "(none)"


@dataclass
class DashboardRuns:
    """The runs of one results folder: the tidy scores (one row per run × dataset, ``load_runs``' columns) and,
    per run id (``model/task/method/budget[~tag]/question_mode``), its extras."""

    root: Path
    scores: pd.DataFrame
    extras: dict[str, dict[str, Any]] = field(default_factory=dict)
    cache_hits: int = 0


def run_id(row: Any) -> str:
    """``model/task/method/budget[~tag]/question_mode``: the id of the run a tidy or summary row belongs to."""
    suffix = f"~{row['tag']}" if row["tag"] else ""
    return f"{row['model']}/{row['task']}/{row['method']}/{row['budget']}{suffix}/{row['question_mode']}"


def _metrics_error(root: Path, problems: str) -> KVBenchError:
    return KVBenchError(
        f"cannot read the runs under {root}: {problems}. Fix or delete the unreadable metrics.json (a run rewrites "
        "it when rerun); nothing was written."
    )


def load_dashboard_runs(
    root: str | Path, experiment: str | None = None, cache: dict[str, Any] | None = None
) -> DashboardRuns:
    """The runs under ``root`` with their extras; ``cache`` (``{folder: {"signature", "extras"}}``) is read and
    updated in place so that an unchanged run folder is not read again.  Raises :class:`KVBenchError` on bad input
    (module docstring)."""
    root = Path(root)
    if not root.is_dir():
        raise not_a_runs_folder(root)
    with warnings.catch_warnings(record=True) as caught:  # load_runs names each unreadable file in a warning
        warnings.simplefilter("always")
        scores = load_runs(root)
    unreadable = [str(w.message) for w in caught if str(w.message).startswith("skipping ")]
    if unreadable:
        raise _metrics_error(root, "; ".join(m.removeprefix("skipping ") for m in unreadable))
    for w in caught:  # anything else (duplicate runs): passed on
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if scores.empty:
        raise no_runs_found(root)
    runs = DashboardRuns(root, scores)
    cache = cache if cache is not None else {}
    seen: set[str] = set()
    for rid, group in scores.groupby(scores.apply(run_id, axis=1), sort=True):
        folder = run_folder_of(group["path"].iloc[0])
        seen.add(str(folder))
        datasets = list(group["dataset"])
        signature = file_signature(folder, datasets)
        cached = cache.get(str(folder))
        if cached and cached.get("signature") == signature:
            runs.extras[rid] = cached["extras"]
            runs.cache_hits += 1
            continue
        extras = read_run_extras(folder, datasets)
        extras["synthetic"] = extras["synthetic"] or bool(group["synthetic"].astype(bool).any())
        cache[str(folder)] = {"signature": signature, "extras": extras}
        runs.extras[rid] = extras
    for gone in set(cache) - seen:  # run folders deleted since the cache was written
        del cache[gone]
    known = sorted({e.get("experiment") or NO_EXPERIMENT for e in runs.extras.values()})
    if experiment is not None:
        if experiment not in known:
            raise KVBenchError(
                f"unknown experiment {experiment!r}: no run under {root} has run.experiment={experiment}; "
                f"experiments there: {', '.join(known)}"
            )
        keep = {rid for rid, e in runs.extras.items() if (e.get("experiment") or NO_EXPERIMENT) == experiment}
        mask = scores.apply(run_id, axis=1).isin(keep)
        runs.scores = scores[mask].reset_index(drop=True)
        runs.extras = {rid: e for rid, e in runs.extras.items() if rid in keep}
    return runs


def paper_values(scores: pd.DataFrame) -> dict[tuple[str, ...], str]:
    """``(model, task, method, budget, tag, question_mode, dataset) -> "<printed> (<table>)"`` for every paper
    table cell that one of our runs fills (the tables' own matching, :func:`kvbench.reporting.tables.compare_table`);
    only tables about a model we ran are compared."""
    from kvbench.reporting.paper_refs import TABLES, load_reference
    from kvbench.reporting.tables import compare_table

    values: dict[tuple[str, ...], str] = {}
    models = set(scores["model"])
    for table_id, spec in TABLES.items():
        if spec.kind != "scores":
            continue
        ref = load_reference(table_id)
        if not models & set(ref["model"]):
            continue
        cmp = compare_table(spec, ref, scores)
        hit = cmp[(cmp["kind"] == "dataset") & cmp["ours"].notna()]
        cells = ref[ref["kind"] == "dataset"]
        dataset_of = dict(zip(zip(cells["row"], cells["column"], strict=True), cells["dataset"], strict=True))
        for rec in hit.to_dict("records"):
            rec["dataset"] = dataset_of[(rec["row"], rec["column"])]
            modes = (
                [rec["question_mode"]] if rec["question_mode"] and rec["method"] != "full" else ["aware", "agnostic"]
            )
            for mode in modes:
                key = (rec["model"], rec["task"], rec["method"], rec["budget"], rec["tag"] or "", mode, rec["dataset"])
                values.setdefault(key, f"{rec['printed']} ({table_id})")
    return values


def leaderboards(
    runs: DashboardRuns, paper: Callable[[pd.DataFrame], dict[tuple[str, ...], str]] = paper_values
) -> list[dict[str, Any]]:
    """One leaderboard per model × task: ``{"model", "task", "datasets", "rows"}``.

    Each row is one run of :func:`run_summary` (same order, same values): ``run_id``, the run columns,
    ``experiment``, ``flags`` (``stand-in``, ``synthetic``, and :func:`~kvbench.reporting.aggregate.load_runs`'
    ``incomplete``, ``disagrees``, ``mixed-code``, ``stale-rows``), ``kept_fraction`` and ``cells`` -- per dataset and
    ``mean``: ``{"score", "ci95", "paper", "best"}`` (``best``: the highest score of the compressed methods at this
    budget and question mode; ``mean``'s interval is summary.json's ``mean`` average's).
    """
    summary = run_summary(runs.scores)
    printed = paper(runs.scores)
    boards = []
    for (model, task), table in summary.groupby(["model", "task"], sort=True):
        datasets = [
            d
            for d in dict.fromkeys(
                runs.scores.loc[(runs.scores["model"] == model) & (runs.scores["task"] == task), "dataset"]
            )
        ]
        columns = [*datasets, "mean"]
        rows = []
        for rec in table.to_dict("records"):
            rec["tag"] = rec["tag"] or None
            rid = run_id(rec)
            extras = runs.extras.get(rid, {})
            cells = {}
            for column in columns:
                score = finite_number(rec.get(column))
                if column == "mean":
                    ci = (extras.get("averages", {}).get("mean") or {}).get("ci95")
                else:
                    ci = (extras.get("datasets", {}).get(column) or {}).get("ci95")
                key = (model, task, rec["method"], rec["budget"], rec["tag"] or "", rec["question_mode"], column)
                cells[column] = {"score": score, "ci95": ci, "paper": printed.get(key), "best": False}
            flags = (["stand-in"] if extras.get("stand_in") else []) + (
                ["synthetic"] if extras.get("synthetic") else []
            )
            # incomplete, disagrees, mixed-code, stale-rows (kvbench.reporting.aggregate, issue #55)
            flags += [flag for flag in str(rec.get("flags") or "").split(",") if flag]
            rows.append(
                {
                    "run_id": rid,
                    **{k: rec[k] for k in RUN_ID_COLUMNS},
                    "experiment": extras.get("experiment") or NO_EXPERIMENT,
                    "flags": flags,
                    "kept_fraction": extras.get("kept_fraction"),
                    "cells": cells,
                }
            )
        rows.sort(key=lambda r: _row_order(r, runs.extras.get(r["run_id"], {})))
        _mark_best(rows, columns)
        boards.append({"model": model, "task": task, "datasets": datasets, "columns": columns, "rows": rows})
    return boards


def _row_order(row: dict[str, Any], extras: dict[str, Any]) -> tuple[Any, ...]:
    """Full cache first, then by method, budget (tokens per layer, then name), tag and question mode."""
    tokens = extras.get("budget_tokens_per_layer")
    return (
        row["method"] != "full",
        row["method"],
        tokens is None,
        tokens or 0,
        row["budget"],
        row["tag"] or "",
        row["question_mode"],
    )


def _mark_best(rows: list[dict[str, Any]], columns: list[str]) -> None:
    """Mark, per budget and question mode, the best compressed method's cell in every column (ties: all; none when
    every method has the same value, e.g. all 0.00: there is no winner to show)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        if row["method"] != "full":
            groups.setdefault((row["budget"], row["question_mode"]), []).append(row)
    for group in groups.values():
        for column in columns:
            values = [r["cells"][column]["score"] for r in group if r["cells"][column]["score"] is not None]
            if len(values) < 2 or max(values) == min(values):
                continue
            best = max(values)
            for r in group:
                if r["cells"][column]["score"] == best:
                    r["cells"][column]["best"] = True
