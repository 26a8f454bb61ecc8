"""TOVA (Oren et al., 2024): keep the tokens the *current* query attends to most.

Reproduces schwartz-lab-NLP/TOVA ``src/tova_cache.py`` (``TOVACache.reduce``, called after every attention forward
by ``src/convert_models/{llama,mistral}_custom.py``):

* After **every** forward -- the prefill, a multi-token append (question-agnostic mode's question) and each
  decoding step -- a layer holding more than ``cache_size`` (the budget) tokens keeps the top ``cache_size`` by the
  attention of the forward's **last** query, averaged over all query heads (``params.head_average``), so every
  head keeps the same tokens.  No token is protected: the newest one is kept only if it ranks.
* ``params.protect_recent`` is kvbench's earlier variant: the last prompt token at prefill and the newest token
  while decoding always stay.
* Rounding (``method.params.score_dtype=model``, the default): as the reference in a bf16/fp16 model -- the logits of
  ``matmul(q, k^T) / sqrt(d)`` rounded after the product and after the scaling, the float32 softmax cast back,
  the mean over the query heads rounded; ``float32`` keeps float32 throughout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from kvbench.eviction.base import (
    DecodePolicy,
    DecodeState,
    EvictionMethod,
    TokenScorer,
    WindowObservation,
    common_knobs,
)
from kvbench.eviction.decoding import padded_decode_attention, samples_and_heads
from kvbench.eviction.family import FamilyMethod
from kvbench.eviction.token_scores import ScoreDtypeKnob, no_rounding, round_to, rounding_to
from kvbench.methods.h2o import ScoredDecodePolicy

if TYPE_CHECKING:  # type hints only: importing the cache would import transformers
    from kvbench.cache.kv_cache import HeadwiseLayer


class LastQueryScorer(TokenScorer):
    """Attention of the last prompt token (optionally averaged over all heads of the layer).

    ``score_dtype="model"`` rounds the probabilities and their mean to the model dtype, as the reference.
    """

    def __init__(self, head_average: bool, score_dtype: str = "model") -> None:
        self.head_average = head_average
        self.score_dtype = score_dtype

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """``[H_q, S]`` attention of the final query."""
        model = self.score_dtype == "model"
        rnd = rounding_to(observation.model_dtype) if model else no_rounding
        last = rnd(observation.last_query_attention(observation.model_dtype if model else None))  # [H_q, S]
        if self.head_average:
            last = rnd(last.mean(dim=0, keepdim=True)).expand_as(last)
        return last


class CurrentAttentionDecode(ScoredDecodePolicy):
    """TOVA decoding: the score is this step's attention only; reduces after appends too (the reference)."""

    evicts_on_append = True
    #: Rows step independently, the head average per sample: a decode batch's pool steps in one call.
    steps_sample_rows = True

    def __init__(self, head_average: bool, protect_recent: bool = False, score_dtype: str = "model") -> None:
        super().__init__(recent_window=1 if protect_recent else 0, score_dtype=score_dtype)
        self.head_average = head_average

    def update_scores(self, old: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        return attention

    def step(
        self, state: DecodeState, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor, scaling: float
    ) -> None:
        if self.head_average and not getattr(layer, "any_sample_ragged", layer.is_ragged):
            # All heads of a sample hold the same tokens in the same slots: the reference's mean of the current
            # attention over the sample's query heads, so its heads evict the same slot (a decode batch's pool: per
            # sample, in one reduction).
            dtype = self.rounding_dtype(query)
            per_query_head, stored = padded_decode_attention(layer, query, scaling, None, dtype)  # [B*H_q, S]
            samples, heads = samples_and_heads(layer)
            width = per_query_head.shape[-1]
            mean = round_to(per_query_head.view(samples, -1, width).mean(dim=1, keepdim=True), dtype)  # [B, 1, S]
            attention = mean.expand(samples, heads, width).reshape(samples * heads, width)
            self._score_and_evict(state, layer_idx, layer, attention, stored, dtype)
            return
        super().step(state, layer_idx, layer, query, scaling)

    def append(
        self, state: DecodeState, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor, scaling: float
    ) -> None:
        """The reference reduces after every forward with its last query: one :meth:`step` with it."""
        DecodePolicy.append(self, state, layer_idx, layer, query, scaling)


@dataclass(frozen=True)
class TOVA(ScoreDtypeKnob, FamilyMethod, family="tova"):
    """TOVA's switches (see module docstring)."""

    #: Average the last query's attention over the layer's heads (the reference) or score each head on its own.
    head_average: bool = True
    #: kvbench's variant: keep the last prompt token and the newest decoded token whatever their attention.
    protect_recent: bool = False

    def build(self, method_cfg: Any) -> EvictionMethod:
        """TOVA: last-token attention in prefill, current-attention eviction after every later forward."""
        knobs = common_knobs(method_cfg, self)
        policy = None
        if self.decode_eviction:
            policy = CurrentAttentionDecode(self.head_average, self.protect_recent, self.score_dtype)
        return EvictionMethod(
            scorer=LastQueryScorer(self.head_average, self.score_dtype),
            decode_policy=policy,
            settings={"head_average": self.head_average, "protect_recent": self.protect_recent},
            ignored_knobs=frozenset({"gqa_agg"}) if self.head_average else frozenset(),
            **{**knobs, "keep_window": self.protect_recent},  # the reference protects nothing
        )
