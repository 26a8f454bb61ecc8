"""LongBench v2 scoring: the official answer extraction (``pred.py``'s ``extract_answer``) and accuracy table
(``result.py``: overall, easy / hard, short / medium / long), re-implemented from THUDM/LongBench at ``2e00731``.

Official rules
--------------
* The response is the model output with surrounding whitespace stripped (``output.strip()``); extraction removes every
  ``*`` and takes the letter of the first ``The correct answer is (X)``, else of the first ``The correct answer is X``
  (``X`` in A-D); no match gives ``None``.
* ``judge = pred == answer``; a sample's accuracy is ``int(judge)`` (``result.py``'s ``compensated`` switch, off
  there, would count an unextractable answer as 0.25: :data:`COMPENSATED_SCORE`, a switch here too, off by default).
* Buckets: ``difficulty == "easy"`` is easy and anything else hard; ``length`` ``"short"`` / ``"medium"``, anything
  else long.  Each is ``round(100 * correct / count, 1)``; the official script divides by zero on an empty bucket,
  here it is NaN.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

#: ``result.py``'s ``compensated``: an answer that could not be extracted counts as a random guess among four.
COMPENSATED_SCORE = 0.25
#: The table columns of ``result.py`` (after the model name), in order.
RESULT_COLUMNS = ("Overall", "Easy", "Hard", "Short", "Medium", "Long")

_PARENTHESISED = re.compile(r"The correct answer is \(([A-D])\)")
_BARE = re.compile(r"The correct answer is ([A-D])")


def extract_answer(response: str) -> str | None:
    """The chosen letter of a response (``pred.py``'s ``extract_answer``; ``response`` already stripped)."""
    response = response.replace("*", "")
    match = _PARENTHESISED.search(response) or _BARE.search(response)
    return match.group(1) if match else None


def sample_accuracy(pred: str | None, answer: str, compensated: bool = False) -> float:
    """One sample's accuracy: 1 when ``pred == answer``, else 0 (0.25 for no answer when ``compensated``)."""
    if compensated and pred is None:
        return COMPENSATED_SCORE
    return float(pred == answer)


def bucket_accuracies(
    accuracies: Sequence[float], difficulties: Sequence[str], lengths: Sequence[str]
) -> dict[str, float]:
    """Unrounded ``100 * mean`` accuracy overall and per bucket (``overall``, ``easy``, ``hard``, ``short``,
    ``medium``, ``long``; NaN for an empty bucket), with ``result.py``'s bucket rules."""
    buckets: dict[str, list[float]] = {name: [] for name in ("easy", "hard", "short", "medium", "long")}
    for accuracy, difficulty, length in zip(accuracies, difficulties, lengths, strict=True):
        buckets["easy" if difficulty == "easy" else "hard"].append(accuracy)
        buckets[length if length in ("short", "medium") else "long"].append(accuracy)
    scores = {"overall": _percent(list(accuracies))}
    scores.update({name: _percent(values) for name, values in buckets.items()})
    return scores


def result_row(records: Sequence[dict[str, Any]], compensated: bool = False) -> list[float]:
    """``result.py``'s row for one prediction file: ``[Overall, Easy, Hard, Short, Medium, Long]``, each
    ``round(100 * acc, 1)``.  ``records`` are the official prediction lines (``pred``, ``judge``, ``difficulty``,
    ``length``); as in ``result.py`` the accuracy is ``int(judge)``."""
    accuracies = [
        COMPENSATED_SCORE if compensated and record["pred"] is None else float(int(record["judge"]))
        for record in records
    ]
    scores = bucket_accuracies(accuracies, [r["difficulty"] for r in records], [r["length"] for r in records])
    return [round(scores[column.lower()], 1) for column in RESULT_COLUMNS]


def _percent(values: list[float]) -> float:
    return 100 * sum(values) / len(values) if values else math.nan
