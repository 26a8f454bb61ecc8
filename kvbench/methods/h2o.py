"""H2O (Zhang et al., 2024): heavy hitters (accumulated attention) plus a recent window.

* Prefill: each token's score is the attention it receives from the observation window's queries, summed (no
  pooling by default); the window itself is kept (the "recent" part), the rest of the budget goes to the
  highest-scoring tokens.  Scores come from the window, never from a full ``S x S`` matrix.
* Decoding (``method.decode_eviction``): every new query's attention is added to the running scores; when a head
  exceeds its cap, the lowest-scoring token outside the most recent ``window`` tokens is evicted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kvbench.cache import HeadwiseLayer
from kvbench.methods.base import (
    DecodePolicy,
    EvictionMethod,
    common_knobs,
    decode_attention,
    evict_to_caps,
    parse_params,
    register_method,
)
from kvbench.methods.snapkv import WindowVoteScorer


class ScoredDecodePolicy(DecodePolicy):
    """Shared machinery of score-driven decode policies: per-head running scores aligned with the storage."""

    def __init__(self, recent_window: int) -> None:
        self.recent_window = recent_window
        self.caps: dict[int, list[int]] = {}
        self.scores: dict[int, list[torch.Tensor]] = {}

    def start_layer(
        self, layer_idx: int, layer: HeadwiseLayer, head_budgets: list[int], scores: list[torch.Tensor] | None = None
    ) -> None:
        self.caps[layer_idx] = list(head_budgets)
        lengths = layer.head_lengths()
        if scores is None:
            scores = [torch.zeros(length, device=layer.positions[0].device) for length in lengths]
        self.scores[layer_idx] = [s.float().clone() for s in scores]

    def _aligned_scores(self, layer_idx: int, layer: HeadwiseLayer) -> list[torch.Tensor]:
        """Running scores, extended with zeros for tokens appended since the last step (question, new token)."""
        scores = self.scores[layer_idx]
        for head, length in enumerate(layer.head_lengths()):
            missing = length - scores[head].shape[0]
            if missing > 0:
                scores[head] = torch.cat([scores[head], scores[head].new_zeros(missing)])
        return scores

    def update_scores(self, old: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """New running score of one head from its old scores and this step's attention ``[S_h]``."""
        raise NotImplementedError

    def step(self, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor, scaling: float) -> None:
        scores = self._aligned_scores(layer_idx, layer)
        attention = decode_attention(layer, query, scaling)
        scores = [self.update_scores(s, a) for s, a in zip(scores, attention, strict=True)]
        self.scores[layer_idx] = scores

        def top_scores_and_recent(head: int, length: int, cap: int) -> torch.Tensor:
            ranked = scores[head].clone()
            protected = min(self.recent_window, cap)
            if protected:
                ranked[length - protected :] = torch.inf
            return torch.topk(ranked, cap).indices

        keep = evict_to_caps(layer, self.caps[layer_idx], top_scores_and_recent)
        if keep is not None:
            self.scores[layer_idx] = [s.index_select(0, idx) for s, idx in zip(scores, keep, strict=True)]


class HeavyHitterDecode(ScoredDecodePolicy):
    """H2O decoding: accumulate attention, evict the lightest token outside the recent window."""

    def update_scores(self, old: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        return old + attention


@dataclass
class H2OParams:
    """H2O has no hyper-parameters beyond the common knobs (window = recent part)."""


@register_method("h2o")
def build_h2o(method_cfg: Any) -> EvictionMethod:
    """H2O: accumulated window attention + recent window; decode-time eviction when ``decode_eviction``."""
    parse_params(H2OParams, method_cfg.params, "h2o")
    knobs = common_knobs(method_cfg)
    policy = HeavyHitterDecode(knobs["window"]) if method_cfg.decode_eviction else None
    return EvictionMethod(
        scorer=WindowVoteScorer(int(method_cfg.kernel_size), str(method_cfg.pooling)), decode_policy=policy, **knobs
    )
