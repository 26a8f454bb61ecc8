"""One prediction's scoring error never fails a dataset.

The official harnesses score prediction by prediction and survive a bad one in different ways (Qwen2.5-Math's
``evaluate.py`` counts a timed-out grading as wrong, its ``convert_word_number`` swallows ``word2number``'s errors);
kvbench's scorers go through a :class:`ScoreGuard`: a scorer that raises on one prediction scores it 0 and the error
is recorded under the sample's id, so the dataset still gets its number.  The runner collects the errors of a
dataset's scoring (:func:`collect_scoring_errors`), writes each into its prediction row (``scoring_error``) and counts
them in ``metrics.json`` (``scoring_errors``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

#: The errors of the scoring in progress (sample id -> message), while :func:`collect_scoring_errors` is active.
_ACTIVE: ContextVar[dict[str, str] | None] = ContextVar("kvbench_scoring_errors", default=None)


def error_message(error: BaseException) -> str:
    """``"<ExceptionType>: <message>"``, as recorded."""
    return f"{type(error).__name__}: {error}"


class ScoreGuard:
    """Scores one prediction at a time; ``errors``: sample id -> message of each prediction whose scorer raised."""

    def __init__(self) -> None:
        self.errors: dict[str, str] = {}

    def __call__(self, key: str, scorer: Callable[..., Any], *args: Any, **kwargs: Any) -> float:
        """``float(scorer(*args, **kwargs))``; 0.0 when it raises (an ``Exception``), the error recorded under
        ``key`` (the sample's id) here and in the active collection."""
        try:
            return float(scorer(*args, **kwargs))
        except Exception as error:  # one bad prediction scores 0: the dataset still gets its number
            self.record(key, error)
            return 0.0

    def record(self, key: str, error: BaseException) -> None:
        """Record ``error`` for sample ``key`` (the first error of a sample is kept)."""
        message = error_message(error)
        self.errors.setdefault(key, message)
        active = _ACTIVE.get()
        if active is not None:
            active.setdefault(key, message)


@contextmanager
def collect_scoring_errors() -> Iterator[dict[str, str]]:
    """Collect, while the block runs, every error a :class:`ScoreGuard` records (sample id -> message)."""
    collected: dict[str, str] = {}
    token = _ACTIVE.set(collected)
    try:
        yield collected
    finally:
        _ACTIVE.reset(token)
