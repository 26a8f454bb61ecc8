"""Weights & Biases logging: a view of the results, never their source of truth.

Off unless ``wandb.mode`` is ``online`` or ``offline`` (the default comes from ``$WANDB_MODE``, else
``disabled``).  Runs are grouped by experiment (``run.experiment`` or ``wandb.group``) and named
``model-method-budget-task``; per-dataset scores go to a ``wandb.Table`` and averages to the run summary.  A W&B
failure is reported and ignored: it never fails or corrupts a run.
"""

from __future__ import annotations

import warnings
from typing import Any

from omegaconf import DictConfig, OmegaConf

WANDB_MODES = ("online", "offline", "disabled")


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
        mode = str(cfg.wandb.mode)
        if mode not in WANDB_MODES:
            from kvbench.errors import KVBenchError

            raise KVBenchError(f"wandb.mode={mode!r}; valid: {', '.join(WANDB_MODES)}")
        if mode == "disabled":
            return None
        try:
            import wandb
        except ImportError:
            warnings.warn(
                "wandb.mode is set but wandb is not installed (pip install kvbench[wandb]); not logging", stacklevel=2
            )
            return None
        from kvbench.results import run_dir

        folder = run_dir(
            cfg.run.output_root, cfg.model.name, cfg.task.name, cfg.method.name, cfg.budget.name, cfg.run.tag
        )
        try:
            from kvbench.runner import config_hash

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

            columns = ["dataset", "metric", "score", "n_samples", "kept_fraction"]
            rows = [[r.dataset, r.metric, r.score, r.n_samples, r.mean_kept_fraction] for r in results]
            self.run.log({"scores": wandb.Table(columns=columns, data=rows)})
            task = self.cfg.task.name
            for r in results:
                self.run.summary[f"{task}/{r.dataset}"] = r.score
            if results:
                self.run.summary[f"{task}/avg"] = sum(r.score for r in results) / len(results)
            self.run.finish()
        except Exception as err:
            warnings.warn(f"wandb logging failed ({err}); results on disk are unaffected", stacklevel=2)
