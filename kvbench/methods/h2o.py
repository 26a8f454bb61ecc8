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
* A multi-token forward after the prefill (question-agnostic mode's question), as ``H2OKVCache_LayerWise`` does
  with any forward: every new row's attention (causal) is added to the running scores -- the new tokens start
  from their column sums -- and each head is evicted to its cap at once.  ``params.evict_on_append: false`` is
  kvbench's earlier behaviour: the appended tokens are kept whole, score 0, and decoding evicts one per step.
* Rounding (``method.score_dtype=model``, the default): as the reference code in a bf16/fp16 model -- logits of
  ``matmul(q, k^T) / sqrt(d)`` rounded after the product and after the scaling, the float32 softmax cast back,
  the row sums and the running scores kept in the model dtype (each addition rounded).  ``float32``: kvbench's
  float32 scores throughout.
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
from kvbench.methods.scoring import ScoreOptions, aggregate_groups, appended_attention, round_to, window_votes

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
    """Shared machinery of score-driven decode policies: per-head running scores aligned with the storage.

    ``score_dtype`` (``model`` / ``float32``, :data:`kvbench.config.SCORE_DTYPES`): ``model`` rounds the step's
    logits, probabilities and every running score to the dtype of the queries (the model's), as the reference
    code keeps them; ``float32`` keeps float32 throughout.
    """

    def __init__(self, recent_window: int, gqa_agg: str = "mean", score_dtype: str = "model") -> None:
        self.recent_window = recent_window
        self.gqa_agg = gqa_agg
        self.score_dtype = score_dtype
        self.caps: dict[int, list[int]] = {}
        self.scores: dict[int, list[torch.Tensor]] = {}

    def rounding_dtype(self, query: torch.Tensor) -> torch.dtype | None:
        """The dtype scores are rounded to for queries ``query`` (``None``: float32)."""
        if self.score_dtype == "model" and query.dtype not in (torch.float32, torch.float64):
            return query.dtype
        return None

    def logit_factor(self, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor) -> float | None:
        """A factor on the decoding step's scaled logits (AhaKV's step-gain softmax); ``None`` = none."""
        return None

    def append_row_scale(self, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor) -> torch.Tensor | None:
        """``[q]`` factors on an append's scaled logits, one per appended row; ``None`` = none."""
        return None

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
        dtype = self.rounding_dtype(query)
        factor = self.logit_factor(layer_idx, layer, query)
        attention = decode_attention(layer, query, scaling, self.gqa_agg, dtype, factor)
        updated = [round_to(self.update_scores(s, a), dtype) for s, a in zip(scores, attention, strict=True)]
        self.scores[layer_idx] = updated
        self._evict_lowest(layer_idx, layer)

    def append(self, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor, scaling: float) -> None:
        """With :attr:`evicts_on_append`, FMInference H2O's handling of a multi-token forward: the appended rows'
        attention sums (:func:`~kvbench.methods.base.appended_attention`) go into the running scores, then every
        head is evicted to its cap at once; without, the appended tokens wait (score 0) for the next step."""
        if not self.evicts_on_append:
            return
        scores = self._aligned_scores(layer_idx, layer)
        dtype = self.rounding_dtype(query)
        row_scale = self.append_row_scale(layer_idx, layer, query)
        sums = appended_attention(layer, query, scaling, self.gqa_agg, dtype, row_scale)
        updated = [round_to(self.update_scores(s, a), dtype) for s, a in zip(scores, sums, strict=True)]
        self.scores[layer_idx] = updated
        self._evict_lowest(layer_idx, layer)

    def _evict_lowest(self, layer_idx: int, layer: HeadwiseLayer) -> None:
        """Evict every over-cap head to its cap: the top scores plus the ``recent_window`` newest tokens."""
        scores = self.scores[layer_idx]

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
    """H2O decoding: accumulate attention, evict the lightest token outside the recent window (after an append
    too, when ``evict_on_append``: module docstring)."""

    def __init__(
        self, recent_window: int, accumulate: bool = True, gqa_agg: str = "mean", score_dtype: str = "model",
        evict_on_append: bool = True,
    ) -> None:  # fmt: skip
        super().__init__(recent_window, gqa_agg, score_dtype)
        self.accumulate = accumulate
        self.evicts_on_append = evict_on_append

    def update_scores(self, old: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        return old + attention if self.accumulate else old


@dataclass
class H2OParams:
    """H2O's switches (module docstring); the window is the recent part."""

    #: ``all_rows`` (every prompt query votes, the reference) or ``window`` (only the observation window's rows).
    scores: str = choice("all_rows", SCORE_ROWS)
    #: Add each decoding step's attention to the running scores (the reference); false = prefill scores only.
    decode_accumulate: bool = True
    #: After a multi-token append, add its rows' attention and evict at once (the reference); false = kvbench's
    #: earlier behaviour (the appended tokens stay, scored 0, until decoding evicts one per step).
    evict_on_append: bool = True


@register_method("h2o")
def build_h2o(method_cfg: Any) -> EvictionMethod:
    """H2O: all-rows accumulated attention + recent window; decode-time eviction when ``decode_eviction``."""
    params = parse_params(H2OParams, method_cfg.params, "h2o")
    knobs = common_knobs(method_cfg)
    options = score_options(method_cfg)
    policy = None
    if method_cfg.decode_eviction:
        policy = HeavyHitterDecode(
            knobs["window"], params.decode_accumulate, knobs["gqa_agg"], options.score_dtype, params.evict_on_append
        )
    unpooled = frozenset({"pooling", "pool_padding", "gqa_reduce"}) if options.kernel_size <= 1 else frozenset()
    return EvictionMethod(
        scorer=AllRowsScorer(options, params.scores),
        decode_policy=policy,
        settings={
            "scores": params.scores,
            "decode_accumulate": params.decode_accumulate,
            "evict_on_append": params.evict_on_append,
        },
        ignored_knobs=unpooled,
        **knobs,
    )
