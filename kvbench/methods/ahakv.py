"""AhaKV (Gu et al., 2025): adaptive holistic attention-driven eviction -- H2O's accumulated attention, fixed.

Three switchable components (Table 2's ablation):

* **RA** (recent accumulation, ``params.ra``): the score of a token is the attention it receives from the last
  ``B_r = window`` (32) queries only.  Off: accumulated over *all* prompt queries (H2O's column sum, by the
  fused kernels, never an ``S x S`` matrix).
* **SGS** (step-gain softmax, ``params.sgs``): the scoring softmax uses an inverse temperature from the entropy
  expectation (Eq. 12), ``lambda = sqrt(2 ln(i/k) / d)``.  Reading of what lambda multiplies
  (``params.lambda_reading``): ``unscaled`` (default, self-consistent with the derivation: lambda multiplies
  ``QK^T``, i.e. the scaled logits are multiplied by ``sqrt(2 ln(i/k))``) or ``literal`` (the scaled logits
  ``QK^T/sqrt(d)`` are multiplied by lambda).  ``i`` ("the number of total tokens", ``params.lambda_i``): ``row``
  = tokens visible to the query (``position + 1``) or ``total`` = the prompt length ``n`` for every row (while
  decoding both are every token seen so far); ``k`` = the layer's budget (``params.lambda_k``: ``budget`` default,
  or ``selected`` = budget - B_r); ``ln(i/k)`` is floored at ``params.min_log`` (1e-3).  With RA the 32 rows differ
  by at most 32 tokens, so the two ``i`` readings agree; without RA the ``row`` reading gives the first ``~k``
  rows ``i <= k`` -- a near-uniform softmax that favours early tokens -- so ``ahakv_no_ra`` uses ``total``.  Only
  the score uses lambda: the model's attention is unchanged.
* **VPE** (value-prior enhancement, ``params.vpe``): the score is multiplied by ``avgpool(||v||^2) / max``
  (kernel ``params.vpe_kernel``, 7 -- the paper gives none; stride 1, same length).

Prefill keeps the ``B_r`` most recent tokens plus the top ``B - B_r`` by score (per head; GQA: scores are
averaged per KV group with ``params.gqa_agg`` before VPE, which is per KV head).  Decoding (Algorithm 1): each new
query's SG-softmax attention (reduced per KV group with ``method.params.gqa_agg``) is added to the running scores
(initialised with the prefill's enhanced scores, new tokens start at 0, increments are not value-weighted); above
the budget the lowest-scoring token outside the recent ``B_r`` is evicted.  A multi-token forward after the prefill
(question-agnostic mode's question) is handled as H2O's code, which AhaKV modifies, handles one: every appended row's
SG-softmax attention (``i`` = the tokens that row sees) is added, then each head is cut to its budget at once
(``params.evict_on_append: false``: kvbench's earlier behaviour, the appended tokens wait for decoding).
Paper-only: no code was released.  Rounding follows ``params.score_dtype`` as H2O's code: ``model`` (default) rounds
the logits (product, scaling, step gain), the float32 softmax, the sums, the GQA reduction, the value-prior product
and the running scores to the model dtype; ``float32`` is the spec sketch's float32 scoring.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from kvbench import kernels
from kvbench.eviction.base import (
    DecodeState,
    EvictionMethod,
    PromptRows,
    TokenScorer,
    WindowObservation,
    common_knobs,
)
from kvbench.eviction.decoding import samples_and_heads
from kvbench.eviction.family import FamilyMethod
from kvbench.eviction.params import bounded, choice
from kvbench.eviction.token_scores import ScoreDtypeKnob, aggregate_groups, probability_dtype, round_to
from kvbench.methods.h2o import ScoredDecodePolicy

if TYPE_CHECKING:  # type hints only: importing the cache would import transformers
    from kvbench.cache.kv_cache import HeadwiseLayer

LAMBDA_READINGS = ("unscaled", "literal")
LAMBDA_KS = ("budget", "selected")
LAMBDA_IS = ("row", "total")


def sg_multiplier(visible: torch.Tensor, k: int, head_dim: int, reading: str, min_log: float) -> torch.Tensor:
    """Factor applied to the *scaled* logits ``QK^T/sqrt(d)`` for rows seeing ``visible`` tokens (any shape)."""
    log_ratio = torch.clamp(torch.log(visible.double() / max(k, 1)), min=min_log)
    factor = torch.sqrt(2.0 * log_ratio)
    if reading == "literal":
        factor = factor / math.sqrt(head_dim)
    return factor.float()


def sg_multiplier_scalar(visible: int, k: int, head_dim: int, reading: str, min_log: float) -> float:
    """:func:`sg_multiplier` of one row, on the host (a decoding step's factor: no tensor, no device round trip);
    rounded to float32 like the tensor version."""
    factor = math.sqrt(2.0 * max(math.log(visible / max(k, 1)), min_log))
    if reading == "literal":
        factor = factor / math.sqrt(head_dim)
    return struct.unpack("f", struct.pack("f", factor))[0]


def value_prior(values: torch.Tensor, kernel_size: int) -> torch.Tensor:
    """VPE factor ``[H, S]``: ``avgpool(||v||^2)`` normalised by its maximum over tokens, from ``[H, S, D]``."""
    norms = torch.cat([block.float().pow(2).sum(dim=-1) for block in values.split(8192, dim=1)], dim=1)  # [H, S]
    if kernel_size > 1:
        norms = F.avg_pool1d(norms[:, None], kernel_size, 1, kernel_size // 2, count_include_pad=False)[:, 0]
    return norms / norms.amax(dim=-1, keepdim=True).clamp_min(1e-30)


class AhaScorer(TokenScorer):
    """RA + SGS + VPE score, ``[H, S]`` per stored head (see module docstring)."""

    def __init__(
        self, ra: bool, sgs: bool, vpe: bool, params: AhaKV, window: int, gqa_agg: str,
        score_dtype: str = "model",
    ) -> None:  # fmt: skip
        self.ra, self.sgs, self.vpe = ra, sgs, vpe
        self.params = params
        self.window = window
        self.gqa_agg = gqa_agg
        self.score_dtype = score_dtype

    def budget_k(self, layer_budget: int | None, context: int) -> int:
        """``k`` of Eq. 12 for this layer."""
        budget = context if layer_budget is None else layer_budget
        if self.params.lambda_k == "selected":
            budget -= self.window
        return max(budget, 1)

    def row_attention(
        self, queries: torch.Tensor, keys: torch.Tensor, scaling: float, k: int, impl: str = "auto"
    ) -> torch.Tensor:
        """Column sums ``[H_q, S]`` of the (SG-)softmax attention of the last ``queries.shape[1]`` rows, fused with
        each row's step-gain factor (never a rows x S matrix): the window's statistics for the recent rows,
        :func:`kvbench.kernels.causal_column_sums` for every prompt row.  Rounded to the queries' dtype (logits,
        probabilities, the sums) under ``score_dtype=model``."""
        dtype = probability_dtype(queries.dtype, self.score_dtype)
        rows, dim = queries.shape[1], queries.shape[2]
        context = keys.shape[1]
        factor = None
        if self.sgs:
            positions = torch.arange(context - rows, context, device=keys.device)
            visible = positions + 1 if self.params.lambda_i == "row" else torch.full_like(positions, context)
            factor = sg_multiplier(visible, k, dim, self.params.lambda_reading, self.params.min_log)
        rounding = dict(prob_dtype=dtype, logit_dtype=dtype, row_scale=factor, impl=impl)
        if rows < context:
            return round_to(kernels.window_stats(queries, keys, scaling, **rounding).col_sum, dtype)
        return round_to(kernels.causal_column_sums(queries, keys, scaling, **rounding), dtype)

    def prompt_rows(self, model_dtype: torch.dtype) -> PromptRows:
        """Without RA every prompt row votes with its own temperature (which needs the layer budget): the session
        keeps every prompt query."""
        return PromptRows(queries=not self.ra)

    def score(self, observation: WindowObservation) -> torch.Tensor:
        queries = observation.queries
        if not self.ra and observation.prompt_queries is not None:
            queries = observation.prompt_queries
        k = self.budget_k(observation.layer_budget, observation.context_length)
        accumulated = self.row_attention(queries, observation.keys, observation.scaling, k, observation.impl)
        dtype = probability_dtype(observation.model_dtype, self.score_dtype)
        scores = round_to(aggregate_groups(accumulated, observation.keys.shape[0], self.gqa_agg), dtype)
        if self.vpe:
            scores = round_to(scores * value_prior(observation.values, self.params.vpe_kernel), dtype)
        return scores


class AhaDecode(ScoredDecodePolicy):
    """Algorithm 1's generation: accumulate SG-softmax attention, evict the lowest outside the recent window."""

    def __init__(
        self, recent_window: int, sgs: bool, params: AhaKV, gqa_agg: str = "mean", score_dtype: str = "model",
    ) -> None:  # fmt: skip
        super().__init__(recent_window, gqa_agg, score_dtype)
        self.sgs = sgs
        self.params = params
        self.evicts_on_append = params.evict_on_append

    def _step_gain(self, state: DecodeState, layer_idx: int, visible: torch.Tensor, head_dim: int) -> torch.Tensor:
        """SG factors for rows seeing ``visible`` tokens, ``k`` from the layer's decode caps."""
        caps = state.layer_caps(layer_idx)
        k = max(round(sum(caps) / len(caps)) - (self.recent_window if self.params.lambda_k == "selected" else 0), 1)
        return sg_multiplier(visible, k, head_dim, self.params.lambda_reading, self.params.min_log)

    def logit_factor(
        self, state: DecodeState, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor
    ) -> float | torch.Tensor | None:
        """The new token's step gain: ``i`` = every token seen so far (computed on the host: no device round trip).
        A decode batch's pool (several samples' rows): ``[R, 1, 1]``, each row its sample's gain."""
        if not self.sgs:
            return None
        caps = state.layer_caps(layer_idx)
        samples, heads = samples_and_heads(layer)
        seen = getattr(layer, "sample_seen", [layer.seen_tokens])
        recent = self.recent_window if self.params.lambda_k == "selected" else 0
        gains = [
            sg_multiplier_scalar(
                seen[sample], max(round(sum(caps[sample * heads : (sample + 1) * heads]) / heads) - recent, 1),
                query.shape[-1], self.params.lambda_reading, self.params.min_log,
            )
            for sample in range(samples)
        ]  # fmt: skip
        if not hasattr(layer, "sample_seen"):
            return gains[0]
        return torch.tensor(gains, device=query.device).repeat_interleave(heads)[:, None, None]

    #: Rows are independent given their sample's step gain (:meth:`logit_factor`): a decode batch's pool of several
    #: samples' rows steps in one call.
    steps_sample_rows = True

    def append_row_scale(
        self, state: DecodeState, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor
    ) -> torch.Tensor | None:
        """Each appended row's step gain: ``i`` = the tokens that row sees."""
        if not self.sgs:
            return None
        rows = query.shape[1]
        visible = torch.arange(layer.seen_tokens - rows + 1, layer.seen_tokens + 1)
        return self._step_gain(state, layer_idx, visible, query.shape[-1])

    def update_scores(self, old: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        return old + attention


@dataclass(frozen=True)
class AhaKV(ScoreDtypeKnob, FamilyMethod, family="ahakv"):
    """AhaKV's switches (see module docstring)."""

    ra: bool = True
    sgs: bool = True
    vpe: bool = True
    lambda_reading: str = choice("unscaled", LAMBDA_READINGS)
    lambda_k: str = choice("budget", LAMBDA_KS)
    #: ``row`` (i = the row's position + 1) or ``total`` (i = the prompt length for every row).
    lambda_i: str = choice("row", LAMBDA_IS)
    min_log: float = 1e-3
    vpe_kernel: int = bounded(7, low=1, odd=True)
    #: After a multi-token append, add its rows' attention and cut to the budget at once (H2O's code); false =
    #: kvbench's earlier behaviour (the appended tokens wait for decoding).
    evict_on_append: bool = True

    def build(self, method_cfg: Any) -> EvictionMethod:
        """AhaKV with each component switchable."""
        knobs = common_knobs(method_cfg, self)
        score_dtype = str(self.score_dtype)
        scorer = AhaScorer(self.ra, self.sgs, self.vpe, self, knobs["window"], knobs["gqa_agg"], score_dtype)
        policy = None
        if self.decode_eviction:
            policy = AhaDecode(knobs["window"], self.sgs, self, knobs["gqa_agg"], score_dtype)
        return EvictionMethod(
            scorer=scorer,
            decode_policy=policy,
            settings={
                "ra": self.ra,
                "sgs": self.sgs,
                "vpe": self.vpe,
                "lambda_reading": self.lambda_reading,
                "lambda_i": self.lambda_i,
                "evict_on_append": self.evict_on_append,
            },
            **knobs,
        )
