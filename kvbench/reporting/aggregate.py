"""Collect every finished dataset of every run into one tidy table.

Runs are discovered only from the contents of their ``metrics.json`` files (see :mod:`kvbench.storage.writers`): the
path is recorded for reference but never parsed, and no list of methods, models or budgets is assumed.  One row per
``metrics.json``::

    model, task, dataset, method, budget, tag, question_mode, metric, score, n_samples, config_hash,
    mean_kept_fraction, mean_stored_bytes, mean_stored_vs_full, prefill_s_mean, decode_s_mean, settings,
    dataset_settings, scores, synthetic, path

``synthetic`` is true only for the made-up runs of :mod:`kvbench.reporting.synthetic` (never for a measurement).
``flags`` (comma-separated, empty when none; issue #55): ``incomplete`` (the run's ``run_meta.json`` status is not
``complete``), ``disagrees`` (its ``metrics.json`` disagrees with its ``predictions.jsonl``: the score is left out,
NaN, and a warning names the file and the fix), ``mixed-code`` (its rows were computed by several versions of
kvbench's code), ``stale-rows`` (rows kept from inputs that changed since: ``run.changed_inputs=keep``).  ``n_samples``
is the complete rows on disk that the ``metrics.json`` counts (:func:`kvbench.storage.integrity.check_metrics`).
``settings``, ``dataset_settings`` and ``scores`` are canonical JSON strings (sorted keys) so that the frame can be
written to CSV and compared; :func:`expand_settings` turns ``settings`` into ``setting.<key>`` columns.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import pandas as pd

from kvbench.errors import KVBenchError
from kvbench.storage.integrity import check_metrics
from kvbench.storage.paths import VARIANT_MARK
from kvbench.storage.reader import read_metrics
from kvbench.storage.writers import METRICS_FILE, PREDICTIONS_FILE, RUN_META_FILE
from kvbench.views.run_views import mean_stored_bytes, mean_stored_vs_full, rerun_command

#: Columns of the tidy runs table, in order.
RUN_COLUMNS: tuple[str, ...] = (
    "model",
    "task",
    "dataset",
    "method",
    "budget",
    "tag",
    "question_mode",
    "metric",
    "score",
    "n_samples",
    "config_hash",
    "mean_kept_fraction",
    "mean_stored_bytes",
    "mean_stored_vs_full",
    "prefill_s_mean",
    "decode_s_mean",
    "settings",
    "dataset_settings",
    "scores",
    "synthetic",
    "flags",
    "path",
)

#: What identifies one score: two metrics.json files with the same key are the same cell.
RUN_KEY: tuple[str, ...] = ("model", "task", "method", "budget", "tag", "question_mode", "dataset")

_REQUIRED = ("model", "task", "dataset", "method", "budget", "score")


def _json(value: Any) -> str:
    return json.dumps(value if value is not None else {}, sort_keys=True, ensure_ascii=False)


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def run_label_tag(tag: str | None, metrics_path: str | Path) -> str | None:
    """The tag that tells a run apart in tables: the run's ``run.tag``, followed by ``@<hash>`` when its folder is a
    variant folder (``<budget>[~<tag>]@<hash>``, :func:`kvbench.storage.paths.run_folder`: another config of the same
    model/task/method/budget/tag took the plain folder first), so the two runs are two rows, never duplicates."""
    leaf = Path(metrics_path).parent.parent.name if str(metrics_path) else ""
    _, mark, variant = leaf.partition(VARIANT_MARK)
    if not mark:
        return tag or None
    return f"{tag or ''}{VARIANT_MARK}{variant}"


def metrics_to_row(metrics: dict[str, Any], path: str | Path = "", flags: str = "") -> dict[str, Any]:
    """One tidy row from one ``metrics.json`` payload; raises ``ValueError`` if a required key is missing."""
    missing = [k for k in _REQUIRED if k not in metrics]
    if missing:
        raise ValueError(f"{path}: metrics.json lacks {missing}")
    cache = metrics.get("cache") or {}
    timing = metrics.get("timing") or {}
    return {
        "model": str(metrics["model"]),
        "task": str(metrics["task"]),
        "dataset": str(metrics["dataset"]),
        "method": str(metrics["method"]),
        "budget": str(metrics["budget"]),
        "tag": run_label_tag(metrics.get("tag"), path),
        "question_mode": metrics.get("question_mode") or "aware",
        "metric": metrics.get("metric"),
        "score": _float(metrics["score"]),
        "n_samples": metrics.get("n_samples"),
        "config_hash": metrics.get("config_hash"),
        "mean_kept_fraction": _float(cache.get("mean_kept_fraction")),
        "mean_stored_bytes": mean_stored_bytes(cache),
        "mean_stored_vs_full": mean_stored_vs_full(cache),
        "prefill_s_mean": _float(timing.get("prefill_s_mean")),
        "decode_s_mean": _float(timing.get("decode_s_mean")),
        "settings": _json(metrics.get("settings")),
        "dataset_settings": _json(metrics.get("dataset_settings")),
        "scores": _json(metrics.get("scores")),
        "synthetic": bool(metrics.get("synthetic", False)),
        "flags": flags,
        "path": str(path),
    }


def load_runs(root: str | Path, strict: bool = False) -> pd.DataFrame:
    """Every ``metrics.json`` under ``root`` as a tidy frame (empty, with the right columns, if there is none).

    A file that cannot be read or lacks a required key is skipped with a warning (``strict=True``: raised), so a
    single broken run never hides the others.  Duplicated keys (:data:`RUN_KEY`) cannot come from the standard
    layout; if they appear (copied folders) the first path in sorted order wins and a warning names the others.
    """
    rows = []
    metas: dict[Path, dict[str, Any]] = {}
    root = Path(root)
    # Same discovery as kvbench.storage.writers.iter_metrics, file by file, so that one unreadable file (a copy in
    # progress, a disk error) is skipped instead of ending the whole walk.
    for path in sorted(root.rglob(METRICS_FILE)) if root.exists() else []:
        try:
            metrics = read_metrics(path)  # parsed, checked and upgraded to the current schema version
            rows.append(checked_row(metrics, path, metas))
        except (OSError, ValueError, KVBenchError) as err:  # DamagedFile names the file and the fix
            if strict:
                raise
            warnings.warn(f"skipping {path}: {err}", stacklevel=2)
    df = pd.DataFrame(rows, columns=list(RUN_COLUMNS))
    if df.empty:
        return df
    key = list(RUN_KEY)
    dup = df.duplicated(key, keep="first")
    if dup.any():
        warnings.warn(
            "duplicate runs (same model/task/method/budget/tag/question_mode/dataset); keeping the first: "
            + ", ".join(df.loc[dup, "path"]),
            stacklevel=2,
        )
        df = df[~dup]
    df["tag"] = df["tag"].astype(object).where(df["tag"].notna(), None)
    return df.sort_values(key, na_position="first", key=lambda s: s.astype(str)).reset_index(drop=True)


def _run_meta(folder: Path, metas: dict[Path, dict[str, Any]]) -> dict[str, Any]:
    """A run folder's ``run_meta.json`` (read once per folder; ``{}`` when absent or unreadable)."""
    if folder not in metas:
        try:
            meta = json.loads((folder / RUN_META_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            meta = {}
        metas[folder] = meta if isinstance(meta, dict) else {}
    return metas[folder]


def checked_row(metrics: dict[str, Any], path: Path, metas: dict[Path, dict[str, Any]]) -> dict[str, Any]:
    """:func:`metrics_to_row` of a ``metrics.json`` checked against its rows and its run (``flags``, module
    docstring): one that disagrees with its ``predictions.jsonl`` is refused (score NaN, a warning naming the file,
    what differs and the fix); ``n_samples`` is the complete rows on disk it counts."""
    n, problems = check_metrics(metrics, path.with_name(PREDICTIONS_FILE))
    meta = _run_meta(path.parent.parent, metas)
    dataset = str(metrics.get("dataset"))
    flags = []
    if meta and meta.get("status") != "complete":
        flags.append("incomplete")
    if problems:
        flags.append("disagrees")
        warnings.warn(
            f"{path} disagrees with its predictions.jsonl ({'; '.join(problems)}): its score is left out; run the "
            "run's command again to rewrite it from its rows",
            stacklevel=3,
        )
    if len((metrics.get("code") or {}).get("sources") or []) > 1:
        flags.append("mixed-code")
    if (meta.get("stale_rows") or {}).get(dataset):
        flags.append("stale-rows")
    row = metrics_to_row(metrics, path, ",".join(flags))
    row["n_samples"] = n
    if problems:
        row["score"] = math.nan
    return row


def incomplete_runs(root: str | Path) -> list[tuple[Path, str]]:
    """``(run folder, status)`` of every run under ``root`` whose ``run_meta.json`` does not say ``complete``
    (interrupted, failed, still running): listed by ``kvbench report`` and ``scripts/tables.py`` even when no
    dataset of theirs finished (such a run has no ``metrics.json``, so no row of :func:`load_runs`)."""
    found = []
    for meta_path in sorted(Path(root).rglob(RUN_META_FILE)) if Path(root).is_dir() else []:
        meta = _run_meta(meta_path.parent, {})
        if meta and meta.get("status") != "complete":
            found.append((meta_path.parent, str(meta.get("status"))))
    return found


def incomplete_run_notes(root: str | Path) -> list[str]:
    """One line per :func:`incomplete_runs` run, with the command that completes it."""
    return [
        f"note: run {folder} is incomplete (status {status}): flagged 'incomplete' wherever runs are ranked; to "
        f"complete it: {rerun_command(folder, _run_meta(folder, {}))}"
        for folder, status in incomplete_runs(root)
    ]


def not_a_runs_folder(root: str | Path) -> KVBenchError:
    """The error for a ``--runs`` / ``kvbench report`` folder that does not exist."""
    return KVBenchError(f"no runs: {root} is not a folder (give the folder holding the run folders, e.g. results/runs)")


def no_runs_found(root: str | Path) -> KVBenchError:
    """The error for a runs folder without a single ``metrics.json``."""
    return KVBenchError(
        f"no runs under {root}: no <model>/<task>/<method>/<budget>/<dataset>/metrics.json in it; run kvbench "
        "first (e.g. `kvbench run.output_root=<folder>`) or give the folder holding the run folders"
    )


def require_runs(root: str | Path, strict: bool = False) -> pd.DataFrame:
    """:func:`load_runs`, refusing a folder that does not exist or holds no run (:class:`KVBenchError`), so that a
    table, grid or aggregate built from it is never written empty over results already there."""
    if not Path(root).is_dir():
        raise not_a_runs_folder(root)
    runs = load_runs(root, strict=strict)
    if runs.empty:
        raise no_runs_found(root)
    return runs


def expand_settings(df: pd.DataFrame, column: str = "settings", prefix: str = "setting.") -> pd.DataFrame:
    """Add one ``<prefix><key>`` column per key of the JSON ``column`` (nested dicts flattened with dots)."""

    def flat(obj: Any, pre: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in (obj or {}).items():
            if isinstance(v, dict):
                out.update(flat(v, f"{pre}{k}."))
            else:
                out[f"{pre}{k}"] = json.dumps(v) if isinstance(v, list) else v
        return out

    expanded = pd.DataFrame([flat(json.loads(s)) for s in df[column]], index=df.index)
    expanded.columns = [f"{prefix}{c}" for c in expanded.columns]
    return pd.concat([df, expanded], axis=1)


def run_summary(df: pd.DataFrame) -> pd.DataFrame:
    """One row per run (model/task/method/budget/tag/question_mode) with one column per dataset and their mean."""
    if df.empty:
        return pd.DataFrame()
    keys = ["model", "task", "method", "budget", "tag", "question_mode"]
    filled = df.assign(tag=df["tag"].fillna(""))
    wide = filled.pivot_table(index=keys, columns="dataset", values="score", aggfunc="first")
    wide.columns.name = None
    wide["mean"] = wide.mean(axis=1, skipna=True)
    wide["n_datasets"] = wide.drop(columns="mean").notna().sum(axis=1)
    if "flags" in filled:  # every flag of the run's datasets (issue #55: an incomplete run is never ranked unflagged)
        flags = filled.groupby(keys, dropna=False)["flags"].agg(union_flags)
        wide["flags"] = [flags.get(key, "") for key in wide.index]
    return wide.reset_index()


def union_flags(values: Any) -> str:
    """The flags of several rows (each a comma-separated string, ``flags``) as one sorted, comma-separated string."""
    return ",".join(sorted({flag for value in values if isinstance(value, str) for flag in value.split(",") if flag}))
