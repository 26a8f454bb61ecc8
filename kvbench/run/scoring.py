"""Scoring a finished dataset without letting one prediction fail it (:mod:`kvbench.metrics.guard`).

:func:`score_rows` runs the dataset's scorer while collecting the errors its :class:`~kvbench.metrics.guard.ScoreGuard`
records: each such prediction scored 0; its row in ``predictions.jsonl`` gets ``"scoring_error": "<Type>: <message>"``
(the file rewritten atomically, only when there is an error) and ``metrics.json`` counts them (``scoring_errors``:
``{"count": n, "by_sample": {id: message}}``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvbench.metrics.guard import collect_scoring_errors
from kvbench.sample import Sample
from kvbench.storage.writers import PREDICTIONS_FILE, PredictionLog, atomic_write_text

LOG = logging.getLogger("kvbench")


def score_rows(
    dataset: Any, rows: list[dict[str, Any]], samples: Sequence[Sample], folder: Path
) -> tuple[dict[str, float], dict[str, Any]]:
    """``(scores, scoring_errors record)`` of ``dataset`` (a :class:`~kvbench.tasks.base.TaskDataset`) on ``rows``
    (its prediction rows, in sample order); ``folder``: the dataset's results folder, whose rows are marked."""
    with collect_scoring_errors() as errors:
        scores = dataset.score([row["prediction"] for row in rows], samples)
    if errors:
        LOG.warning(
            "%s: %d prediction(s) could not be scored and count as wrong (recorded as scoring_error in %s): %s",
            dataset.name,
            len(errors),
            PREDICTIONS_FILE,
            "; ".join(f"{key}: {message}" for key, message in list(errors.items())[:3]),
        )
        for row in rows:
            if row["id"] in errors:
                row["scoring_error"] = errors[row["id"]]
        mark_rows(folder / PREDICTIONS_FILE, errors)
    return scores, {"count": len(errors), "by_sample": dict(errors)}


def mark_rows(path: Path, errors: dict[str, str]) -> None:
    """Rewrite ``predictions.jsonl`` (atomically) with ``scoring_error`` on the rows of ``errors``' ids."""
    if not path.exists():
        return
    rows = PredictionLog(path).load()
    for row in rows:
        if row["id"] in errors:
            row["scoring_error"] = errors[row["id"]]
    atomic_write_text(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
