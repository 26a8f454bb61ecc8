"""Settings whose predictions changed after runs of them were stored (issue #54): their config hash changes.

A config hash names a results folder and a resumed run reuses the folder's rows (docs/results.md).  When a fix
changes what a setting keeps while its config stays the same (kvpress's arithmetic under ``<c>cr``, for instance),
the folders written before the fix must not be reused: :func:`prediction_revisions` names the fixes a resolved config
falls under, :func:`kvbench.storage.writers.canonical_config` adds them to the hashed form (``revisions``), and a
folder of the same name written before the fix then holds another hash and is refused, its differences naming the
revision.  A setting a fix cannot change gets no revision and keeps its hash.

Each revision is a line ``<issue>: <what changed>`` and a predicate on the resolved config (a plain dict); add new
fixes at the end, never edit an old line (its text is hashed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvbench.budget import BudgetError, parse_budget


def _params(config: dict[str, Any]) -> dict[str, Any]:
    method = config.get("method") or {}
    return dict(method.get("params") or {}) if isinstance(method, dict) else {}


def _family(config: dict[str, Any]) -> str:
    method = config.get("method") or {}
    return str(method.get("family", "")) if isinstance(method, dict) else ""


def _compression_budget(config: dict[str, Any]) -> bool:
    """Whether the budget is kvpress's ``<c>cr``."""
    budget = config.get("budget") or {}
    spec = budget.get("spec") if isinstance(budget, dict) else None
    try:
        return spec is not None and parse_budget(str(spec)).kind == "compression"
    except BudgetError:
        return False


def _counts_from_kvpress_ratio(config: dict[str, Any]) -> bool:
    """A ``<c>cr`` run of a press whose count (or blending) issue #54 made kvpress's own function of c."""
    if not _compression_budget(config):
        return False
    params = _params(config)
    family = _family(config)
    return (
        family == "kvzip"
        or (family == "compactor" and params.get("blending") is None)
        or params.get("selection") in ("chunkkv", "chunk")
        or (params.get("rescale") == "critical" and params.get("allocation") != "ada_kvpress")
    )


def _decoding_press(config: dict[str, Any]) -> bool:
    """kvpress's decoding presses (``decode_interval``): issue #54 made their compressions kvpress's (cache order,
    buffered queries, the window kept, the bisected count)."""
    return bool(_params(config).get("decode_interval"))


def _block_over_window_scorer(config: dict[str, Any]) -> bool:
    """``BlockPress`` / ``ChunkPress`` over SnapKV's window vote: issue #54 scores each block or chunk with its
    tokens' own queries and pads its window (kvpress's), instead of the prompt's window kept on top."""
    return _family(config) == "snapkv" and _params(config).get("selection") in ("block", "chunk")


#: ``(revision line, applies to the resolved config)``, oldest first.
REVISIONS: tuple[tuple[str, Callable[[dict[str, Any]], bool]], ...] = (
    (
        "54: <c>cr counts as kvpress computes them from c (KVzip's global int(L H S c), ChunkKV's and ChunkPress's "
        "chunk counts, CriticalKV's first stage, Compactor's blending)",
        _counts_from_kvpress_ratio,
    ),
    ("54: decoding presses compress as kvpress's (cache order, buffered queries, window kept)", _decoding_press),
    ("54: BlockPress and ChunkPress over SnapKV score with their tokens' own queries", _block_over_window_scorer),
)


def prediction_revisions(config: dict[str, Any]) -> list[str]:
    """The :data:`REVISIONS` lines that apply to the resolved ``config`` (empty for most settings)."""
    return [line for line, applies in REVISIONS if applies(config)]
