"""TOVA (Oren et al., 2024): keep the tokens the *current* query attends to most.

* Prefill: scores are the attention of the last prompt token's queries (averaged over the layer's heads when
  ``params.head_average``, as in the TOVA paper, so all heads of a layer keep the same tokens).
* Decoding (``method.decode_eviction``): at each step, when a head exceeds its cap, the token with the lowest
  attention from the newest query is evicted (no accumulation, no protected window besides the new token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kvbench.cache import HeadwiseLayer
from kvbench.methods.base import (
    EvictionMethod,
    TokenScorer,
    WindowObservation,
    common_knobs,
    decode_attention,
    evict_to_caps,
    parse_params,
    register_method,
)
from kvbench.methods.h2o import ScoredDecodePolicy


class LastQueryScorer(TokenScorer):
    """Attention of the last prompt token (optionally averaged over all heads of the layer)."""

    def __init__(self, head_average: bool) -> None:
        self.head_average = head_average

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """``[H_q, S]`` attention of the final query."""
        last = observation.last_query_attention()  # [H_q, S]
        if self.head_average:
            last = last.mean(dim=0, keepdim=True).expand_as(last)
        return last


class CurrentAttentionDecode(ScoredDecodePolicy):
    """TOVA decoding: the score is this step's attention only."""

    def __init__(self, head_average: bool) -> None:
        super().__init__(recent_window=1)
        self.head_average = head_average

    def update_scores(self, old: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        return attention

    def step(self, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor, scaling: float) -> None:
        if self.head_average and not layer.is_ragged:
            # All heads hold the same tokens: average the current attention over heads, evict the same token.
            self._aligned_scores(layer_idx, layer)
            attention = torch.stack(decode_attention(layer, query, scaling)).mean(dim=0)
            self.scores[layer_idx] = [attention.clone() for _ in range(layer.num_heads)]
            self._evict_to_caps(layer_idx, layer)
            return
        super().step(layer_idx, layer, query, scaling)

    def _evict_to_caps(self, layer_idx: int, layer: HeadwiseLayer) -> None:
        scores = self.scores[layer_idx]

        def most_attended(head: int, length: int, cap: int) -> torch.Tensor:
            ranked = scores[head].clone()
            ranked[length - 1] = torch.inf  # the token just generated stays
            return torch.topk(ranked, cap).indices

        keep = evict_to_caps(layer, self.caps[layer_idx], most_attended)
        if keep is not None:
            self.scores[layer_idx] = [s.index_select(0, idx) for s, idx in zip(scores, keep, strict=True)]


@dataclass
class TOVAParams:
    """TOVA's switch: average attention over the layer's heads (paper) or score each head on its own."""

    head_average: bool = True


@register_method("tova")
def build_tova(method_cfg: Any) -> EvictionMethod:
    """TOVA: last-token attention in prefill, current-attention eviction while decoding."""
    params = parse_params(TOVAParams, method_cfg.params, "tova")
    knobs = common_knobs(method_cfg)
    policy = CurrentAttentionDecode(params.head_average) if method_cfg.decode_eviction else None
    return EvictionMethod(scorer=LastQueryScorer(params.head_average), decode_policy=policy, **knobs)
