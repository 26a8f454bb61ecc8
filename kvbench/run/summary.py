"""The run summary (``summary.json`` beside the run's ``config.yaml``): every dataset's score with a bootstrap 95 %
interval over its samples, the papers' averages, the kept fraction, timings and provenance, in one file.

Bootstrap (per dataset): the score's samples are resampled with replacement :data:`BOOTSTRAP_RESAMPLES` (1000)
times; the interval is the percentile interval of the resampled means (2.5th and 97.5th percentiles, numpy's
linear interpolation).  Each dataset's generator is seeded from the run's ``seed`` and the dataset's name
(:func:`dataset_seed`), so a summary is reproducible and does not depend on the order of the datasets.  The
averages' intervals resample every dataset at once: resample ``r`` of an average is that average of the datasets'
resample-``r`` means.

A dataset's score is resampled as the mean of its per-sample scores (:func:`sample_scores`: the dataset's own
scorer on each sample alone); they are written beside the interval (``per_sample``: ``ids`` and ``scores``), so a
report can pair two runs' samples (:mod:`kvbench.reporting.pivot`: the difference to the full cache).  When that
mean does not reproduce the dataset's score (a score that is not a mean over samples), the dataset gets no interval
and says why.

Averages (``averages``): ``mean``, the plain mean over the run's datasets (the console table's "average"; RULER,
the needle tasks), plus each paper convention the run's datasets complete (:mod:`kvbench.views.conventions`):
``longbench16`` (Ada-KV, CAKE), ``longbench14`` (XKV), LongBench's category means and ``longbench21`` (AhaKV), and
NeedleBench's subtask means and ``needlebench_overall`` (0.4 / 0.3 / 0.3, CAKE).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvbench.views.conventions import (
    LONGBENCH14,
    LONGBENCH16,
    LONGBENCH21_CATEGORIES,
    NEEDLEBENCH_SUBTASKS,
    Convention,
    MissingData,
)

SUMMARY_FILE = "summary.json"
#: Bootstrap resamples per dataset.
BOOTSTRAP_RESAMPLES = 1000
#: Coverage of the intervals.
INTERVAL_LEVEL = 0.95
#: How far the mean of the per-sample scores may be from the dataset's score (scorers round to 2 decimals).
MEAN_TOLERANCE = 0.011


def dataset_seed(run_seed: int, dataset: str) -> int:
    """The bootstrap seed of one dataset: stable across runs, processes and dataset order."""
    return zlib.crc32(f"{run_seed}:{dataset}".encode())


def bootstrap_means(values: Sequence[float], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> np.ndarray:
    """``[resamples]`` means of ``values`` resampled with replacement (numpy's PCG64 seeded with ``seed``)."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        raise ValueError("cannot bootstrap an empty list of scores")
    if resamples < 1:
        raise ValueError(f"resamples={resamples}; valid: a positive number")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, data.size, size=(resamples, data.size))
    return data[picks].mean(axis=1)


def percentile_interval(resampled: np.ndarray, level: float = INTERVAL_LEVEL) -> tuple[float, float]:
    """The central ``level`` percentile interval of resampled statistics."""
    if not 0 < level < 1:
        raise ValueError(f"level={level}; valid: between 0 and 1")
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(resampled, [tail, 100 - tail])
    return float(low), float(high)


def bootstrap_interval(
    values: Sequence[float], resamples: int = BOOTSTRAP_RESAMPLES, level: float = INTERVAL_LEVEL, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (one value, or all equal: a zero-width interval)."""
    return percentile_interval(bootstrap_means(values, resamples, seed), level)


def sample_scores(
    score: Callable[[Sequence[str], Sequence[Any]], Mapping[str, float]],
    predictions: Sequence[str],
    samples: Sequence[Any],
    dataset_score: float,
) -> tuple[list[float] | None, str | None]:
    """Per-sample scores (``score`` -- a dataset's scorer -- on each sample alone), or ``(None, why)`` when their
    mean does not reproduce ``dataset_score``."""
    pairs = zip(predictions, samples, strict=True)
    values = [float(score([prediction], [sample])["score"]) for prediction, sample in pairs]
    if not values:
        return None, "no samples"
    mean = sum(values) / len(values)
    if math.isnan(dataset_score) or abs(mean - dataset_score) > MEAN_TOLERANCE:
        return None, (
            f"the dataset's score ({dataset_score}) is not the mean of its per-sample scores ({mean:.4f}), so samples "
            "cannot be resampled"
        )
    return values, None


@dataclass
class DatasetScores:
    """One dataset's inputs to the summary."""

    dataset: str
    metric: str
    score: float
    n_samples: int
    kept_fraction: float
    sample_scores: list[float] | None = None
    #: The samples' ids, in the order of ``sample_scores`` (written beside them: a paired comparison of two runs
    #: matches samples by id).
    sample_ids: list[str] | None = None
    no_interval_reason: str | None = None
    timing: dict[str, Any] = field(default_factory=dict)
    data_provenance: dict[str, Any] = field(default_factory=dict)
    cached: bool = False


def interval_of(scores: DatasetScores, run_seed: int) -> tuple[float, float] | None:
    """The dataset's 95 % bootstrap interval (``None`` when it has no per-sample scores)."""
    if not scores.sample_scores:
        return None
    return bootstrap_interval(scores.sample_scores, seed=dataset_seed(run_seed, scores.dataset))


def _conventions() -> dict[str, tuple[tuple[str, ...], Callable[[Mapping[str, float]], float]]]:
    """Paper average columns: name -> (the datasets it needs, how it combines their scores)."""
    longbench21, needlebench = Convention("longbench21"), Convention("needlebench")
    columns: dict[str, tuple[tuple[str, ...], Callable[[Mapping[str, float]], float]]] = {
        "longbench16": (LONGBENCH16, lambda s: Convention("mean", LONGBENCH16).aggregate("avg", s)),
        "longbench14": (LONGBENCH14, lambda s: Convention("mean", LONGBENCH14).aggregate("avg", s)),
    }
    for category, datasets in LONGBENCH21_CATEGORIES.items():
        columns[f"longbench_{category}"] = (datasets, lambda s, c=category: longbench21.aggregate(c, s))
    columns["longbench21"] = (
        tuple(d for ds in LONGBENCH21_CATEGORIES.values() for d in ds),
        lambda s: longbench21.aggregate("avg", s),
    )
    for subtask in NEEDLEBENCH_SUBTASKS:
        columns[f"needlebench_{subtask}"] = (
            (f"{subtask}_zh", f"{subtask}_en"),
            lambda s, t=subtask: needlebench.aggregate(t, s),
        )
    columns["needlebench_overall"] = (
        tuple(f"{t}_{lang}" for t in NEEDLEBENCH_SUBTASKS for lang in ("zh", "en")),
        lambda s: needlebench.aggregate("overall", s),
    )
    return columns


def paper_averages(scores: Mapping[str, float]) -> dict[str, float]:
    """``mean`` over all datasets, plus every paper convention whose datasets ``scores`` holds (module docstring)."""
    if not scores:
        return {}
    averages = {"mean": sum(scores.values()) / len(scores)}
    for column, (needed, combine) in _conventions().items():
        if set(needed) <= set(scores):
            try:
                averages[column] = combine(scores)
            except MissingData:  # a NaN score
                continue
    return averages


def average_intervals(datasets: Sequence[DatasetScores], run_seed: int) -> dict[str, tuple[float, float]]:
    """The averages' 95 % intervals, every dataset resampled at once (only when every dataset has samples)."""
    if not datasets or any(not d.sample_scores for d in datasets):
        return {}
    resampled = {
        d.dataset: bootstrap_means(d.sample_scores or [], seed=dataset_seed(run_seed, d.dataset)) for d in datasets
    }
    columns = paper_averages({d.dataset: d.score for d in datasets})
    per_resample = [
        paper_averages({name: float(means[r]) for name, means in resampled.items()}) for r in range(BOOTSTRAP_RESAMPLES)
    ]
    return {
        column: percentile_interval(np.array([averages[column] for averages in per_resample])) for column in columns
    }


def build_summary(run: Mapping[str, Any], datasets: Sequence[DatasetScores], run_seed: int) -> dict[str, Any]:
    """The ``summary.json`` payload.

    ``run``: the run's identity and provenance (``run_meta.json``'s fields: model, task, method, budget, versions,
    git commit, device, times, status).  The intervals are 95 % percentile bootstrap intervals (module docstring).
    """
    rows = []
    for d in datasets:
        interval = interval_of(d, run_seed)
        rows.append(
            {
                "dataset": d.dataset,
                "metric": d.metric,
                "score": d.score,
                "ci95": list(interval) if interval else None,
                **({"ci95_missing": d.no_interval_reason} if interval is None else {}),
                "n_samples": d.n_samples,
                "kept_fraction": d.kept_fraction,
                "timing": d.timing,
                "data_provenance": d.data_provenance,
                "cached": d.cached,
                **(
                    {"per_sample": {"ids": list(d.sample_ids), "scores": list(d.sample_scores)}}
                    if d.sample_scores and d.sample_ids and len(d.sample_ids) == len(d.sample_scores)
                    else {}
                ),
            }
        )
    averages = paper_averages({d.dataset: d.score for d in datasets})
    intervals = average_intervals(datasets, run_seed)
    total_samples = sum(d.n_samples for d in datasets)
    return {
        "run": dict(run),
        "bootstrap": {
            "method": "percentile",
            "level": INTERVAL_LEVEL,
            "resamples": BOOTSTRAP_RESAMPLES,
            "unit": "sample",
            "seed": f"crc32('{run_seed}:<dataset>')",
        },
        "datasets": rows,
        "averages": {
            column: {"score": value, "ci95": list(intervals[column]) if column in intervals else None}
            for column, value in averages.items()
        },
        "kept_fraction": (
            sum(d.kept_fraction * d.n_samples for d in datasets) / total_samples if total_samples else None
        ),
        "timing": _total_timing(datasets),
    }


def _total_timing(datasets: Sequence[DatasetScores]) -> dict[str, Any]:
    """Seconds over the run's datasets: total, and the per-sample prefill/decode means weighted by samples."""
    timed = [d.timing for d in datasets if d.timing.get("n")]
    n = sum(int(t["n"]) for t in timed)
    if not n:
        return {"n": 0}
    return {
        "n": n,
        "total_s": round(sum(float(t.get("total_s", 0.0)) for t in timed), 3),
        "prefill_s_mean": round(sum(float(t["prefill_s_mean"]) * int(t["n"]) for t in timed) / n, 4),
        "decode_s_mean": round(sum(float(t["decode_s_mean"]) * int(t["n"]) for t in timed) / n, 4),
    }
