"""SIGTERM (SLURM preemption or time limit) as :class:`~kvbench.errors.Interrupted`, never in the middle of a
result write: :data:`TERMINATION` defers the signal while a write is in its :meth:`Termination.critical` section,
and :func:`graceful_termination` installs the handler for the duration of a run."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kvbench.errors import Interrupted


class Termination:
    """SIGTERM -> :class:`Interrupted`, deferred while a result file is being written (a critical section)."""

    def __init__(self) -> None:
        self.depth = 0
        self.pending: int | None = None
        self.fired = False

    def handler(self, signum: int, frame: Any) -> None:
        if self.fired:  # already stopping (e.g. SLURM signals both the batch shell and the runner): ignore
            return
        if self.depth > 0:
            self.pending = signum
            return
        self.fired = True
        raise Interrupted(f"received signal {signum}")

    @contextmanager
    def critical(self, raise_pending: bool = True) -> Iterator[None]:
        """Writes inside finish even if SIGTERM arrives meanwhile; the signal takes effect right after (unless
        ``raise_pending`` is false: the final bookkeeping write, after which the process exits anyway)."""
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
        if raise_pending and self.depth == 0 and self.pending is not None and not self.fired:
            signum, self.pending = self.pending, None
            self.fired = True
            raise Interrupted(f"received signal {signum}")


#: The active SIGTERM policy (a no-op critical section when no run is in progress).
TERMINATION = Termination()


@contextmanager
def graceful_termination() -> Iterator[None]:
    """Turn SIGTERM (SLURM preemption/time limit) into :class:`Interrupted`, never in the middle of a write."""
    previous = signal.signal(signal.SIGTERM, TERMINATION.handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        TERMINATION.pending = None
        TERMINATION.fired = False
