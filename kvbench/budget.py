"""KV budgets: parsing and the numbers a method needs for one sample.

Accepted ``budget.spec`` strings:

* ``full`` -- no eviction.
* ``<n>L`` (e.g. ``128L``) -- a *total* of ``n x num_layers`` tokens (per stored head), which the method's layer
  allocator may distribute unevenly (CAKE/PyramidKV convention); uniform allocators give ``n`` per layer.
* ``<n>/layer`` (e.g. ``128/layer``) -- every layer keeps exactly ``n`` tokens per head; layer allocators are
  bypassed (the "KV size n" of SnapKV-style tables).
* ``<r>x`` with ``0 < r <= 1`` (e.g. ``0.2x``) -- keep a ratio ``r`` of the context: a total of
  ``round(r x context_len) x num_layers``, distributed by the layer allocator.
* ``<c>cr`` with ``0 <= c < 1`` (e.g. ``0.25cr``) -- NVIDIA/kvpress's ``compression_ratio`` c: a total of
  ``max(1, int(context_len x (1 - c))) x num_layers`` (kvpress's ``compute_n_kept``: floor, never 0), distributed by
  the layer allocator (uniform: that many per layer).  A press that computes a count from c itself gets kvpress's
  arithmetic (:meth:`Budget.kvpress_ratio`: ChunkKV's chunk count, CriticalKV's first stage, Compactor's blending;
  :meth:`Budget.kvpress_global_kept`: KVzip's ``L H S - int(L H S c)``).  kvpress protects no window: use it with
  methods that do not (the one-class methods, the ``*_kvpress`` presets), and ``task.question_mode=agnostic`` so
  that only the context is compressed, as kvpress's pipeline.
* ``<t>thr`` (e.g. ``-3.0thr``, ``0.01thr``) -- a *threshold*, not a size (kvpress's ``DMSPress``, issue #58): every
  token whose score is below ``t`` is evicted, so the kept count varies by head, layer and sample and memory is an
  outcome, reported per run (kept fraction, stored bytes).  Only threshold methods (``method=dms``) take it, and they
  take nothing else; ``t`` is on the scale of the method's scorer (KNorm: minus a key norm).

All budgets count tokens per stored head and, by default, include the observation window
(``method.params.window_in_budget``).  When a layer's budget is at least the context length nothing is evicted there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

BudgetKind = Literal["full", "total_per_layer", "fixed_per_layer", "ratio", "compression", "threshold"]

ACCEPTED_FORMS = (
    "'full', '<n>L' (e.g. 128L), '<n>/layer' (e.g. 128/layer), '<r>x' with 0<r<=1 (e.g. 0.2x), "
    "'<c>cr' (kvpress's compression ratio) with 0<=c<1 (e.g. 0.25cr), "
    "'<t>thr' (a score threshold, threshold methods only: e.g. -3.0thr)"
)

_TOTAL = re.compile(r"^(\d+)L$")
_FIXED = re.compile(r"^(\d+)/layer$")
_RATIO = re.compile(r"^(\d*\.?\d+)x$")
_COMPRESSION = re.compile(r"^(\d*\.?\d+)cr$")
_THRESHOLD = re.compile(r"^([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)thr$")


class BudgetError(ValueError):
    """A budget string that does not parse."""


@dataclass(frozen=True)
class Budget:
    """A parsed budget (see module docstring)."""

    spec: str
    kind: BudgetKind
    #: Tokens per layer (``<n>L``, ``<n>/layer``), the kept ratio (``<r>x``) or kvpress's compression ratio
    #: (``<c>cr``), the score threshold (``<t>thr``); 0 for ``full``.
    value: float

    @property
    def is_full(self) -> bool:
        return self.kind == "full"

    @property
    def fixed_per_layer(self) -> bool:
        """Whether every layer must keep the same number (layer allocators bypassed)."""
        return self.kind == "fixed_per_layer"

    @property
    def is_threshold(self) -> bool:
        """Whether the budget is a score threshold (``<t>thr``): the kept count is an outcome, not a setting."""
        return self.kind == "threshold"

    def total(self, context_length: int, num_layers: int) -> int:
        """Total tokens per stored head over all layers for a context of ``context_length`` tokens (a threshold
        bounds nothing: every token, as ``full``)."""
        if self.kind in ("full", "threshold"):
            return context_length * num_layers
        if self.kind in ("ratio", "compression"):
            return self.mean_per_layer(context_length) * num_layers
        return int(self.value) * num_layers

    def mean_per_layer(self, context_length: int) -> int:
        """Average tokens per layer (per head); a threshold's upper bound (every token) for ``<t>thr``."""
        if self.kind in ("full", "threshold"):
            return context_length
        if self.kind == "ratio":
            return max(1, round(self.value * context_length))
        if self.kind == "compression":
            return max(1, int(context_length * (1 - self.value)))
        return int(self.value)

    def unrounded_mean_per_layer(self, context_length: int) -> float:
        """The mean per layer before rounding: ``S (1 - c)`` for ``<c>cr`` as kvpress computes it
        (``q_len * (1 - compression_ratio)``, which its ``PyramidKVPress`` reads before any floor), else
        :meth:`mean_per_layer` (a ``<r>x`` budget is defined by its rounded mean)."""
        if self.kind == "compression":
            return context_length * (1 - self.value)
        return float(self.mean_per_layer(context_length))

    def kvpress_ratio(self, context_length: int, layer_budget: int) -> float | None:
        """kvpress's ``compression_ratio`` c for a layer keeping ``layer_budget`` tokens of ``context_length``: the
        budget's c when it is ``<c>cr`` and the layer keeps its uniform share ``max(1, int(S (1 - c)))`` (a press
        that computes a count from c itself then computes it as kvpress does); ``None`` otherwise."""
        if self.kind != "compression" or layer_budget != self.mean_per_layer(context_length):
            return None
        return self.value

    def kvpress_global_kept(self, tokens: int, ratio: float | None = None) -> int | None:
        """Of ``tokens`` scored together (KVzip's ``L H S`` over every layer and head, or ``H S`` per layer), how many
        kvpress keeps under ``<c>cr``: ``tokens - int(tokens c)`` (its ``KVzipPress`` evicts ``int(numel c)``, no
        per-head floor); ``None`` for any other budget.  ``ratio``: the ratio kvpress applies instead of ``c``
        (RestoreKV raises it to ``min(1, c + n / S)``)."""
        if self.kind != "compression":
            return None
        return tokens - int(tokens * (self.value if ratio is None else ratio))

    @property
    def follows_context(self) -> bool:
        """Whether the budget is a share of each sample's context (``<r>x``, ``<c>cr``)."""
        return self.kind in ("ratio", "compression")


def parse_budget(spec: str) -> Budget:
    """Parse a budget string; raises :class:`BudgetError` naming the bad string and the accepted forms."""
    text = str(spec).strip()
    if text == "full":
        return Budget(text, "full", 0)
    if match := _TOTAL.match(text):
        return _positive(Budget(text, "total_per_layer", int(match.group(1))))
    if match := _FIXED.match(text):
        return _positive(Budget(text, "fixed_per_layer", int(match.group(1))))
    if match := _RATIO.match(text):
        ratio = float(match.group(1))
        if not 0 < ratio <= 1:
            raise BudgetError(f"budget {spec!r}: ratio must be in (0, 1]; accepted forms: {ACCEPTED_FORMS}")
        return Budget(text, "ratio", ratio)
    if match := _COMPRESSION.match(text):
        compression = float(match.group(1))
        if not 0 <= compression < 1:
            raise BudgetError(f"budget {spec!r}: compression ratio must be in [0, 1); accepted forms: {ACCEPTED_FORMS}")
        return Budget(text, "compression", compression)
    if match := _THRESHOLD.match(text):
        return Budget(text, "threshold", float(match.group(1)))
    raise BudgetError(f"invalid budget {spec!r}; accepted forms: {ACCEPTED_FORMS}")


def _positive(budget: Budget) -> Budget:
    if budget.value <= 0:
        raise BudgetError(f"budget {budget.spec!r} must be positive; accepted forms: {ACCEPTED_FORMS}")
    return budget


def budget_label(spec: str) -> str:
    """The folder-safe name of a budget string, as the presets name theirs: ``full``, ``64L``, ``128/layer`` ->
    ``128perlayer``, ``0.2x`` -> ``ratio0.2``, ``0.25cr`` -> ``cr0.25``, ``-3.0thr`` -> ``thr-3.0``."""
    text = str(spec).strip()
    if match := _THRESHOLD.match(text):
        return f"thr{match.group(1)}"
    if match := _COMPRESSION.match(text):
        return f"cr{match.group(1)}"
    if match := _FIXED.match(text):
        return f"{match.group(1)}perlayer"
    if match := _RATIO.match(text):
        return f"ratio{match.group(1)}"
    return text
