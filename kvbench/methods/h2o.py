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
    evict_lowest,
    evict_to_caps,
    one_token_evictions,
    padded_decode_attention,
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
    """Shared machinery of score-driven decode policies: per-head running scores aligned with the storage slots.

    The scores of a layer are one ``[H, C]`` float32 tensor (``C`` >= the longest head; slot ``s`` of head ``h`` at
    ``[h, s]``), so a step is a handful of vectorised operations over heads: score, then evict the lowest slot of
    each over-cap head in place (:func:`~kvbench.methods.base.evict_lowest`) and move the scores the same way.
    """

    def __init__(self, recent_window: int, gqa_agg: str = "mean") -> None:
        self.recent_window = recent_window
        self.gqa_agg = gqa_agg
        self.caps: dict[int, list[int]] = {}
        #: Per layer ``[H, C]`` running scores by slot; ``_scored`` ``[H]``: slots scored so far (the rest are
        #: tokens appended since the last step, which start at 0).
        self.scores: dict[int, torch.Tensor] = {}
        self._scored: dict[int, torch.Tensor] = {}

    def start_layer(
        self, layer_idx: int, layer: HeadwiseLayer, head_budgets: list[int], scores: list[torch.Tensor] | None = None
    ) -> None:
        self.caps[layer_idx] = list(head_budgets)
        lengths = layer.head_lengths()
        device = layer.positions[0].device
        padded = torch.zeros((len(lengths), max(lengths, default=0)), dtype=torch.float32, device=device)
        if scores is not None:
            for head, score in enumerate(scores):
                padded[head, : score.shape[0]] = score.float()
        self.scores[layer_idx] = padded
        self._scored[layer_idx] = torch.tensor(lengths, device=device)

    def head_scores(self, layer_idx: int) -> list[torch.Tensor]:
        """The running scores of a layer's stored tokens, per head ``[S_h]`` by slot (for inspection)."""
        scores = self.scores[layer_idx]
        return [scores[head, :length] for head, length in enumerate(self._scored[layer_idx].tolist())]

    def _aligned_scores(self, layer_idx: int, layer: HeadwiseLayer) -> torch.Tensor:
        """``[H, S_max]`` view of the running scores, zero for tokens appended since the last step (the buffer
        grows by 1/8 when a head outgrows it, so this is amortised O(H) per step)."""
        scores = self.scores[layer_idx]
        width = max(layer.head_lengths(), default=0)
        if width > scores.shape[1]:
            grown = scores.new_zeros((scores.shape[0], max(width, scores.shape[1] + scores.shape[1] // 8 + 1)))
            grown[:, : scores.shape[1]] = scores
            self.scores[layer_idx] = scores = grown
        view = scores[:, :width]
        fresh = torch.arange(width, device=scores.device) >= self._scored[layer_idx][:, None]
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
        return positions >= layer.seen_tokens - recent[:, None]

    def step(self, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor, scaling: float) -> None:
        attention, stored = padded_decode_attention(layer, query, scaling, self.gqa_agg)
        self._score_and_evict(layer_idx, layer, attention, stored)

    def _score_and_evict(
        self, layer_idx: int, layer: HeadwiseLayer, attention: torch.Tensor, stored: torch.Tensor | None
    ) -> None:
        """Fold this step's ``[H, S_max]`` attention into the scores, then evict every head down to its cap."""
        view = self._aligned_scores(layer_idx, layer)
        view.copy_(self.update_scores(view, attention))
        assert layer.lengths is not None
        self._scored[layer_idx] = layer.lengths.clone()
        caps = self.caps[layer_idx]
        heads = one_token_evictions(layer.head_lengths(), caps)
        if heads == []:
            return
        positions = layer.padded_positions()
        protected = self.protected(layer, positions, caps)
        ranked = view if protected is None else view.masked_fill(protected, float("inf"))
        if heads is not None:
            slots, last, rows = evict_lowest(layer, heads, ranked, stored)
            scores = self.scores[layer_idx]
            if rows is None:
                rows = torch.arange(scores.shape[0], device=scores.device)
            scores[rows, slots] = scores[rows, last]
            self._scored[layer_idx] = layer.lengths.clone()
            return

        def top_ranked(head: int, length: int, cap: int) -> torch.Tensor:
            return torch.topk(ranked[head, :length], cap).indices

        keep = evict_to_caps(layer, caps, top_ranked)
        assert keep is not None
        index = torch.nn.utils.rnn.pad_sequence(keep, batch_first=True)
        self.scores[layer_idx] = view.gather(1, index)
        self._scored[layer_idx] = layer.lengths.clone()


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
