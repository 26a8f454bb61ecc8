"""The run summary's statistics (kvbench/run/summary.py): the bootstrap interval on plain lists, per-sample scores, the
papers' averages.  The runner writing summary.json is checked in test_runner.py.  Pure Python, well under 1 s."""

from __future__ import annotations

import math

import pytest

from kvbench.run.summary import (
    BOOTSTRAP_RESAMPLES,
    DatasetScores,
    bootstrap_interval,
    bootstrap_means,
    build_summary,
    dataset_seed,
    paper_averages,
    sample_scores,
)
from kvbench.views.conventions import LONGBENCH16, LONGBENCH21_CATEGORIES, longbench21_average_from_categories

SCORES = [0.0, 100.0, 100.0, 50.0, 0.0, 100.0, 25.0, 100.0, 75.0, 100.0]


def test_bootstrap_interval_is_deterministic_and_contains_the_mean() -> None:
    low, high = bootstrap_interval(SCORES, seed=3)
    assert (low, high) == bootstrap_interval(SCORES, seed=3)
    assert (low, high) != bootstrap_interval(SCORES, seed=4)
    mean = sum(SCORES) / len(SCORES)
    assert low < mean < high
    assert low >= 0.0 and high <= 100.0
    # A 95 % interval is narrower than the whole resampling range and wider than a 50 % one.
    means = bootstrap_means(SCORES, seed=3)
    assert len(means) == BOOTSTRAP_RESAMPLES
    assert means.min() <= low and high <= means.max()
    narrow = bootstrap_interval(SCORES, level=0.5, seed=3)
    assert low <= narrow[0] <= narrow[1] <= high


def test_bootstrap_interval_narrows_with_more_samples() -> None:
    width = [bootstrap_interval(SCORES * copies, seed=1) for copies in (1, 10)]
    assert width[1][1] - width[1][0] < (width[0][1] - width[0][0]) / 2


def test_degenerate_samples_give_a_zero_width_interval() -> None:
    assert bootstrap_interval([42.0]) == (42.0, 42.0)
    assert bootstrap_interval([7.5] * 20) == (7.5, 7.5)
    with pytest.raises(ValueError, match="empty"):
        bootstrap_interval([])
    with pytest.raises(ValueError, match="level"):
        bootstrap_interval(SCORES, level=1.5)


def test_dataset_seed_depends_on_run_seed_and_name_only() -> None:
    assert dataset_seed(0, "qasper") == dataset_seed(0, "qasper")
    assert len({dataset_seed(0, "qasper"), dataset_seed(1, "qasper"), dataset_seed(0, "hotpotqa")}) == 3


def _mean_scorer(predictions: list[str], samples: list[str]) -> dict[str, float]:
    """A dataset's score(): the mean of exact matches x 100, rounded like the benchmarks' scorers."""
    hits = [100.0 * (p == s) for p, s in zip(predictions, samples, strict=True)]
    return {"score": round(sum(hits) / len(hits), 2)}


def test_sample_scores_reproduce_a_mean_score_and_refuse_other_scores() -> None:
    predictions, answers = ["a", "b", "c"], ["a", "x", "c"]
    values, why = sample_scores(_mean_scorer, predictions, answers, _mean_scorer(predictions, answers)["score"])
    assert values == [100.0, 0.0, 100.0] and why is None
    # A score that is not the samples' mean (e.g. a maximum over them) gets no interval, with the reason.
    values, why = sample_scores(_mean_scorer, predictions, answers, 100.0)
    assert values is None and "not the mean" in why


def test_paper_averages_follow_the_papers_conventions() -> None:
    all21 = [d for ds in LONGBENCH21_CATEGORIES.values() for d in ds]
    scores = {name: float(i) for i, name in enumerate(all21)}
    averages = paper_averages(scores)
    assert averages["mean"] == pytest.approx(sum(scores.values()) / 21)
    assert averages["longbench21"] == pytest.approx(averages["mean"])
    categories = {c: averages[f"longbench_{c}"] for c in LONGBENCH21_CATEGORIES}
    assert longbench21_average_from_categories(categories) == pytest.approx(averages["longbench21"])
    assert averages["longbench16"] == pytest.approx(sum(scores[d] for d in LONGBENCH16) / 16)
    # Only the conventions a run's datasets complete are reported.
    partial = paper_averages({"qasper": 10.0, "hotpotqa": 20.0})
    assert set(partial) == {"mean"}
    subtasks = {"single_retrieval": 90.0, "multi_retrieval": 60.0, "multi_reasoning": 30.0}
    needle = {f"{t}_{lang}": v for t, v in subtasks.items() for lang in ("zh", "en")}
    assert paper_averages(needle)["needlebench_overall"] == pytest.approx(0.4 * 90 + 0.3 * 60 + 0.3 * 30)


def test_build_summary_intervals_for_datasets_and_averages() -> None:
    datasets = [
        DatasetScores("a", "m", 60.0, 10, 0.1, sample_scores=SCORES[:]),
        DatasetScores("b", "m", 100.0, 3, 0.2, sample_scores=[100.0] * 3),
    ]
    summary = build_summary({"model": "x"}, datasets, run_seed=0)
    rows = {row["dataset"]: row for row in summary["datasets"]}
    assert rows["b"]["ci95"] == [100.0, 100.0]
    low, high = rows["a"]["ci95"]
    assert low < 60.0 < high
    mean = summary["averages"]["mean"]
    assert mean["score"] == pytest.approx(80.0)
    assert mean["ci95"][0] < 80.0 < mean["ci95"][1] and mean["ci95"][0] >= (low + 100.0) / 2 - 1e-9
    assert summary["kept_fraction"] == pytest.approx((0.1 * 10 + 0.2 * 3) / 13)
    assert summary["bootstrap"]["resamples"] == BOOTSTRAP_RESAMPLES
    # A dataset without per-sample scores: no interval for it nor for the averages, and the reason is kept.
    no_samples = DatasetScores("c", "m", 5.0, 2, 0.3, no_interval_reason="why not")
    summary = build_summary({}, [*datasets, no_samples], run_seed=0)
    row = summary["datasets"][-1]
    assert row["ci95"] is None and row["ci95_missing"] == "why not"
    assert summary["averages"]["mean"]["ci95"] is None and not math.isnan(summary["averages"]["mean"]["score"])
