"""The plain-text score table a run prints at its end (``run.print_table``), and the budget's label."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from kvbench.run.records import DatasetResult, kv_quant_settings


def _interval_text(interval: Sequence[float] | None) -> str:
    return "-" if interval is None else f"[{interval[0]:.2f}, {interval[1]:.2f}]"


def format_table(
    cfg: DictConfig, results: list[DatasetResult], folder: Path, summary: dict[str, Any] | None = None
) -> str:
    """A plain-text score table for the terminal (``summary``: the run's ``summary.json``, for the average's
    interval)."""
    title = (
        f"model={cfg.model.name} task={cfg.task.name} method={cfg.method.name} budget={budget_label(cfg)} "
        f"question_mode={cfg.task.question_mode}"
        + (f" tag={cfg.run.tag}" if cfg.run.tag else "")
        + (f" kv_quant={quant['name']}" if (quant := kv_quant_settings(cfg)) else "")
    )
    width = max([len("dataset"), *(len(r.dataset) for r in results)])
    header = f"{'dataset':<{width}}  {'metric':<18} {'score':>7} {'95% CI':>16} {'n':>4} {'kept':>6}"
    lines = [title, header]
    for r in results:
        note = f" (first {r.n_samples} of {r.first_of})" if r.first_of else " (cached)" if r.skipped else ""
        lines.append(
            f"{r.dataset:<{width}}  {r.metric:<18} {r.score:7.2f} {_interval_text(r.interval):>16} {r.n_samples:4d} "
            f"{r.mean_kept_fraction:6.1%}{note}"
        )
    if results:
        mean = sum(r.score for r in results) / len(results)
        mean_interval = (summary or {}).get("averages", {}).get("mean", {}).get("ci95")
        lines.append(f"{'average':<{width}}  {'':<18} {mean:7.2f} {_interval_text(mean_interval):>16}")
    lines.append("95% CI: percentile bootstrap over samples, 1000 resamples (summary.json)")
    lines.append(f"results: {folder}")
    return "\n".join(lines)


def budget_label(cfg: DictConfig) -> str:
    """The budget as run (``budget.spec``), with the preset's name when it differs (``96L (preset 128L)``)."""
    spec, name = str(cfg.budget.spec), str(cfg.budget.name)
    return spec if spec == name else f"{spec} (preset {name})"
