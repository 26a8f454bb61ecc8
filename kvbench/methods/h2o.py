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
* Decoding (``method.params.decode_eviction``): every new query's attention is added to the running scores
  (``params.decode_accumulate``; off = the prefill scores stay fixed and new tokens score 0); when a head exceeds
  its cap, the lowest-scoring token outside the most recent ``window`` tokens is evicted.
* A multi-token forward after the prefill (question-agnostic mode's question), as ``H2OKVCache_LayerWise`` does
  with any forward: every new row's attention (causal) is added to the running scores -- the new tokens start
  from their column sums -- and each head is evicted to its cap at once.  ``params.evict_on_append: false`` is
  kvbench's earlier behaviour: the appended tokens are kept whole, score 0, until the first decoding step cuts
  each head back to its cap.
* Rounding (``method.params.score_dtype=model``, the default): as the reference code in a bf16/fp16 model -- logits of
  ``matmul(q, k^T) / sqrt(d)`` rounded after the product and after the scaling, the float32 softmax cast back,
  the row sums and the running scores kept in the model dtype (each addition rounded).  ``float32``: kvbench's
  float32 scores throughout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from kvbench.checks import check_choice
from kvbench.eviction.base import (
    DecodePolicy,
    DecodeState,
    EvictionMethod,
    PromptRows,
    TokenScorer,
    WindowObservation,
    common_knobs,
    score_options,
)
from kvbench.eviction.decoding import (
    evict_lowest,
    evict_to_caps,
    one_token_evictions,
    padded_decode_attention,
    seen_by_head,
)
from kvbench.eviction.family import FamilyMethod
from kvbench.eviction.params import choice
from kvbench.eviction.token_scores import (
    ScoreOptions,
    VoteKnobs,
    aggregate_groups,
    appended_attention,
    round_to,
    window_votes,
)

if TYPE_CHECKING:  # type hints only: importing the cache would import transformers
    from kvbench.cache.kv_cache import HeadwiseLayer

SCORE_ROWS = ("all_rows", "window")


class AllRowsScorer(TokenScorer):
    """H2O's prefill indicator: column sums of the causal attention over all prompt rows (or the window's rows).

    Returns ``[H, S]``: candidates reduced/pooled as :class:`~kvbench.eviction.token_scores.ScoreOptions` say (H2O: no
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
    """Shared machinery of score-driven decode policies: per-head running scores aligned with the storage slots.

    The scores of a layer are one ``[H, C]`` float32 tensor (``C`` >= the longest head; slot ``s`` of head ``h`` at
    ``[h, s]``), so a step is a handful of vectorised operations over heads: score, then evict the lowest slot of
    each over-cap head in place (:func:`~kvbench.eviction.base.evict_lowest`) and move the scores the same way.

    ``score_dtype`` (``model`` / ``float32``, :data:`kvbench.config.SCORE_DTYPES`): ``model`` rounds the step's
    logits, probabilities and every running score to the dtype of the queries (the model's), as the reference
    code keeps them; ``float32`` keeps float32 throughout.
    """

    def __init__(self, recent_window: int, gqa_agg: str = "mean", score_dtype: str = "model") -> None:
        self.recent_window = recent_window
        self.gqa_agg = gqa_agg
        self.score_dtype = score_dtype

    def rounding_dtype(self, query: torch.Tensor) -> torch.dtype | None:
        """The dtype scores are rounded to for queries ``query`` (``None``: float32)."""
        if self.score_dtype == "model" and query.dtype not in (torch.float32, torch.float64):
            return query.dtype
        return None

    def logit_factor(
        self, state: DecodeState, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor
    ) -> float | None:
        """A factor on the decoding step's scaled logits (AhaKV's step-gain softmax); ``None`` = none."""
        return None

    def append_row_scale(
        self, state: DecodeState, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor
    ) -> torch.Tensor | None:
        """``[q]`` factors on an append's scaled logits, one per appended row; ``None`` = none."""
        return None

    def start_layer(
        self,
        state: DecodeState,
        layer_idx: int,
        layer: HeadwiseLayer,
        head_budgets: list[int],
        scores: list[torch.Tensor] | None = None,
    ) -> None:
        super().start_layer(state, layer_idx, layer, head_budgets, scores)
        lengths = layer.head_lengths()
        device = layer.positions[0].device
        padded = torch.zeros((len(lengths), max(lengths, default=0)), dtype=torch.float32, device=device)
        if scores is not None:
            for head, score in enumerate(scores):
                padded[head, : score.shape[0]] = score.float()
        state.scores[layer_idx] = padded
        state.scored[layer_idx] = torch.tensor(lengths, device=device)

    @staticmethod
    def head_scores(state: DecodeState, layer_idx: int) -> list[torch.Tensor]:
        """The running scores of a layer's stored tokens, per head ``[S_h]`` by slot (for inspection)."""
        scores = state.scores[layer_idx]
        return [scores[head, :length] for head, length in enumerate(state.scored[layer_idx].tolist())]

    @staticmethod
    def _aligned_scores(state: DecodeState, layer_idx: int, layer: HeadwiseLayer) -> torch.Tensor:
        """``[H, S_max]`` view of the running scores, zero for tokens appended since the last step (the buffer
        grows by 1/8 when a head outgrows it, so this is amortised O(H) per step)."""
        scores = state.scores[layer_idx]
        width = max(layer.head_lengths(), default=0)
        if width > scores.shape[1]:
            grown = scores.new_zeros((scores.shape[0], max(width, scores.shape[1] + scores.shape[1] // 8 + 1)))
            grown[:, : scores.shape[1]] = scores
            state.scores[layer_idx] = scores = grown
        view = scores[:, :width]
        fresh = torch.arange(width, device=scores.device) >= state.scored[layer_idx][:, None]
        view.masked_fill_(fresh, 0.0)
        return view

    def update_scores(self, old: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """New running scores ``[H, S_max]`` from the old ones and this step's attention ``[H, S_max]``."""
        raise NotImplementedError

    def protected(self, layer: HeadwiseLayer, positions: torch.Tensor, caps: list[int]) -> torch.Tensor | None:
        """``[H, S_max]`` mask of slots no eviction may take: each head's ``min(recent_window, cap)`` newest tokens
        (by position: the most recent tokens are always stored, decoding never evicts them)."""
        if not self.recent_window:
            return None
        recent = torch.tensor([min(self.recent_window, cap) for cap in caps], device=positions.device)
        return positions >= seen_by_head(layer) - recent[:, None]

    def step(
        self, state: DecodeState, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor, scaling: float
    ) -> None:
        dtype = self.rounding_dtype(query)
        factor = self.logit_factor(state, layer_idx, layer, query)
        attention, stored = padded_decode_attention(layer, query, scaling, self.gqa_agg, dtype, factor)
        self._score_and_evict(state, layer_idx, layer, attention, stored, dtype)

    def append(
        self, state: DecodeState, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor, scaling: float
    ) -> None:
        """With :attr:`evicts_on_append`, FMInference H2O's handling of a multi-token forward: the appended rows'
        attention sums (:func:`~kvbench.eviction.token_scores.appended_attention`) go into the running scores, then
        every head is evicted to its cap at once; without, the appended tokens wait (score 0) for the next step."""
        if not self.evicts_on_append:
            return
        dtype = self.rounding_dtype(query)
        row_scale = self.append_row_scale(state, layer_idx, layer, query)
        sums = appended_attention(layer, query, scaling, self.gqa_agg, dtype, row_scale)
        padded = torch.nn.utils.rnn.pad_sequence(sums, batch_first=True)  # [H, S_max], 0 past each head
        self._score_and_evict(state, layer_idx, layer, padded, None, dtype)

    def _score_and_evict(
        self,
        state: DecodeState,
        layer_idx: int,
        layer: HeadwiseLayer,
        attention: torch.Tensor,
        stored: torch.Tensor | None,
        dtype: torch.dtype | None = None,
    ) -> None:
        """Fold this step's ``[H, S_max]`` attention into the scores (rounded to ``dtype`` as the reference keeps
        them), then evict every head down to its cap: in place when each over-cap head is one token over."""
        view = self._aligned_scores(state, layer_idx, layer)
        view.copy_(round_to(self.update_scores(view, attention), dtype))
        assert layer.lengths is not None
        state.scored[layer_idx] = layer.lengths.clone()
        caps = state.layer_caps(layer_idx)
        heads = one_token_evictions(layer.head_lengths(), caps)
        if heads == []:
            return
        positions = layer.padded_positions()
        protected = self.protected(layer, positions, caps)
        ranked = view if protected is None else view.masked_fill(protected, float("inf"))
        if heads is not None:
            slots, last, rows = evict_lowest(layer, heads, ranked, stored)
            scores = state.scores[layer_idx]
            if rows is None:
                rows = torch.arange(scores.shape[0], device=scores.device)
            scores[rows, slots] = scores[rows, last]
            state.scored[layer_idx] = layer.lengths.clone()
            return

        def top_ranked(head: int, length: int, cap: int) -> torch.Tensor:
            return torch.topk(ranked[head, :length], cap).indices

        keep = evict_to_caps(layer, caps, top_ranked)
        assert keep is not None
        index = torch.nn.utils.rnn.pad_sequence(keep, batch_first=True)
        state.scores[layer_idx] = view.gather(1, index)
        state.scored[layer_idx] = layer.lengths.clone()


class HeavyHitterDecode(ScoredDecodePolicy):
    """H2O decoding: accumulate attention, evict the lightest token outside the recent window (after an append
    too, when ``evict_on_append``: module docstring)."""

    #: A step acts on each stored head's own row (caps, scores, seen tokens per row), so a decode batch's pool of
    #: several samples' rows steps in one call (:mod:`kvbench.inference.decode_pool`).
    steps_sample_rows = True

    def __init__(
        self, recent_window: int, accumulate: bool = True, gqa_agg: str = "mean", score_dtype: str = "model",
        evict_on_append: bool = True,
    ) -> None:  # fmt: skip
        super().__init__(recent_window, gqa_agg, score_dtype)
        self.accumulate = accumulate
        self.evicts_on_append = evict_on_append

    def update_scores(self, old: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        return old + attention if self.accumulate else old


@dataclass(frozen=True)
class H2O(VoteKnobs, FamilyMethod, family="h2o"):
    """H2O's switches (module docstring); the window is the recent part."""

    #: ``all_rows`` (every prompt query votes, the reference) or ``window`` (only the observation window's rows).
    scores: str = choice("all_rows", SCORE_ROWS)
    #: Add each decoding step's attention to the running scores (the reference); false = prefill scores only.
    decode_accumulate: bool = True
    #: After a multi-token append, add its rows' attention and evict at once (the reference); false = kvbench's
    #: earlier behaviour (the appended tokens stay, scored 0, until the first decoding step cuts to the cap).
    evict_on_append: bool = True

    def build(self, method_cfg: Any) -> EvictionMethod:
        """H2O: all-rows accumulated attention + recent window; decode-time eviction when ``decode_eviction``."""
        knobs = common_knobs(method_cfg, self)
        options = score_options(self)
        policy = None
        if self.decode_eviction:
            policy = HeavyHitterDecode(
                knobs["window"], self.decode_accumulate, knobs["gqa_agg"], options.score_dtype, self.evict_on_append
            )
        return EvictionMethod(
            scorer=AllRowsScorer(options, self.scores),
            decode_policy=policy,
            settings={
                "scores": self.scores,
                "decode_accumulate": self.decode_accumulate,
                "evict_on_append": self.evict_on_append,
            },
            **knobs,
        )
