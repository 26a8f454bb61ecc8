"""Decode-time eviction vectorised over heads: what a decoding step of StreamingLLM, H2O, TOVA, AhaKV and CAKE runs.

* :func:`padded_decode_attention` -- the new query's attention over every stored head in one batched product
  (``[H, S_max]``, slot-aligned), rounded where the reference code rounds;
* :func:`one_token_evictions` -- whether a step's eviction is the common one-token-per-head case;
* :func:`evict_lowest` -- evict the lowest-ranked slot of each over-cap head in place
  (:meth:`kvbench.cache.kv_cache.HeadwiseLayer.evict_slots`: the head's last token moves into it).

No loop over heads and no host synchronisation: a step costs what the cache keeps (issue #32).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from kvbench.eviction.token_scores import aggregate_groups, round_to

if TYPE_CHECKING:  # type hints only: importing the cache would import transformers
    from kvbench.cache.kv_cache import HeadwiseLayer


def padded_decode_attention(
    layer: HeadwiseLayer,
    query: torch.Tensor,
    scaling: float,
    gqa_agg: str | None = "mean",
    dtype: torch.dtype | None = None,
    logit_factor: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention of the newest query over each stored head, reduced over the head's GQA group, vectorised over heads:
    one batched product, no loop and no host synchronisation.

    Parameters
    ----------
    layer:
        The layer, with the new token already stored.
    query:
        ``[H_q, 1, D]`` the new token's queries.
    gqa_agg:
        mean | max | sum over the query heads sharing a stored head; ``None`` keeps every query head's row.
    dtype:
        The model dtype to round to as the reference code (``score_dtype=model``): the logits of its
        ``matmul(q, k^T) / sqrt(d)`` after each op, the float32 softmax cast back, the group reduction; ``None``
        = float32 throughout.
    logit_factor:
        A factor on the scaled logits (AhaKV's step-gain softmax), applied (and rounded) after the scaling: one
        number, or ``[H, 1, 1]`` one per stored head (a decode batch's rows, each its sample's).

    Returns
    -------
    ``[H, S_max]`` float32 probabilities (``[H_q, S_max]`` with ``gqa_agg=None``; slot-aligned, 0 past a head's
    length) and the ``[H, S_max]`` mask of stored slots (``None`` when every head holds ``S_max`` tokens).
    """
    heads, dim = layer.num_heads, query.shape[-1]
    grouped = query[:, 0].float().reshape(heads, query.shape[0] // heads, dim)  # [H, g, D]
    products = key_products(layer, grouped)  # [H, g, S_max]
    width = products.shape[-1]
    logits = round_to(round_to(products, dtype) * scaling, dtype)
    if logit_factor is not None:
        logits = round_to(logits * logit_factor, dtype)
    stored = None
    if layer.is_ragged:
        assert layer.lengths is not None
        stored = torch.arange(width, device=query.device) < layer.lengths[:, None]  # [H, S_max]
        logits = logits.masked_fill(~stored[:, None], float("-inf"))
    probs = round_to(torch.softmax(logits, dim=-1), dtype).reshape(-1, width)  # [H * g, S_max]
    if gqa_agg is None:
        return probs, stored
    return round_to(aggregate_groups(probs, heads, gqa_agg), dtype), stored


def key_products(layer: HeadwiseLayer, grouped: torch.Tensor) -> torch.Tensor:
    """``[H, g, S_max]`` float32 products of each stored head's queries ``grouped`` ``[H, g, D]`` (float32) with its
    keys in float32, by slot (stale past each head's length): a decode batch's pool computes them page by page over
    its rows (:meth:`kvbench.cache.pool.PooledLayer.row_products`, no gathered copy of the keys), any other layer
    with one batched product over :meth:`padded_kv`'s keys."""
    rows = getattr(layer, "row_products", None)
    if rows is not None:
        return rows(grouped)
    return torch.bmm(grouped, layer.padded_kv()[0].float().transpose(1, 2))


def seen_by_head(layer: HeadwiseLayer) -> torch.Tensor | int:
    """Tokens seen by the sample of each stored head: ``[H, 1]`` for a decode batch's pool (each row its own
    sample's, :class:`kvbench.cache.pool.PooledLayer`), the layer's ``seen_tokens`` otherwise."""
    rows = getattr(layer, "row_seen", None)
    return layer.seen_tokens if rows is None else rows[:, None]


def samples_and_heads(layer: HeadwiseLayer) -> tuple[int, int]:
    """``(B, H)``: the samples whose rows the layer holds and the stored heads of each (a decode batch's pool stacks
    ``B`` samples' heads sample after sample; any other layer is one sample)."""
    heads = getattr(layer, "heads_per_sample", None)
    if heads is None:
        return 1, layer.num_heads
    return layer.num_heads // heads, heads


def one_token_evictions(lengths: Sequence[int], caps: Sequence[int]) -> list[int] | None:
    """The heads that exceed their cap, when each exceeds it by exactly one token (the decode-step case that
    :meth:`~kvbench.cache.kv_cache.HeadwiseLayer.evict_slots` handles in place); ``None`` when some head is further over
    (a multi-token append, a lowered cap): then the general :func:`evict_to_caps` applies."""
    over = [head for head, (length, cap) in enumerate(zip(lengths, caps, strict=True)) if length > cap]
    if any(lengths[head] != caps[head] + 1 for head in over):
        return None
    return over


def evict_lowest(
    layer: HeadwiseLayer, heads: list[int], ranked: torch.Tensor, stored: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Evict, in place, the lowest-ranked slot of each of ``heads`` (each exactly one token over its cap).

    Parameters
    ----------
    ranked:
        ``[H, S_max]`` slot ranks (higher = keep; protected slots ``+inf``).
    stored:
        ``[H, S_max]`` mask of stored slots, or ``None`` when every head holds ``S_max`` tokens.

    Returns
    -------
    The evicted slots ``[n]``, the slots their heads' last tokens came from ``[n]``, and the ``[n]`` head rows
    (``None`` = every head), for moving per-slot state the same way.
    """
    every_head = len(heads) == layer.num_heads
    rows = None if every_head else torch.tensor(heads, device=ranked.device)
    if stored is not None:
        ranked = ranked.masked_fill(~stored, float("inf"))
    candidates = ranked if rows is None else ranked.index_select(0, rows)
    slots = torch.argmin(candidates, dim=1)
    last = layer.evict_slots(slots, None if every_head else heads)
    return slots, last, rows


def evict_to_caps(
    layer: HeadwiseLayer, caps: Sequence[int], choose: Callable[[int, int, int], torch.Tensor]
) -> list[torch.Tensor] | None:
    """Evict every stored head whose length exceeds its cap (the shared step of decode-time policies).

    Parameters
    ----------
    layer:
        The layer to shrink.
    caps:
        Per stored head, the most tokens it may hold.
    choose:
        ``choose(head, length, cap)`` returns the ``cap`` slot indices (unique, any order) that an over-cap head
        keeps; heads within their cap keep everything.

    Returns
    -------
    Per head, the sorted kept slot indices (to realign per-token state), or ``None`` when no head was over cap.
    """
    lengths = layer.head_lengths()
    if all(length <= cap for length, cap in zip(lengths, caps, strict=True)):
        return None
    device = layer.positions[0].device
    keep = [
        torch.sort(choose(head, length, cap)).values if length > cap else torch.arange(length, device=device)
        for head, (length, cap) in enumerate(zip(lengths, caps, strict=True))
    ]
    layer.keep(keep)
    return keep
