"""Methods that choose each head's kept tokens themselves (DuoAttention, HeadKV, SimLayerKV; issue #44).

Their scorer returns the kept set directly: ``[H, S]`` scores where every token a head drops is ``-inf``
(:data:`DROPPED`) and every token it keeps is finite.  :class:`KeepScoredTokens`, the head allocator, then gives
each head exactly as many tokens as it has finite scores, so the session keeps exactly the scorer's set on every head
-- ragged per-head lengths (a retrieval head whole, a streaming head its sinks and recent tokens; a head budget from
a score file) are stored as they are by kvbench's cache.  Sinks protected by ``method.params.sink_tokens`` (``+inf`` in
the session's padded scores) count as kept as well.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from kvbench import resources
from kvbench.errors import KVBenchError
from kvbench.eviction.base import HeadBudgetAllocator

#: The score of a token a head drops.
DROPPED = float("-inf")


class HeadFileMismatch(KVBenchError, ValueError):
    """A per-model head file (DuoAttention's pattern, HeadKV's scores) whose shape is not the model's: found at the
    first compressed layer, a clear error (exit 2 on the CLI) naming both shapes and how to make a fitting file."""


def keep_only(scores: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``[H, S]`` float32 ``scores`` where ``keep [H, S]`` (bool) holds, :data:`DROPPED` elsewhere."""
    return torch.where(keep, scores.float(), torch.full_like(scores, DROPPED, dtype=torch.float32))


class KeepScoredTokens(HeadBudgetAllocator):
    """Each head keeps its tokens whose score is not ``-inf`` (the scorer's own kept set); the budget is the
    scorer's business (it reads :attr:`~kvbench.eviction.base.WindowObservation.layer_budget`)."""

    def allocate(self, scores: torch.Tensor, budget_per_head: int) -> list[int]:
        """Per head, the number of entries of ``[H, S]`` scores above ``-inf`` (protected ``+inf`` included)."""
        return (scores > DROPPED).sum(dim=1).tolist()


def resolve_data_path(path: str, what: str, hint: str) -> Path:
    """The file or folder ``path`` names: as given (absolute, or relative to the working directory), else relative
    to kvbench's shipped files (``models/head_patterns/...``); a clear error naming ``what`` and ``hint`` otherwise."""
    given = Path(path).expanduser()
    for candidate in (given, resources.shipped_root() / given):
        if candidate.exists():
            return candidate
    raise ValueError(f"{what} {path!r} not found (neither as given nor under {resources.shipped_root()}); {hint}")


def files_digest(*files: Path) -> str:
    """SHA-256 (16 hex) of the files' bytes in order: recorded with a run, as the run's config names only the path."""
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.read_bytes())
    return digest.hexdigest()[:16]
