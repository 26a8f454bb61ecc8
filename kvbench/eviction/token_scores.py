"""Shared steps of the attention-based token scores, on plain tensors, in the order the reference code runs them.

The SnapKV family (SnapKV, PyramidKV, Ada-KV, CAKE, XKV) scores the *candidates* -- the context tokens before the
observation window -- in four steps:

1. the window queries' softmax attention over all keys (causal inside the window, float32 softmax);
2. a reduction over the window rows (sum: SnapKV/PyramidKV; mean: Ada-KV; mean + gamma * var: CAKE) -- steps 1
   and 2 are fused (:func:`kvbench.kernels.window_stats`, via
   :meth:`~kvbench.eviction.base.WindowObservation.window_stats`):
   the ``[H_q, W, S]`` matrix is never built on a method's path;
3. the slice ``[:, :S - W]`` (the window's own columns never enter the pooling);
4. GQA reduction of the query heads sharing a stored head and 1-D pooling along the sequence, in the family's
   order (:data:`GQA_REDUCE_ORDERS`): KVCache-Factory's ``kv_cache_granularity=kv_head`` and AdaKV's
   ``gqa_support`` reduce first; CAKE's code pools each query head first.

Average pooling counts the zero padding at the edges (``F.avg_pool1d``'s default ``count_include_pad=True``, as
every reference); ``pool_padding="exclude"`` is kvbench's alternative.  The references cast the float32 softmax
back to the model dtype and run every later step in that dtype; :class:`ScoreOptions` reproduces that rounding
(``score_dtype="model"``) or keeps float32 (``"float32"``) -- the same thing for float32 models.  The fused kernels
round each probability to the model dtype before they reduce it (``prob_dtype``), so the rounding holds on the
fused path too; the reductions accumulate in float32, as torch's bf16 reductions do.

Shapes: ``H_q`` query heads, ``H`` stored heads, ``W`` window queries, ``S`` context tokens, ``C = S - W``
candidates, ``D`` head dim.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from kvbench import kernels
from kvbench.checks import check_choice
from kvbench.config import GQA_AGGREGATIONS, GQA_REDUCE_ORDERS, POOL_PADDINGS, POOLING_TYPES, SCORE_DTYPES
from kvbench.eviction.params import bounded, choice
from kvbench.kernels import WindowStats
from kvbench.kernels.reference import window_probs_reference

if TYPE_CHECKING:  # type hints only: importing the cache would import transformers
    from kvbench.cache.kv_cache import HeadwiseLayer

Rounding = Callable[[torch.Tensor], torch.Tensor]


def window_attention(queries: torch.Tensor, keys: torch.Tensor, scaling: float) -> torch.Tensor:
    """The dense reference: ``[H_q, W, S]`` float32 softmax of window queries ``[H_q, W, D]`` (query ``i`` at
    position ``S - W + i``) over keys ``[H, S, D]``.

    For tests and comparisons only -- no method calls it: scorers read the fused
    :meth:`~kvbench.eviction.base.WindowObservation.window_stats`.
    """
    return window_probs_reference(queries, keys, scaling)


def aggregate_groups(scores: torch.Tensor, num_heads: int, how: str) -> torch.Tensor:
    """Reduce per-query-head scores ``[H_q, S]`` to per-stored-head ``[H, S]`` (identity when ``H_q == H``)."""
    if scores.shape[0] == num_heads:
        return scores
    grouped = scores.reshape(num_heads, scores.shape[0] // num_heads, scores.shape[1])
    if how == "mean":
        return grouped.mean(dim=1)
    if how == "max":
        return grouped.amax(dim=1)
    if how == "sum":
        return grouped.sum(dim=1)
    raise ValueError(f"unknown gqa_agg {how!r}; valid: {', '.join(GQA_AGGREGATIONS)}")


def pool_scores(scores: torch.Tensor, kernel_size: int, pooling: str, include_padding: bool = True) -> torch.Tensor:
    """Smooth ``[H, S]`` scores along the sequence with a same-length 1-D pooling (SnapKV's clustering).

    Padding is ``kernel_size // 2`` on each side: max pooling ignores it; average pooling divides every window by
    ``kernel_size`` when ``include_padding`` (``F.avg_pool1d``'s default, as the reference code), else by the number
    of real positions in it.
    """
    if kernel_size <= 1 or scores.shape[-1] == 0:  # nothing to smooth (a prompt no longer than the window)
        return scores
    if kernel_size % 2 == 0:
        raise ValueError(f"pooling kernel_size must be odd, got {kernel_size}")
    padding = kernel_size // 2
    if pooling == "max":
        return F.max_pool1d(scores[:, None], kernel_size, stride=1, padding=padding)[:, 0]
    if pooling == "avg":
        return F.avg_pool1d(scores[:, None], kernel_size, stride=1, padding=padding, count_include_pad=include_padding)[
            :, 0
        ]
    raise ValueError(f"unknown pooling {pooling!r}; valid: {', '.join(POOLING_TYPES)}")


def no_rounding(scores: torch.Tensor) -> torch.Tensor:
    """Keep float32 (the ``score_dtype="float32"`` rounding)."""
    return scores


def rounding_to(dtype: torch.dtype) -> Rounding:
    """Round float32 scores to ``dtype`` and back, as a reference step producing a ``dtype`` tensor does."""
    if dtype in (torch.float32, torch.float64):
        return no_rounding
    return lambda scores: scores.to(dtype).float()


@dataclass(frozen=True)
class ScoreDtypeKnob:
    """The knob of every scorer that rounds its scores as the reference code does (``method.params.score_dtype``)."""

    #: Precision of the eviction scores: ``model`` (the references' softmax in float32 cast back to the model dtype,
    #: every later reduction in that dtype) | ``float32`` (kept in float32 throughout).  Identical for float32 models.
    score_dtype: str = choice("model", SCORE_DTYPES)


@dataclass(frozen=True)
class PoolingKnobs:
    """The knobs of the scorers that pool their scores along the sequence (``method.params.<knob>``)."""

    #: Pooling kernel along the sequence: odd, so that pooled scores stay aligned with their tokens (1 = none;
    #: SnapKV 7, CAKE 5).
    kernel_size: int = bounded(7, low=1, odd=True)
    #: ``max`` | ``avg``.
    pooling: str = choice("max", POOLING_TYPES)
    #: Average pooling at the sequence edges: ``include`` (the padding counts, ``F.avg_pool1d``'s default, every
    #: reference) | ``exclude`` (edge scores divided by the real neighbours only).
    pool_padding: str = choice("include", POOL_PADDINGS)


@dataclass(frozen=True)
class VoteKnobs(PoolingKnobs, ScoreDtypeKnob):
    """The knobs of the attention-vote scorers (SnapKV, PyramidKV, Ada-KV, CAKE, H2O): pooling, precision and where
    the query heads of a stored head are combined."""

    #: ``before_pool`` (KVCache-Factory's kv_head mode, AdaKV's gqa_support) | ``after_pool`` (CAKE's code);
    #: null = the family's reference order.
    gqa_reduce: str | None = choice(None, GQA_REDUCE_ORDERS)  # type: ignore[arg-type]


@dataclass(frozen=True)
class ScoreOptions:
    """The method knobs that turn per-query-head candidate scores into per-stored-head ones (module docstring).

    Attributes
    ----------
    kernel_size, pooling:
        Pooling along the sequence (``kernel_size`` 1 = none).
    gqa_agg:
        mean | max | sum over the query heads of a stored head.
    gqa_reduce:
        before_pool | after_pool.
    pool_padding:
        include | exclude (average pooling at the edges).
    score_dtype:
        model | float32.
    """

    kernel_size: int = 1
    pooling: str = "max"
    gqa_agg: str = "mean"
    gqa_reduce: str = "before_pool"
    pool_padding: str = "include"
    score_dtype: str = "model"

    def __post_init__(self) -> None:
        for key, value, valid in (
            ("pooling", self.pooling, POOLING_TYPES),
            ("gqa_agg", self.gqa_agg, GQA_AGGREGATIONS),
            ("gqa_reduce", self.gqa_reduce, GQA_REDUCE_ORDERS),
            ("pool_padding", self.pool_padding, POOL_PADDINGS),
            ("score_dtype", self.score_dtype, SCORE_DTYPES),
        ):
            check_choice(f"method.{key}", value, valid)
        if self.kernel_size > 1 and self.kernel_size % 2 == 0:
            raise ValueError(f"method.params.kernel_size must be odd (same-length pooling), got {self.kernel_size}")

    def rounding(self, model_dtype: torch.dtype) -> Rounding:
        """The rounding applied after every step for a model computing in ``model_dtype``."""
        return rounding_to(model_dtype) if self.score_dtype == "model" else no_rounding

    def probability_dtype(self, model_dtype: torch.dtype) -> torch.dtype | None:
        """The dtype each attention probability is rounded to before the row reduction (``None``: float32)."""
        return probability_dtype(model_dtype, self.score_dtype)

    def pool(self, scores: torch.Tensor) -> torch.Tensor:
        """:func:`pool_scores` with these options."""
        return pool_scores(scores, self.kernel_size, self.pooling, self.pool_padding == "include")

    def to_stored_heads(self, per_query_head: torch.Tensor, num_heads: int, model_dtype: torch.dtype) -> torch.Tensor:
        """GQA reduction and pooling in the configured order: ``[H_q, C]`` -> ``[H, C]`` float32.

        ``per_query_head`` already holds model-dtype-rounded values when ``score_dtype="model"``.
        """
        rnd = self.rounding(model_dtype)
        if self.gqa_reduce == "before_pool":
            return rnd(self.pool(rnd(aggregate_groups(per_query_head, num_heads, self.gqa_agg))))
        return rnd(aggregate_groups(rnd(self.pool(per_query_head)), num_heads, self.gqa_agg))


def probability_dtype(model_dtype: torch.dtype, score_dtype: str) -> torch.dtype | None:
    """The rounding of each probability for ``score_dtype`` (``model``: the model's half dtype; else ``None``)."""
    if score_dtype == "model" and model_dtype not in (torch.float32, torch.float64):
        return model_dtype
    return None


def window_votes(stats: WindowStats, how: str, rnd: Rounding = no_rounding) -> torch.Tensor:
    """The window rows' ``sum`` or ``mean`` ``[H_q, S]`` of the (rounded) attention, rounded by ``rnd``.

    ``stats`` must come from probabilities rounded as ``rnd`` rounds (the references' cast of the float32 softmax
    to the model dtype before they reduce it).
    """
    if how == "sum":
        return rnd(stats.col_sum)
    if how == "mean":
        return rnd(stats.mean)
    raise ValueError(f"unknown window-row reduction {how!r}; valid: sum, mean")


def with_window_columns(candidates: torch.Tensor, context_length: int, fill: float = 0.0) -> torch.Tensor:
    """``[H, C]`` candidate scores padded to ``[H, S]`` (the window columns, protected by the session, get ``fill``)."""
    out = candidates.new_full((candidates.shape[0], context_length), fill)
    out[:, : candidates.shape[1]] = candidates
    return out


def round_to(values: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """``values`` rounded to ``dtype`` and back to float32 (a reference step producing a ``dtype`` tensor); the
    identity for ``None`` / float32."""
    if dtype is None or dtype in (torch.float32, torch.float64):
        return values
    return values.to(dtype).float()


def appended_attention(
    layer: HeadwiseLayer,
    query: torch.Tensor,
    scaling: float,
    gqa_agg: str = "mean",
    dtype: torch.dtype | None = None,
    row_scale: torch.Tensor | None = None,
    impl: str = "auto",
) -> list[torch.Tensor]:
    """Attention each stored token receives from the ``q`` rows of a multi-token append, summed over the rows
    (causal: appended row ``r`` sees the head's slots up to its own), reduced over each head's GQA group.

    The column sums of FMInference's H2O cache (``attn_score_cache.sum(0).sum(1)``) for a forward after the
    prefill, by the fused :func:`kvbench.kernels.causal_column_sums` (never a ``q x S_h`` float32 matrix per row
    block beyond its bound).

    Parameters
    ----------
    layer:
        The layer, with the ``q`` appended tokens already stored (the last ``q`` slots of every head).
    query:
        ``[H_q, q, D]`` the appended tokens' queries.
    dtype:
        Rounding as :func:`~kvbench.eviction.decoding.padded_decode_attention` (logits, probabilities, the row sum
        and the group reduction).
    row_scale:
        ``[q]`` factor on each row's scaled logits (AhaKV), or ``None``.

    Returns
    -------
    Per stored head, ``[S_h]`` float32 sums.
    """
    groups = query.shape[0] // layer.num_heads
    sums = []
    for head in range(layer.num_heads):
        keys, _ = layer.head_kv(head)
        head_q = query[head * groups : (head + 1) * groups]  # [g, q, D]
        column = kernels.causal_column_sums(
            head_q, keys[None], scaling, prob_dtype=dtype, logit_dtype=dtype, row_scale=row_scale, impl=impl
        )
        sums.append(round_to(aggregate_groups(round_to(column, dtype), 1, gqa_agg)[0], dtype))
    return sums
