"""The embedded default's comparison: what ``python run.py`` (no arguments) prints.

The default configuration (SnapKV, question-aware, 64 tokens per layer, tiny model, ``tiny_niah``) is run next to
a few variants at the same budget -- the full cache, StreamingLLM, and question-agnostic SnapKV -- and one table
shows them side by side, so that what eviction keeps (or loses) is visible at a glance.  Each variant is an
ordinary run with its own results folder, composed by Hydra from the same defaults plus one override.

The comparison runs on one torch thread (:data:`DEMO_THREADS`; ``run.threads=N`` on the command line overrides it):
the tiny model's matrices are too small for more threads to help, and with torch's default (one per core) the
same table cost 133 s of CPU instead of 27 s on 2 cores (issue #48), spent waiting in the thread pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig

from kvbench.app.validation import validate_run
from kvbench.run.records import DatasetResult
from kvbench.run.runner import Runner
from kvbench.run.table import budget_label

#: (column label, Hydra overrides) of the variants run after the default configuration.
DEMO_VARIANTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("full cache", ("method=full",)),
    ("StreamingLLM", ("method=streamingllm",)),
    ("SnapKV q-agnostic", ("task.question_mode=agnostic", "run.tag=agnostic")),
)
#: Torch threads of the comparison unless the command line sets ``run.threads`` (not part of a run's identity).
DEMO_THREADS = 1


def run_demo(cfg: DictConfig, overrides: Sequence[str] = ()) -> dict[str, list[DatasetResult]]:
    """Run the default configuration and its variants; print and return the side-by-side scores.

    ``overrides``: the command line's (extent and run settings, e.g. ``task.num_samples=2``), applied to every
    variant.  Must be called inside the Hydra app (variants are composed with ``hydra.compose``).
    """
    from hydra import compose

    quiet = ["run.print_table=false"]
    if cfg.run.threads is None:
        quiet.append(f"run.threads={DEMO_THREADS}")
    runs = [(f"{cfg.method.name} q-{cfg.task.question_mode}", ()), *DEMO_VARIANTS]
    columns: dict[str, list[DatasetResult]] = {}
    folders: dict[str, Path] = {}
    for label, variant in runs:
        run_cfg = compose(config_name="config", overrides=[*overrides, *variant, *quiet])
        print(f"[{label}] method={run_cfg.method.name} question_mode={run_cfg.task.question_mode}", flush=True)
        runner = Runner(validate_run(run_cfg))
        columns[label] = runner.run()
        folders[label] = runner.folder
    print(format_comparison(cfg, columns, folders))
    return columns


def format_comparison(
    cfg: DictConfig, columns: dict[str, list[DatasetResult]], folders: dict[str, Path] | None = None
) -> str:
    """A dataset x variant table of scores (each with its bootstrap 95 % interval, :mod:`kvbench.run.summary`), with the
    mean fraction of the context's tokens kept and (given ``folders``) the bytes stored as a fraction of the full
    cache's per variant, and where each variant's results are."""
    labels = list(columns)
    datasets = [r.dataset for r in next(iter(columns.values()))]
    width = max(len("dataset"), *(len(d) for d in datasets))
    col = max(14, *(len(label) for label in labels))
    lines = [
        f"model={cfg.model.name} task={cfg.task.name} budget={budget_label(cfg)} "
        f"(score: {next(iter(columns.values()))[0].metric if datasets else ''})",
        f"{'dataset':<{width}}  " + "  ".join(f"{label:>{col}}" for label in labels),
    ]
    for index, dataset in enumerate(datasets):
        cells = [f"{columns[label][index].score:>{col}.1f}" for label in labels]
        lines.append(f"{dataset:<{width}}  " + "  ".join(cells))
        intervals = [_interval_cell(columns[label][index].interval) for label in labels]
        lines.append(f"{'  95% CI':<{width}}  " + "  ".join(f"{cell:>{col}}" for cell in intervals))
    kept = [sum(r.mean_kept_fraction for r in columns[label]) / max(len(columns[label]), 1) for label in labels]
    lines.append(f"{'tokens kept':<{width}}  " + "  ".join(f"{k:>{col}.1%}" for k in kept))
    if folders:
        stored = [stored_vs_full(folders[label], columns[label]) for label in labels]
        cells = ["-" if value is None else f"{value:.1%}" for value in stored]
        lines.append(f"{'bytes stored':<{width}}  " + "  ".join(f"{c:>{col}}" for c in cells))
    for label, folder in (folders or {}).items():
        lines.append(f"results ({label}): {folder}")
    return "\n".join(lines)


def stored_vs_full(folder: Path, results: list[DatasetResult]) -> float | None:
    """The run's mean bytes stored as a fraction of the full cache's for the same tokens (each dataset's
    ``metrics.json`` ``cache.mean_stored_vs_full``, averaged over the datasets): a method that stores a cache per
    query head (SnapKV) stores more bytes than one that keeps as many tokens per KV head (StreamingLLM)."""
    from kvbench.storage.reader import read_metrics

    values = []
    for result in results:
        path = folder / result.dataset / "metrics.json"
        value = (read_metrics(path).get("cache") or {}).get("mean_stored_vs_full") if path.exists() else None
        if value is None:
            return None
        values.append(float(value))
    return sum(values) / len(values) if values else None


def _interval_cell(interval: tuple[float, float] | None) -> str:
    return "-" if interval is None else f"[{interval[0]:.1f}, {interval[1]:.1f}]"
