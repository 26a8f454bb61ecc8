"""Compactor (Chari & Van Durme, 2025): leverage scores of the pre-RoPE keys blended with chunked non-causal
attention, first and last tokens protected.

Reproduces NVIDIA/kvpress ``kvpress/presses/compactor_press.py`` (``CompactorPress``, kvpress 0.5.5): on the tokens
between the first ``sink_size_start`` and the last ``sink_size_end`` (both capped by the context), the score is
``blending * leverage + non_causal`` -- :mod:`kvbench.methods.leverage` (sketch ``sketch_dimension``, global
generator) and :mod:`kvbench.methods.noncausal` (chunks of ``chunk_size`` starting at the first scored token), each
z-scored over that span -- and the protected tokens get the span's maximum.

``blending``: kvpress's default ``None`` means *the press's compression ratio*: ``null`` takes c under ``budget=<c>cr``
(kvpress's own), else ``1 - layer budget / S`` (the ratio the budget keeps, kvpress's wherever ``S (1 - c)`` is a
whole number); without a known layer budget (an allocator that sets it after scoring) it is 0.35, kvpress's
fallback.  kvpress's ``compression_ratio`` c is ``budget=<c>cr`` (or ``<max(1, int(S (1 - c)))>/layer``).  Reads
every prompt query and the pre-RoPE keys of the span (``k_proj`` of its hidden states, as kvpress:
:mod:`kvbench.eviction.prerope`).  Parity: ``tests/methods/test_compactor.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from kvbench.eviction.base import PromptRows, WindowObservation
from kvbench.eviction.params import bounded
from kvbench.eviction.prerope import prerope_states
from kvbench.eviction.recipe import ScorerMethod
from kvbench.methods.leverage import leverage_scores
from kvbench.methods.noncausal import pooled_attention_scores, zscore_all_heads

#: kvpress's blending when neither ``blending`` nor a compression ratio is known.
FALLBACK_BLENDING = 0.35


@dataclass(frozen=True)
class Compactor(ScorerMethod, family="compactor", reference="NVIDIA/kvpress kvpress/presses/compactor_press.py@0.5.5"):
    """Blended leverage and non-causal attention (module docstring)."""

    #: First tokens protected (scored the maximum).
    sink_size_start: int = bounded(8, 0)
    #: Last tokens protected.
    sink_size_end: int = bounded(4, 0)
    #: Tokens per non-causal attention chunk.
    chunk_size: int = bounded(256, 1)
    #: Columns of the leverage sketch.
    sketch_dimension: int = bounded(48, 1)
    #: Weight of the leverage scores; ``null``: the compression ratio the layer budget keeps (module docstring).
    blending: float | None = bounded(None, 0.0)

    def prompt_rows(self, model_dtype: torch.dtype) -> PromptRows:
        """Every prompt query and the pre-RoPE keys."""
        return PromptRows(queries=True, prerope_keys=True)

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """``[H_kv, S]`` float32 scores."""
        queries, keys, values = observation.prompt_queries, observation.keys, observation.values
        length = keys.shape[1]
        if queries is None or queries.shape[1] != length:
            raise ValueError("compactor needs every prompt query (TokenScorer.prompt_rows)")
        left = min(self.sink_size_start, length)
        right = min(self.sink_size_end, max(0, length - left))
        last = length - right
        prerope_keys = prerope_states(observation).keys(left, last)  # [H, last - left, D]
        leverage = zscore_all_heads(leverage_scores(prerope_keys, self.sketch_dimension))
        attention = pooled_attention_scores(
            queries[:, left:last], keys[:, left:last], values[:, left:last], self.chunk_size
        )
        attention = zscore_all_heads(attention)
        scores = self.blending_weight(observation) * leverage + attention
        return F.pad(scores, (left, right), value=float(scores.max()))

    def blending_weight(self, observation: WindowObservation) -> float:
        """``blending``, or kvpress's compression ratio (``<c>cr``: c), or the compression ratio of the layer
        budget, or kvpress's fallback 0.35."""
        if self.blending is not None:
            return self.blending
        if observation.compression_ratio is not None:
            return observation.compression_ratio
        if observation.layer_budget is None:
            return FALLBACK_BLENDING
        return max(0.0, 1.0 - observation.layer_budget / observation.context_length)
