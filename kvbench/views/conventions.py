"""How each paper turns per-dataset scores into the summary columns it prints.

Every paper table has *dataset* columns (one benchmark dataset each) and *aggregate* columns (an average, a
category mean, a weighted overall).  A :class:`Convention` computes the aggregate columns from a mapping
``dataset -> score``; the same code is used for our runs and, in the tests, for the paper's own per-dataset
numbers (which must reproduce the printed averages, except the errata listed in :mod:`kvbench.reporting.paper_refs`).

Conventions (from the specs in ``../shared/specs``):

* ``mean``: plain, unweighted mean of the datasets (Ada-KV, CAKE: 16 LongBench datasets; XKV: 14; AhaKV's
  ablation: 5).
* ``longbench21``: AhaKV's category columns (mean of each LongBench category's datasets) and the "Average" over
  all 21 LongBench datasets, which equals the category means weighted by their dataset counts (2,4,4,4,4,3)/21.
* ``needlebench``: NeedleBench v1 (CAKE): subtask overall = mean(ZH, EN); overall = 0.4 S-RT + 0.3 M-RT + 0.3 M-RS.
* ``run_mean``: mean over all datasets the run has (Ada-KV's needle average "over context lengths", RULER).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kvbench.resources import tasks_dir

#: The 16 English LongBench datasets in the column order used by Ada-KV and CAKE (the task's own definition,
#: tasks/longbench/datasets.json, read as data: reporting imports no task code).
LONGBENCH16: tuple[str, ...] = tuple(
    json.loads((tasks_dir() / "longbench" / "datasets.json").read_text(encoding="utf-8"))["tasks"]["longbench"]
)

#: XKV drops the two synthetic datasets.
LONGBENCH14: tuple[str, ...] = tuple(d for d in LONGBENCH16 if d not in ("passage_count", "passage_retrieval_en"))

#: LongBench v1 categories over all 21 datasets (AhaKV's columns; "Passage Retrieval" is the Synthetic category).
LONGBENCH21_CATEGORIES: dict[str, tuple[str, ...]] = {
    "code": ("lcc", "repobench-p"),
    "few_shot": ("trec", "triviaqa", "samsum", "lsht"),
    "single_doc_qa": ("narrativeqa", "qasper", "multifieldqa_en", "multifieldqa_zh"),
    "multi_doc_qa": ("hotpotqa", "2wikimqa", "musique", "dureader"),
    "summarization": ("gov_report", "qmsum", "multi_news", "vcsum"),
    "synthetic": ("passage_count", "passage_retrieval_en", "passage_retrieval_zh"),
}
LONGBENCH21: tuple[str, ...] = tuple(d for ds in LONGBENCH21_CATEGORIES.values() for d in ds)

#: NeedleBench subtasks (S-RT, M-RT, M-RS; our needlebench task names its datasets ``<subtask>_<lang>``) and the
#: v1 weights of the overall score.
NEEDLEBENCH_SUBTASKS: dict[str, float] = {"single_retrieval": 0.4, "multi_retrieval": 0.3, "multi_reasoning": 0.3}
NEEDLEBENCH_DATASETS: tuple[str, ...] = tuple(f"{s}_{lang}" for s in NEEDLEBENCH_SUBTASKS for lang in ("zh", "en"))


class MissingData(KeyError):
    """Raised when an aggregate cannot be computed because some datasets are missing."""

    def __init__(self, column: str, missing: Sequence[str]) -> None:
        super().__init__(f"{column}: missing {', '.join(missing)}")
        self.column = column
        self.missing = list(missing)


def _mean(scores: Mapping[str, float], datasets: Sequence[str], column: str) -> float:
    missing = [d for d in datasets if d not in scores or scores[d] is None or math.isnan(scores[d])]
    if missing:
        raise MissingData(column, missing)
    return sum(scores[d] for d in datasets) / len(datasets)


@dataclass(frozen=True)
class Convention:
    """An averaging convention.

    Attributes
    ----------
    name:
        ``mean`` | ``longbench21`` | ``needlebench`` | ``run_mean`` | ``none``.
    datasets:
        For ``mean``: the datasets averaged into ``avg`` (empty = the table's dataset columns).
    min_datasets:
        For ``run_mean``: the fewest datasets a run must have for its mean to count.
    """

    name: str
    datasets: tuple[str, ...] = ()
    min_datasets: int = 1
    extra: dict[str, str] = field(default_factory=dict)

    def required(self, table_datasets: Sequence[str]) -> tuple[str, ...]:
        """Datasets a run must have for every aggregate column (empty for ``run_mean``: whatever exists)."""
        if self.name == "mean":
            return tuple(self.datasets or table_datasets)
        if self.name == "longbench21":
            return LONGBENCH21
        if self.name == "needlebench":
            return NEEDLEBENCH_DATASETS
        return ()

    def aggregate(self, column: str, scores: Mapping[str, float], table_datasets: Sequence[str] = ()) -> float:
        """Value of aggregate ``column`` from per-dataset ``scores``; raises :class:`MissingData` if incomplete."""
        if self.name == "mean":
            if column != "avg":
                raise KeyError(f"convention 'mean' has only the 'avg' column, not {column!r}")
            return _mean(scores, self.datasets or table_datasets, column)
        if self.name == "longbench21":
            if column == "avg":
                return _mean(scores, LONGBENCH21, column)
            return _mean(scores, LONGBENCH21_CATEGORIES[column], column)
        if self.name == "needlebench":
            if column in NEEDLEBENCH_SUBTASKS:
                return _mean(scores, (f"{column}_zh", f"{column}_en"), column)
            if column == "overall":
                return sum(w * self.aggregate(s, scores) for s, w in NEEDLEBENCH_SUBTASKS.items())
            raise KeyError(f"convention 'needlebench' has no column {column!r}")
        if self.name == "run_mean":
            present = [d for d, v in scores.items() if v is not None and not math.isnan(v)]
            if len(present) < self.min_datasets:
                raise MissingData(column, [f"at least {self.min_datasets} datasets (found {len(present)})"])
            return sum(scores[d] for d in present) / len(present)
        raise KeyError(f"convention {self.name!r} computes no aggregate columns")


def longbench21_average_from_categories(categories: Mapping[str, float]) -> float:
    """AhaKV's printed "Average" from its printed category columns: the category means weighted by size."""
    total = sum(len(ds) for ds in LONGBENCH21_CATEGORIES.values())
    return sum(categories[c] * len(ds) for c, ds in LONGBENCH21_CATEGORIES.items()) / total


def needlebench_overall_from_subtasks(subtasks: Mapping[str, float]) -> float:
    """NeedleBench v1 overall from (printed) subtask overall scores."""
    return sum(w * subtasks[s] for s, w in NEEDLEBENCH_SUBTASKS.items())
