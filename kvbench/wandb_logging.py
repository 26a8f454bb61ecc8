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
"""

from __future__ import annotations

import warnings
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

    def __init__(self, run: Any, cfg: DictConfig) -> None:
        self.run = run
        self.cfg = cfg

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
        from kvbench.results import config_hash, run_dir

        folder = run_dir(
            cfg.run.output_root, cfg.model.name, cfg.task.name, cfg.method.name, cfg.budget.name, cfg.run.tag
        )
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
        return cls(run, cfg)

    def log_results(self, results: list[Any]) -> None:
        """Per-dataset table and averages in the summary; finishes the run."""
        try:
            import wandb

            cfg = self.cfg
            names = [cfg.model.name, cfg.method.name, cfg.budget.name, cfg.task.name]
            rows = [[*names, r.dataset, r.metric, r.score, r.n_samples, r.mean_kept_fraction] for r in results]
            self.run.log({"scores": wandb.Table(columns=TABLE_COLUMNS, data=rows)})
            self.run.summary.update(summary_values(cfg.task.name, results))
            self.run.finish()
        except Exception as err:
            warnings.warn(f"wandb logging failed ({err}); results on disk are unaffected", stacklevel=2)

    def abort(self, exit_code: int = 1) -> None:
        """Close the run of an interrupted/failed job (its requeued attempt resumes the same W&B run)."""
        try:
            self.run.finish(exit_code=exit_code)
        except Exception as err:
            warnings.warn(f"wandb finish failed ({err})", stacklevel=2)


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
