"""Observed attention (kvpress's H2O-style press): the attention each key received during the prefill, averaged over
the queries that could see it.

Reproduces NVIDIA/kvpress ``kvpress/presses/observed_attention_press.py`` (``ObservedAttentionPress``, kvpress 0.5.5),
which reads the eager attention weights of the prefill:

1. per query head, the column sums of the causal softmax attention over every prompt row (H2O's all-rows score;
   kvbench's :func:`kvbench.kernels.causal_column_sums`, never an ``S x S`` matrix);
2. divided by the number of prompt queries that see the key (``S - j`` for key ``j``);
3. averaged over the KV head's GQA group.

No token is protected (no window, no sinks: ``keep_window`` off), prefill only.  Rounding as the reference in a
bf16/fp16 model: the logits and the float32 softmax cast to the model dtype (eager attention), the column sums, the
counts ``S - j`` (``arange(S, 0, -1)`` cast to the model dtype: above 256 tokens bf16 rounds them), the quotient and the
group mean each rounded to the model dtype.  kvpress's ``compression_ratio`` c is the budget
``<max(1, int(S (1 - c)))>/layer`` (``<c>cr``).  Memory: a budget of n keeps n tokens per KV head and layer.
Differences from FMInference H2O (``method=h2o``): no recent window, the per-key normalisation, no decode-time
eviction.  Parity: ``tests/methods/test_observed_attention.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvbench.eviction.base import PromptRows, WindowObservation
from kvbench.eviction.recipe import ScorerMethod


def rounding_dtype(model_dtype: torch.dtype) -> torch.dtype | None:
    """The dtype the reference rounds its attention and scores to (``None``: a float32/float64 model, no rounding)."""
    return None if model_dtype in (torch.float32, torch.float64) else model_dtype


@dataclass(frozen=True)
class ObservedAttention(
    ScorerMethod,
    family="observed_attention",
    reference="NVIDIA/kvpress kvpress/presses/observed_attention_press.py@0.5.5",
):
    """Column sums of the prefill attention over the visible queries, group mean (module docstring)."""

    def prompt_rows(self, model_dtype: torch.dtype) -> PromptRows:
        """The column sums of every prompt row, logits and probabilities rounded as eager attention does."""
        return PromptRows(column_sums=True, prob_dtype=rounding_dtype(model_dtype))

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """``[H_kv, S]`` scores, in the model dtype."""
        dtype = rounding_dtype(observation.model_dtype) or torch.float32
        sums = observation.column_sums(rounding_dtype(observation.model_dtype)).to(dtype)  # [H_q, S]
        length = sums.shape[-1]
        visible = torch.arange(length, 0, -1, device=sums.device).to(dtype)
        per_query_head = sums / visible
        heads = observation.keys.shape[0]
        return per_query_head.view(heads, -1, length).mean(dim=1)
