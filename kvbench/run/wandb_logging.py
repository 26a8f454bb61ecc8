"""Weights & Biases logging: a view of the results, never their source of truth.

Off unless ``wandb.mode`` is ``online`` or ``offline`` (the default comes from ``$WANDB_MODE``, else
``disabled``).  Runs are grouped by experiment (``run.experiment`` or ``wandb.group``) and named
``model-method-budget-task``; per-dataset scores go to a ``wandb.Table`` (columns :data:`TABLE_COLUMNS`, one row
per dataset, with the run's model/method/budget/task so tables of many runs can be merged) and to the run summary
as ``<task>/<dataset>``, with ``<task>/avg`` (mean over datasets), ``avg``, ``kept_fraction`` and ``n_datasets``.

The run id is derived from the config hash, so a preempted and requeued SLURM job logs to the same W&B run (offline
runs of both attempts sync into one).  Offline mode (``WANDB_MODE=offline``, the default on SLURM nodes via
``slurm/array.sbatch``) needs no network or API key; upload later with ``wandb sync <run folder>/wandb/offline-run-*``.
A W&B failure is reported and ignored: it never fails or corrupts a run.

What the report panels (``kvbench wandb-report``, :mod:`kvbench.reporting.wandb_report`) read, logged when the run
ends (:func:`panel_fields`, :func:`interval_values`):

* config ``panel.*``: the categorical fields to group and filter by (``panel.method``, ``panel.family``,
  ``panel.model``, ``panel.task``, ``panel.question_mode``, ``panel.tag``, ``panel.experiment``, ``panel.budget``,
  and ``panel.group``: ``<method> · <question mode>[ · <tag>]``, one line per method and question mode) and the
  numeric axes (``panel.budget_tokens_per_layer``, ``panel.kept_fraction``, ``panel.stored_fraction``,
  ``panel.context_length``) -- a namespace of their own, beside the resolved config whose ``model``/``method``/
  ``task`` are the presets' full settings;
* one history row with the axes, the scores, their intervals (``.../ci95_low|ci95_high``) and, when the same
  model's and task's full-cache run is on disk beside this one, its scores as ``full_cache/<task>/<dataset>`` and
  ``full_cache/<task>/avg`` (so that a line plot with the budget as x axis draws the full cache as a horizontal line
  across the budgets), so that a line plot grouped by ``panel.group`` draws score vs budget with its interval;
* summary ``<task>/<dataset>/ci95_low|ci95_high`` (the bootstrap 95 % interval) and the paper averages of
  ``summary.json`` as ``<task>/avg/<column>`` with their intervals;
* ``needle/<dataset>``: the needle heatmap image of every dataset whose predictions carry a depth and a length.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from kvbench.checks import check_choice
from kvbench.config import WANDB_MODES
from kvbench.errors import KVBenchError

#: Columns of the per-dataset ``scores`` table.
TABLE_COLUMNS = ["model", "method", "budget", "task", "dataset", "metric", "score", "n_samples", "kept_fraction"]


def run_name(cfg: DictConfig) -> str:
    """``model-method-budget-task`` (plus ``~tag``)."""
    name = f"{cfg.model.name}-{cfg.method.name}-{cfg.budget.name}-{cfg.task.name}"
    return f"{name}~{cfg.run.tag}" if cfg.run.tag else name


class WandbLogger:
    """Thin wrapper around one W&B run."""

    def __init__(self, run: Any, cfg: DictConfig, folder: Path | None = None) -> None:
        self.run = run
        self.cfg = cfg
        self.folder = folder

    @classmethod
    def create(cls, cfg: DictConfig) -> WandbLogger | None:
        """Start a run, or return None when W&B is disabled or unavailable."""
        mode = check_choice("wandb.mode", str(cfg.wandb.mode), WANDB_MODES, error=KVBenchError)
        if mode == "disabled":
            return None
        try:
            import wandb
        except ImportError:
            warnings.warn(
                "wandb.mode is set but wandb is not installed (pip install kvbench[wandb]); not logging", stacklevel=2
            )
            return None
        from kvbench.storage.paths import run_folder
        from kvbench.storage.writers import config_hash

        folder = run_folder(cfg)
        try:
            run = wandb.init(
                project=cfg.wandb.project,
                entity=cfg.wandb.entity,
                group=cfg.wandb.group or cfg.run.experiment,
                job_type=cfg.task.name,
                name=run_name(cfg),
                id=f"{config_hash(cfg)}",
                resume="allow",
                tags=[cfg.model.name, cfg.method.name, cfg.budget.name, *cfg.wandb.tags],
                config=OmegaConf.to_container(cfg, resolve=True),
                dir=str(folder),
                mode=mode,
                reinit="finish_previous",
            )
        except Exception as err:  # W&B must never fail a run
            warnings.warn(f"wandb.init failed ({err}); continuing without W&B", stacklevel=2)
            return None
        return cls(run, cfg, folder)

    def log_results(self, results: list[Any]) -> None:
        """Per-dataset table and averages in the summary; finishes the run."""
        try:
            import wandb

            cfg = self.cfg
            names = [cfg.model.name, cfg.method.name, cfg.budget.name, cfg.task.name]
            rows = [[*names, r.dataset, r.metric, r.score, r.n_samples, r.mean_kept_fraction] for r in results]
            self.run.log({"scores": wandb.Table(columns=TABLE_COLUMNS, data=rows)})
            extras = self._extras(results)
            panel = panel_fields(cfg, extras)
            self.run.config.update({"panel": panel}, allow_val_change=True)
            values = summary_values(cfg.task.name, results)
            axes = {k: panel[k] for k in AXES if panel.get(k) is not None}
            intervals = interval_values(cfg.task.name, results, extras)
            reference = full_cache_values(self.folder, cfg.task.name)
            self.run.log({**axes, **values, **intervals, **reference, **self._needle_images(wandb, extras)})
            for row in band_rows(cfg.task.name, results, extras):  # the interval bands of the report's panels
                self.run.log({**axes, **row})
            self.run.summary.update({**values, **intervals})
            self.run.finish()
        except Exception as err:
            warnings.warn(f"wandb logging failed ({err}); results on disk are unaffected", stacklevel=2)

    def _extras(self, results: list[Any]) -> dict[str, Any]:
        from kvbench.views.run_views import read_run_extras

        if self.folder is None:
            return {}
        return read_run_extras(self.folder, [r.dataset for r in results])

    def _needle_images(self, wandb: Any, extras: dict[str, Any]) -> dict[str, Any]:
        """``needle/<dataset>``: a W&B image of each needle grid (the PNG is written under the run's wandb/)."""
        from kvbench.views.needle_heatmap import plot_needle_heatmap

        images = {}
        for dataset, grid in (extras.get("needles") or {}).items():
            rows = [
                {"length": length, "depth": depth, "score": score}
                for depth, line in zip(grid["depths"], grid["z"], strict=True)
                for length, score in zip(grid["lengths"], line, strict=True)
                if score is not None
            ]
            path = Path(str(self.folder)) / "wandb" / f"needle_{dataset}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            plot_needle_heatmap(rows, path, title=f"{run_name(self.cfg)} · {dataset}", vmax=100.0)
            images[f"needle/{dataset}"] = wandb.Image(str(path))
        return images

    def abort(self, exit_code: int = 1) -> None:
        """Close the run of an interrupted/failed job (its requeued attempt resumes the same W&B run)."""
        try:
            self.run.finish(exit_code=exit_code)
        except Exception as err:
            warnings.warn(f"wandb finish failed ({err})", stacklevel=2)


#: The numeric axes of the panels (config ``panel.<axis>`` and one history row).
AXES = ("budget_tokens_per_layer", "kept_fraction", "stored_fraction", "context_length")


def full_cache_values(folder: Path | None, task: str) -> dict[str, float]:
    """``full_cache/<task>/<dataset>`` and ``full_cache/<task>/avg``: the scores of the full-cache run of the same
    model and task (``<folder>/../../full/<budget>/summary.json``, the budget ``full`` first), if there is one."""
    if folder is None:
        return {}
    candidates = sorted(Path(folder).parent.parent.glob("full/*/summary.json"), key=lambda p: p.parent.name != "full")
    for path in candidates:
        try:
            summary = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        values = {f"full_cache/{task}/{row['dataset']}": row["score"] for row in summary.get("datasets") or []}
        mean = (summary.get("averages") or {}).get("mean") or {}
        if mean.get("score") is not None:
            values[f"full_cache/{task}/avg"] = mean["score"]
        return {k: v for k, v in values.items() if isinstance(v, (int, float))}
    return {}


def panel_fields(cfg: DictConfig, extras: dict[str, Any]) -> dict[str, Any]:
    """Config ``panel.*``: the categorical fields and numeric axes of the report panels (module docstring)."""
    mode = str(cfg.task.get("question_mode") or "aware")
    tag = str(cfg.run.get("tag") or "")
    return {
        "group": " · ".join(p for p in (str(cfg.method.name), mode, tag if tag != mode else "") if p),
        "tag": tag,
        "method": str(cfg.method.name),
        "family": extras.get("family") or str(cfg.method.get("family") or cfg.method.name),
        "model": str(cfg.model.name),
        "task": str(cfg.task.name),
        "question_mode": mode,
        "experiment": str(cfg.run.get("experiment") or ""),
        "budget": str(cfg.budget.name),
        **{axis: extras.get(axis) for axis in AXES},
    }


def interval_values(task: str, results: list[Any], extras: dict[str, Any]) -> dict[str, Any]:
    """Summary ``<task>/<dataset>/ci95_low|high`` and ``<task>/avg/<column>`` (+ ``/ci95_low|high``)."""
    values: dict[str, Any] = {}
    for r in results:
        if r.interval is not None:
            values[f"{task}/{r.dataset}/ci95_low"], values[f"{task}/{r.dataset}/ci95_high"] = r.interval
    for column, average in (extras.get("averages") or {}).items():
        values[f"{task}/avg/{column}"] = average.get("score")
        if average.get("ci95"):
            values[f"{task}/avg/{column}/ci95_low"], values[f"{task}/avg/{column}/ci95_high"] = average["ci95"]
    return values


#: The history series that draws a score with its 95 % interval as a band (:func:`band_rows`).
BAND = "interval"


def band_rows(task: str, results: list[Any], extras: dict[str, Any]) -> list[dict[str, float]]:
    """Three history rows at the run's budget, ``<task>/<dataset>/interval`` (and ``<task>/avg/<column>/interval``)
    holding the interval's low end, the score, then the high end: a line plot of that series grouped by
    ``panel.group`` with the median and the min-max range draws each method's score as a line and its interval as
    a band (``kvbench wandb-report``).  Scores without an interval give the score three times (no band)."""
    series: dict[str, tuple[float, float, float]] = {}
    for r in results:
        low, high = r.interval if r.interval is not None else (r.score, r.score)
        series[f"{task}/{r.dataset}/{BAND}"] = (low, r.score, high)
    for column, average in (extras.get("averages") or {}).items():
        score = average.get("score")
        if isinstance(score, (int, float)):
            low, high = average.get("ci95") or (score, score)
            series[f"{task}/avg/{column}/{BAND}"] = (low, score, high)
    return [{key: values[i] for key, values in series.items()} for i in range(3)]


def summary_values(task: str, results: list[Any]) -> dict[str, Any]:
    """Summary keys for one run: ``<task>/<dataset>``, ``<task>/avg``, ``avg``, ``kept_fraction``, ``n_datasets``."""
    values: dict[str, Any] = {f"{task}/{r.dataset}": r.score for r in results}
    values["n_datasets"] = len(results)
    if results:
        mean = sum(r.score for r in results) / len(results)
        values[f"{task}/avg"] = mean
        values["avg"] = mean
        values["kept_fraction"] = sum(r.mean_kept_fraction for r in results) / len(results)
    return values
