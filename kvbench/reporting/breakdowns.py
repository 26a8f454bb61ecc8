"""The results site's breakdowns: the sub-scores a task writes beside its headline, and accuracy vs generated length.

* :func:`breakdown_tables`: for every dataset whose ``metrics.json`` ``scores`` hold more than the headline
  (LongBench v2's ``easy`` / ``hard`` / ``short`` / ``medium`` / ``long``, SCBench's ``turn_0``,
  ``turn_1/<subtask>``, the reasoning tasks' ``first_draw`` / ``pass_at_n``, ...) one table per model × task ×
  dataset: a row per run (method × budget × tag × question mode), a column per sub-score.  The columns are read
  generically from ``scores``; the only per-task knowledge is :data:`BREAKDOWN_ORDER` (display order and labels) and
  :data:`NOT_BREAKDOWNS` (the headline, intervals and counts, which are no score columns);
* :func:`length_charts`: for the tasks of :data:`LENGTH_PLOT_TASKS` (long reasoning), per model × task × dataset a
  series per method (and tag, question mode) of ``(mean generated tokens, score)`` points, one per budget: the mean
  of the predictions' ``new_tokens`` (:func:`kvbench.views.run_views.read_predictions_view`) against the dataset's
  score.  A method that keeps too little often "thinks" longer (or runs to ``max_new_tokens``) while its accuracy
  drops; the plot shows both at once.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd

from kvbench.reporting.dashboard_data import DashboardRuns, run_id
from kvbench.reporting.palette import method_colour, method_label
from kvbench.views.run_views import budget_tokens_per_layer, finite_number

#: Display order and labels of the known sub-scores; any other key is shown after these, under its own name
#: (``turn_<i>`` keys and ``turn_<i>/<subtask>`` in turn order).
BREAKDOWN_ORDER: dict[str, str] = {
    "easy": "Easy",
    "hard": "Hard",
    "short": "Short",
    "medium": "Medium",
    "long": "Long",
    "first_draw": "first draw",
    "pass_at_n": "pass@n",
    "all": "all queries",
}
#: ``scores`` keys that are no breakdown column: the headline itself, interval ends and counts (``nulls``: empty
#: predictions); so are ``n_*`` counts and lm-eval's ``*stderr*`` keys (:func:`is_breakdown`).
NOT_BREAKDOWNS = frozenset({"score", "overall", "ci_low", "ci_high", "nulls"})
#: Tasks whose runs get the accuracy vs generated length plot (long generations: the length is part of the result).
LENGTH_PLOT_TASKS = frozenset({"reasoning"})
_TURN = re.compile(r"^turn_(\d+)(?:/(.*))?$")


def is_breakdown(key: str) -> bool:
    """Whether a ``scores`` key is a sub-score column (not :data:`NOT_BREAKDOWNS`, a ``n_*`` count or a standard
    error)."""
    return key not in NOT_BREAKDOWNS and not key.startswith("n_") and "stderr" not in key


def _column_order(key: str) -> tuple[Any, ...]:
    if key in BREAKDOWN_ORDER:
        return (0, list(BREAKDOWN_ORDER).index(key), "")
    turn = _TURN.match(key)
    if turn:
        return (1, int(turn.group(1)), turn.group(2) or "")
    return (2, 0, key)


def breakdown_columns(keys: Any) -> list[str]:
    """The breakdown columns among ``scores`` keys, in display order (:data:`BREAKDOWN_ORDER`, then turns, then the
    rest by name)."""
    return sorted({str(k) for k in keys if is_breakdown(str(k))}, key=_column_order)


def column_label(key: str) -> str:
    """A column's header: :data:`BREAKDOWN_ORDER`'s label, ``turn 1 · <subtask>`` for a turn, else the key."""
    if key in BREAKDOWN_ORDER:
        return BREAKDOWN_ORDER[key]
    turn = _TURN.match(key)
    if turn:
        return f"turn {turn.group(1)}" + (f" · {turn.group(2)}" if turn.group(2) else "")
    return key


def _row_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """Full cache first, then by method, tag, question mode and tokens per layer (``<n>L`` budgets by ``n``)."""
    x = budget_tokens_per_layer(row["budget"], None, None)
    return (row["method"] != "full", row["method"], row["tag"], row["question_mode"], x is None, x or 0, row["budget"])


def breakdown_tables(scores: pd.DataFrame) -> list[dict[str, Any]]:
    """One table per model × task × dataset with sub-scores, from the tidy frame of
    :func:`~kvbench.reporting.aggregate.load_runs`: ``{"model", "task", "dataset", "columns": [{"key", "label"}],
    "rows": [{"run_id", "method", "label", "colour", "budget", "tag", "question_mode", "score", "values": {key:
    float | None}}]}`` (rows ordered full cache first, then method and budget)."""
    groups: dict[tuple[str, str, str], list[tuple[tuple[Any, ...], dict[str, Any]]]] = {}
    for rec in scores.to_dict("records"):
        scores = json.loads(rec["scores"] or "{}")
        columns = breakdown_columns(scores)
        if not columns:
            continue
        rec["tag"] = rec["tag"] if isinstance(rec["tag"], str) and rec["tag"] else None
        rid = run_id(rec)
        row = {
            "run_id": rid,
            "method": rec["method"],
            "label": method_label(rec["method"]) + (f" ~{rec['tag']}" if rec["tag"] else ""),
            "colour": method_colour(rec["method"]),
            "budget": rec["budget"],
            "tag": rec["tag"] or "",
            "question_mode": rec["question_mode"],
            "score": finite_number(rec["score"]),
            "values": {key: finite_number(scores[key]) for key in columns},
        }
        key = (rec["model"], rec["task"], rec["dataset"])
        groups.setdefault(key, []).append((_row_key(row), row))
    tables = []
    for (model, task, dataset), rows in sorted(groups.items()):
        keys = breakdown_columns(k for _, row in rows for k in row["values"])
        tables.append(
            {
                "model": model,
                "task": task,
                "dataset": dataset,
                "columns": [{"key": k, "label": column_label(k)} for k in keys],
                "rows": [row for _, row in sorted(rows, key=lambda pair: pair[0])],
            }
        )
    return tables


def length_charts(runs: DashboardRuns) -> list[dict[str, Any]]:
    """Accuracy vs mean generated tokens per model × task × dataset of :data:`LENGTH_PLOT_TASKS`: ``{"model",
    "task", "dataset", "series": [{"method", "label", "colour", "question_mode", "points": [{"budget", "x" (mean
    new_tokens), "y" (score), "run_id"}]}]}``, each series' points ordered by tokens per layer (the full cache one
    point: its run under ``full``, else its first); a run without recorded ``new_tokens`` is left out."""
    charts: dict[tuple[str, str, str], dict[tuple[str, str, str], dict[str, Any]]] = {}
    for rec in runs.scores.to_dict("records"):
        if rec["task"] not in LENGTH_PLOT_TASKS:
            continue
        rec["tag"] = rec["tag"] if isinstance(rec["tag"], str) and rec["tag"] else None
        rid = run_id(rec)
        extras = runs.extras.get(rid, {})
        length = finite_number(((extras.get("datasets") or {}).get(rec["dataset"]) or {}).get("generated_length"))
        score = finite_number(rec["score"])
        if length is None or score is None:
            continue
        series_key = (rec["method"], rec["tag"] or "", rec["question_mode"])
        series = charts.setdefault((rec["model"], rec["task"], rec["dataset"]), {}).setdefault(
            series_key,
            {
                "method": rec["method"],
                "label": method_label(rec["method"]) + (f" ~{rec['tag']}" if rec["tag"] else ""),
                "colour": method_colour(rec["method"]),
                "question_mode": rec["question_mode"],
                "points": [],
            },
        )
        x = extras.get("budget_tokens_per_layer")
        series["points"].append({"budget": rec["budget"], "x": length, "y": score, "run_id": rid, "_order": x})
    out = []
    for (model, task, dataset), by_series in sorted(charts.items()):
        series_list = []
        for _, series in sorted(by_series.items()):
            series["points"].sort(key=lambda p: (p["_order"] is None, p["_order"] or 0, p["budget"]))
            for point in series["points"]:
                del point["_order"]
            if series["method"] == "full":  # one point: the budget does not change the full cache (as the pivot)
                chosen = [p for p in series["points"] if p["budget"] == "full"] or series["points"]
                series["points"] = chosen[:1]
            series_list.append(series)
        out.append({"model": model, "task": task, "dataset": dataset, "series": series_list})
    return out


def breakdowns_frame(scores: pd.DataFrame) -> pd.DataFrame:
    """The breakdowns in tidy form (``breakdowns.csv``): one row per run × dataset × sub-score, columns ``model``,
    ``task``, ``dataset``, ``method``, ``budget``, ``tag``, ``question_mode``, ``score`` (the headline),
    ``breakdown`` (the ``scores`` key), ``label`` and ``value``."""
    columns = ["model", "task", "dataset", "method", "budget", "tag", "question_mode", "score", "breakdown"]
    rows = []
    for table in breakdown_tables(scores):
        for row in table["rows"]:
            for column in table["columns"]:
                if column["key"] not in row["values"]:
                    continue
                ident = [table["model"], table["task"], table["dataset"], row["method"], row["budget"], row["tag"]]
                value = row["values"][column["key"]]
                rows.append([*ident, row["question_mode"], row["score"], column["key"], column["label"], value])
    return pd.DataFrame(rows, columns=[*columns, "label", "value"])


def breakdowns_markdown(scores: pd.DataFrame) -> str:
    """``breakdowns.md``: a Markdown table per model × task × dataset with sub-scores (the site's ``#breakdowns``),
    a row per run, the headline score then a column per sub-score, one decimal."""

    def cell(value: float | None) -> str:
        return "–" if value is None else f"{value:.1f}"

    lines = ["# Breakdowns: the sub-scores beside each headline score", ""]
    tables = breakdown_tables(scores)
    if not tables:
        lines.append("No run has sub-scores beside its headline score.")
    for table in tables:
        header = ["method", "budget", "mode", "score", *(c["label"] for c in table["columns"])]
        lines += [f"## {table['model']} · {table['task']} · {table['dataset']}", ""]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for row in table["rows"]:
            values = [cell(row["values"].get(c["key"])) for c in table["columns"]]
            first = [row["label"], row["budget"], row["question_mode"], cell(row["score"])]
            lines.append("| " + " | ".join([*first, *values]) + " |")
        lines.append("")
    return "\n".join(lines)


def write_breakdowns(scores: pd.DataFrame, out_dir: str | Path) -> None:
    """``<out_dir>/breakdowns.csv`` (:func:`breakdowns_frame`) and ``breakdowns.md`` (:func:`breakdowns_markdown`):
    ``make tables``' breakdowns, beside ``runs_summary.{csv,md}``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    breakdowns_frame(scores).to_csv(out / "breakdowns.csv", index=False)
    (out / "breakdowns.md").write_text(breakdowns_markdown(scores), encoding="utf-8")
