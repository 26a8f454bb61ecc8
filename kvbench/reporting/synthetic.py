"""Made-up runs that fill every paper table: the paper's own numbers plus Gaussian noise, as ``metrics.json`` files.

They show (and let the tests check) what ``make tables`` prints for a filled table — precision, ranks, Δ,
splitting, LaTeX, plots — without a GPU.  They are never measurements: every file says ``"synthetic": true``,
its metric is ``synthetic``, and every table or plot built from one says so.

Per paper row the per-dataset scores are chosen so that the table's own convention gives back the printed
aggregates before noise: printed dataset cells are kept; a dataset the paper does not print gets its category's
score (AhaKV), or the value that makes the printed average come out (plain means; illegible cells); a
``run_mean`` table (averages over a task's datasets) gets ``<task>_fill_<i>`` datasets up to its minimum count.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from kvbench.reporting.paper_refs import DEFAULT_PAPER_DIR, TABLES, TableSpec, load_reference
from kvbench.storage.writers import METRICS_FILE, run_dir
from kvbench.views.conventions import LONGBENCH21_CATEGORIES, NEEDLEBENCH_SUBTASKS


def _clip(value: float) -> float:
    return float(min(100.0, max(0.0, value)))


def row_targets(spec: TableSpec, cells: pd.DataFrame, table_datasets: list[str]) -> dict[str, float]:
    """Noise-free per-dataset scores of one paper row whose aggregates (by ``spec``'s convention) are the printed
    ones, as far as the printed cells allow."""
    records = cells.to_dict("records")
    known = {r["dataset"]: float(r["value"]) for r in records if r["kind"] == "dataset" and not pd.isna(r["value"])}
    printed = {r["column"]: float(r["value"]) for r in records if r["kind"] == "aggregate" and not pd.isna(r["value"])}
    name = spec.convention.name
    targets = dict(known)
    if name == "longbench21":
        for category, datasets in LONGBENCH21_CATEGORIES.items():
            for dataset in datasets:
                targets.setdefault(dataset, printed.get(category, printed.get("avg", 50.0)))
    elif name == "needlebench":
        for subtask in NEEDLEBENCH_SUBTASKS:
            for lang in ("zh", "en"):
                targets.setdefault(f"{subtask}_{lang}", printed.get(subtask, printed.get("overall", 50.0)))
    elif name in ("mean", "run_mean"):
        if name == "mean":
            datasets = list(spec.convention.required(table_datasets))
        else:
            fills = max(spec.convention.min_datasets - len(known), 0 if known else 1)
            task = str(records[0]["task"])
            datasets = list(known) + [f"{task}_fill_{i}" for i in range(fills)]
        missing = [d for d in datasets if d not in known]
        if missing:
            given = sum(known[d] for d in datasets if d in known)
            fallback = sum(known.values()) / len(known) if known else 50.0
            fill = (printed["avg"] * len(datasets) - given) / len(missing) if "avg" in printed else fallback
            targets.update(dict.fromkeys(missing, _clip(fill)))
    return targets


def write_synthetic_runs(
    root: str | Path,
    tables: Iterable[str] | None = None,
    noise: float = 1.0,
    seed: int = 0,
    paper_dir: str | Path = DEFAULT_PAPER_DIR,
) -> int:
    """Write synthetic runs for every row of the given score tables under ``root``; returns the files written.

    A run folder shared by several tables (same model, task, method, budget and tag: CAKE Table 1's rows in Tables
    5-7, AhaKV's LLaMA2 row in its Tables 1 and 2, a full-cache run) is written once; a dataset a table prints wins
    over a value another table's convention only implies.
    """
    runs: dict[tuple[str, ...], dict[str, tuple[float, bool]]] = {}
    meta: dict[tuple[str, ...], dict[str, str | None]] = {}
    for tid in tables if tables is not None else TABLES:
        spec = TABLES[tid]
        if spec.kind != "scores":
            continue
        ref = load_reference(tid, paper_dir)
        table_datasets = list(dict.fromkeys(ref.loc[ref["kind"] == "dataset", "dataset"]))
        for _, cells in ref.groupby("row", sort=True):
            first = cells.iloc[0]
            if not first["method"]:
                continue  # a row whose method is unrecoverable cannot have a run
            tag = spec.tags_for(first["method"])[0]
            key = (first["model"], first["task"], first["method"], first["budget"], str(tag))  # = the run folder
            meta.setdefault(key, {"tag": tag, "mode": first["question_mode"] or "aware", "table": tid})
            printed = set(cells.loc[(cells["kind"] == "dataset") & cells["value"].notna(), "dataset"])
            scores = runs.setdefault(key, {})
            for dataset, target in row_targets(spec, cells, table_datasets).items():
                if dataset not in scores or (dataset in printed and not scores[dataset][1]):
                    scores[dataset] = (target, dataset in printed)
    rng = np.random.default_rng(seed)
    count = 0
    for key, scores in runs.items():
        model, task, method, budget, _ = key
        info = meta[key]
        folder = run_dir(root, model, task, method, budget, info["tag"])
        for dataset, (target, _) in scores.items():
            score = _clip(target + rng.normal(0.0, noise)) if not math.isnan(target) else math.nan
            payload = {
                "model": model,
                "task": task,
                "dataset": dataset,
                "method": method,
                "budget": budget,
                "tag": info["tag"],
                "metric": "synthetic",
                "score": score,
                "scores": {"score": score},
                "n_samples": 0,
                "config_hash": "synthetic",
                "question_mode": info["mode"],
                "synthetic": True,
                "settings": {"synthetic_from": info["table"], "noise": noise, "seed": seed},
            }
            path = folder / dataset / METRICS_FILE  # made-up numbers: no atomic, fsynced write needed
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
            count += 1
    return count
