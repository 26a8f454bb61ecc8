"""A dataset's ``metrics.json`` checked against its ``predictions.jsonl`` (issue #55 item 2), for the runner and every
view: a ``metrics.json`` records its rows (``rows``: their count, the digest of their ids and predictions, and a
checksum binding its score to them), so a score edited afterwards, rows lost or changed since, or a count that is
not the rows on disk is found without re-scoring (the runner re-scores too:
:func:`kvbench.run.resume.metrics_disagree`).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kvbench.storage.reader import DamagedFile, read_prediction_rows

#: Hex digits kept of a digest (as the config hash).
DIGEST_CHARS = 16


def digest(payload: Any) -> str:
    """SHA-256 (first :data:`DIGEST_CHARS` hex) of ``payload`` as canonical JSON."""
    blob = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:DIGEST_CHARS]


def rows_digest(rows: Iterable[Mapping[str, Any]]) -> str:
    """The digest of a dataset's scored rows: their ids and predictions, by id (file order does not matter)."""
    return digest(sorted([str(row["id"]), row.get("prediction")] for row in rows))


def score_checksum(score: Any, n_rows: int, rows_sha256: str) -> str:
    """The digest binding a ``metrics.json``'s score (NaN as ``None``) to the rows it was computed from."""
    try:
        value = float(score) if score is not None else None
    except (TypeError, ValueError):
        value = None
    value = None if value is None or math.isnan(value) else value
    return digest({"score": value, "n": n_rows, "rows_sha256": rows_sha256})


def rows_record(rows: list[dict[str, Any]], score: Any) -> dict[str, Any]:
    """``metrics.json``'s ``rows``: how many rows were scored, their digest and the score's checksum."""
    sha = rows_digest(rows)
    return {"n": len(rows), "sha256": sha, "checksum": score_checksum(score, len(rows), sha)}


def check_metrics(metrics: Mapping[str, Any], predictions: Path) -> tuple[int | None, list[str]]:
    """``(n, problems)`` of a ``metrics.json`` payload beside its ``predictions.jsonl``: ``n`` is what a view shows,
    the complete rows on disk that it counts (``metrics.json``'s own count when there is no ``predictions.jsonl``,
    e.g. a made-up run); ``problems`` says, in words, each way the two disagree (empty: they agree)."""
    claimed = metrics.get("n_samples")
    record = metrics.get("rows") if isinstance(metrics.get("rows"), Mapping) else None
    if record is None and "lm_eval" in metrics:  # lm-eval's own logged samples, not kvbench's prediction rows
        return (int(claimed) if isinstance(claimed, int) else None), []
    problems = []
    if record is not None:
        if score_checksum(metrics.get("score"), int(record.get("n", -1)), str(record.get("sha256"))) != record.get(
            "checksum"
        ):
            problems.append("its score is not the one computed from its rows (metrics.json was edited)")
        if claimed != record.get("n"):
            problems.append(f"n_samples {claimed} != the {record.get('n')} rows it scored (metrics.json was edited)")
    if not predictions.is_file():
        if record is not None:
            problems.append(f"{predictions.name} is missing")
            return 0, problems
        return (int(claimed) if isinstance(claimed, int) else None), problems
    try:
        rows = read_prediction_rows(predictions)
    except DamagedFile as err:
        return 0, [*problems, err.reason_line]
    expected = int(record["n"]) if record is not None else int(claimed or 0)
    if len(rows) < expected:
        problems.append(f"{predictions.name} holds {len(rows)} complete rows, metrics.json counts {expected}")
        return len(rows), problems
    if record is not None and len(rows) == expected and rows_digest(rows) != record.get("sha256"):
        problems.append(f"{predictions.name}'s rows are not the ones metrics.json scored (changed since)")
    return expected, problems
