"""H2O (Zhang et al., 2024): heavy hitters (accumulated attention) plus a recent window.

Reproduces FMInference/H2O ``h2o_hf/utils_real_drop/modify_llama.py`` (``H2OKVCache_LayerWise``, recent size =
``window``, heavy-hitter size = budget - window) and, at prefill, Zefan-Cai/KVCache-Factory
``pyramidkv/pyramidkv_utils.py`` ``H2OKVCluster``:

* Prefill: each token's score is the attention it receives from **every** prompt query (column sums of the whole
  causal attention by :func:`kvbench.kernels.causal_column_sums`, never an ``S x S`` matrix; the session
  accumulates them chunk by chunk when the prefill is chunked), no pooling; each head keeps its top ``C - W`` candidates
  ``[0, S - W)`` plus the last ``W`` tokens; nothing is evicted when ``S < C``.  GQA as SnapKV (query-head
  granularity by default; with ``kv_head`` the group is reduced).
  ``params.scores: window`` is kvbench's cheaper variant that sums only the observation window's rows.
* Decoding (``method.decode_eviction``): every new query's attention is added to the running scores
  (``params.decode_accumulate``; off = the prefill scores stay fixed and new tokens score 0); when a head exceeds
  its cap, the lowest-scoring token outside the most recent ``window`` tokens is evicted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from kvbench.checks import check_choice
from kvbench.methods.base import (
    DecodePolicy,
    EvictionMethod,
    PromptRows,
    TokenScorer,
    WindowObservation,
    common_knobs,
    decode_attention,
    evict_to_caps,
    register_method,
    score_options,
)
from kvbench.methods.params import choice, parse_params
from kvbench.methods.scoring import ScoreOptions, aggregate_groups, window_votes

if TYPE_CHECKING:  # type hints only: importing the cache would import transformers
    from kvbench.cache import HeadwiseLayer

SCORE_ROWS = ("all_rows", "window")


class AllRowsScorer(TokenScorer):
    """H2O's prefill indicator: column sums of the causal attention over all prompt rows (or the window's rows).

    Returns ``[H, S]``: candidates reduced/pooled as :class:`~kvbench.methods.scoring.ScoreOptions` say (H2O: no
    pooling), the window columns their plain (group-reduced) sums -- the running scores decoding continues from.
    """

    def __init__(self, options: ScoreOptions, rows: str = "all_rows") -> None:
        check_choice("method.params.scores", rows, SCORE_ROWS)
        self.options = options
        self.rows = rows

    def prompt_rows(self, model_dtype: torch.dtype) -> PromptRows:
        """All-rows scores: the session accumulates the column sums (rounded as the options say) over the prefill."""
        if self.rows == "window":
            return PromptRows()
        return PromptRows(column_sums=True, prob_dtype=self.options.probability_dtype(model_dtype))

    def score(self, observation: WindowObservation) -> torch.Tensor:
        dtype = observation.model_dtype
        rnd = self.options.rounding(dtype)
        context = observation.context_length
        prob_dtype = self.options.probability_dtype(dtype)
        if self.rows == "window":
            sums = window_votes(observation.window_stats(prob_dtype), "sum", rnd)
        else:
            sums = rnd(observation.column_sums(prob_dtype))
        scores = rnd(aggregate_groups(sums, observation.num_heads, self.options.gqa_agg))
        past = context - observation.window
        scores[:, :past] = self.options.to_stored_heads(sums[:, :past], observation.num_heads, dtype)
        return scores


class ScoredDecodePolicy(DecodePolicy):
    """Shared machinery of score-driven decode policies: per-head running scores aligned with the storage."""

    def __init__(self, recent_window: int, gqa_agg: str = "mean") -> None:
        self.recent_window = recent_window
        self.gqa_agg = gqa_agg
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
        attention = decode_attention(layer, query, scaling, self.gqa_agg)
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

    def __init__(self, recent_window: int, accumulate: bool = True, gqa_agg: str = "mean") -> None:
        super().__init__(recent_window, gqa_agg)
        self.accumulate = accumulate

    def update_scores(self, old: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        return old + attention if self.accumulate else old


@dataclass
class H2OParams:
    """H2O's switches (module docstring); the window is the recent part."""

    #: ``all_rows`` (every prompt query votes, the reference) or ``window`` (only the observation window's rows).
    scores: str = choice("all_rows", SCORE_ROWS)
    #: Add each decoding step's attention to the running scores (the reference); false = prefill scores only.
    decode_accumulate: bool = True


@register_method("h2o")
def build_h2o(method_cfg: Any) -> EvictionMethod:
    """H2O: all-rows accumulated attention + recent window; decode-time eviction when ``decode_eviction``."""
    params = parse_params(H2OParams, method_cfg.params, "h2o")
    knobs = common_knobs(method_cfg)
    options = score_options(method_cfg)
    policy = None
    if method_cfg.decode_eviction:
        policy = HeavyHitterDecode(knobs["window"], params.decode_accumulate, knobs["gqa_agg"])
    unpooled = frozenset({"pooling", "pool_padding", "gqa_reduce"}) if options.kernel_size <= 1 else frozenset()
    return EvictionMethod(
        scorer=AllRowsScorer(options, params.scores),
        decode_policy=policy,
        settings={"scores": params.scores, "decode_accumulate": params.decode_accumulate},
        ignored_knobs=unpooled,
        **knobs,
    )
