"""Pure-torch references of every kernel in :mod:`kvbench.kernels`: simple, materialising, used by the tests.

Each function states the exact semantics its fast counterpart must match.
"""

from __future__ import annotations

import torch

from kvbench.kernels.stats import WindowStats

ENTROPY_EPS = 1e-10


def round_probs(probs: torch.Tensor, prob_dtype: torch.dtype | None) -> torch.Tensor:
    """Round float32 values (probabilities, logits) to ``prob_dtype`` and back (the references' cast of the softmax
    to the model dtype, or a matmul's output in it); identity for ``None`` and float32/float64."""
    if prob_dtype is None or prob_dtype in (torch.float32, torch.float64):
        return probs
    return probs.to(prob_dtype).float()


def attention_logits(
    queries: torch.Tensor,
    keys: torch.Tensor,
    scaling: float,
    row_scale: torch.Tensor | None = None,
    logit_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``[H_q, R, S]`` float32 scaled logits of queries ``[H_q, R, D]`` over keys ``[H, S, D]`` (GQA: consecutive
    query heads share a key head), bottom-right causal: query ``r`` sits at position ``S - R + r`` and its future
    keys are ``-inf``.  ``row_scale`` (``[R]``) multiplies each row's scaled logits (AhaKV's step-gain softmax).

    ``logit_dtype`` rounds as a matmul in that dtype does: the product ``q k^T``, then the scaled logits, then
    their product with ``row_scale`` (the reference code's ``matmul(q, k^T) / sqrt(d)`` in bf16/fp16: each op's
    result is rounded to the dtype; the division by a scalar runs as a multiplication by its reciprocal on CUDA).
    """
    num_q, rows, dim = queries.shape
    num_heads, length, _ = keys.shape
    grouped = queries.float().reshape(num_heads, (num_q // num_heads) * rows, dim)
    products = round_probs(torch.bmm(grouped, keys.float().transpose(1, 2)), logit_dtype)
    logits = round_probs(products.reshape(num_q, rows, length) * scaling, logit_dtype)
    if row_scale is not None:
        logits = round_probs(logits * row_scale.float().to(logits.device)[None, :, None], logit_dtype)
    future = torch.arange(length)[None, :] > torch.arange(length - rows, length)[:, None]
    return logits.masked_fill(future.to(logits.device)[None], float("-inf"))


def window_probs_reference(
    queries: torch.Tensor,
    keys: torch.Tensor,
    scaling: float,
    row_scale: torch.Tensor | None = None,
    logit_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``[H_q, W, S]`` float32 softmax of window queries ``[H_q, W, D]`` over keys ``[H, S, D]`` (GQA: consecutive
    query heads share a key head), causal in the window (query ``i`` sees keys ``0 .. S - W + i``); logits rounded
    to ``logit_dtype`` as :func:`attention_logits` says."""
    return torch.softmax(attention_logits(queries, keys, scaling, row_scale, logit_dtype), dim=-1)


def stats_of_probs(
    probs: torch.Tensor,
    eps: float = ENTROPY_EPS,
    prob_dtype: torch.dtype | None = None,
    logits: torch.Tensor | None = None,
) -> WindowStats:
    """:class:`WindowStats` of a materialised ``[H_q, W, S]`` attention matrix.

    The column statistics use the probabilities rounded to ``prob_dtype`` (when given); the row statistics the
    float32 ones.  ``row_lse`` needs the ``logits`` (NaN without them).
    """
    rounded = round_probs(probs, prob_dtype)
    window = probs.shape[1]
    mean = rounded.mean(dim=1, keepdim=True)
    lse = torch.logsumexp(logits, dim=-1) if logits is not None else torch.full(probs.shape[:2], float("nan"))
    return WindowStats(
        col_sum=rounded.sum(dim=1),
        col_m2=((rounded - mean) ** 2).sum(dim=1),
        col_max=rounded.amax(dim=1),
        col_entropy=-(rounded * torch.log(rounded + eps)).sum(dim=1),
        row_lse=lse,
        row_entropy=torch.special.entr(probs).sum(dim=-1),
        window=window,
    )


def window_stats_reference(
    queries: torch.Tensor,
    keys: torch.Tensor,
    scaling: float,
    eps: float = ENTROPY_EPS,
    prob_dtype: torch.dtype | None = None,
    row_scale: torch.Tensor | None = None,
    logit_dtype: torch.dtype | None = None,
) -> WindowStats:
    """:class:`WindowStats` computed from the materialised ``[H_q, W, S]`` matrix (logits rounded to
    ``logit_dtype`` as :func:`attention_logits` says)."""
    logits = attention_logits(queries, keys, scaling, row_scale, logit_dtype)
    return stats_of_probs(torch.softmax(logits, dim=-1), eps, prob_dtype, logits)


def causal_column_sums_reference(
    queries: torch.Tensor,
    keys: torch.Tensor,
    scaling: float,
    prob_dtype: torch.dtype | None = None,
    row_scale: torch.Tensor | None = None,
    logit_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``[H_q, S]`` column sums of the materialised ``[H_q, R, S]`` float32 softmax of ``queries`` ``[H_q, R, D]``
    (bottom-right causal; ``R = S`` is a whole causal prefill) over ``keys`` ``[H, S, D]``, each probability
    rounded to ``prob_dtype`` first when given (logits rounded to ``logit_dtype`` as :func:`attention_logits`)."""
    probs = torch.softmax(attention_logits(queries, keys, scaling, row_scale, logit_dtype), dim=-1)
    return round_probs(probs, prob_dtype).sum(dim=1)


def slots_of(block_table: torch.Tensor, head: torch.Tensor, index: torch.Tensor, page_size: int) -> torch.Tensor:
    """Flat pool slots of logical token ``index`` of ``head`` (1-D tensors of equal length)."""
    pages = block_table[head.long(), (index // page_size).long()].long()
    return pages * page_size + index.long() % page_size


def paged_append_reference(
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    pos_pool: torch.Tensor,
    new_k: torch.Tensor,
    new_v: torch.Tensor,
    block_table: torch.Tensor,
    lengths: torch.Tensor,
    start_position: int,
    page_size: int,
) -> None:
    """Write ``q`` new tokens at the end of every head, in place.

    Parameters
    ----------
    k_pool, v_pool:
        ``[N_slots, D]`` flat pools (``N_slots = pages * page_size``).
    pos_pool:
        ``[N_slots]`` int32 token positions.
    new_k, new_v:
        ``[H, q, D]`` the new tokens per head.
    block_table:
        ``[H, max_pages]`` int32 physical page of each logical page; pages for the new tokens must exist.
    lengths:
        ``[H]`` int32 tokens stored per head *before* the append (not modified here).
    start_position:
        Position of the first new token (all heads get ``start_position .. + q - 1``).
    """
    num_heads, new_tokens, _ = new_k.shape
    head = torch.arange(num_heads, device=new_k.device).repeat_interleave(new_tokens)
    index = lengths.long().repeat_interleave(new_tokens) + torch.arange(new_tokens, device=new_k.device).repeat(
        num_heads
    )
    slots = slots_of(block_table, head, index, page_size)
    k_pool.index_copy_(0, slots, new_k.reshape(-1, new_k.shape[-1]).to(k_pool.dtype))
    v_pool.index_copy_(0, slots, new_v.reshape(-1, new_v.shape[-1]).to(v_pool.dtype))
    positions = torch.arange(start_position, start_position + new_tokens, device=new_k.device, dtype=torch.int32)
    pos_pool.index_copy_(0, slots, positions.repeat(num_heads))


def copy_rows_reference(
    src_k: torch.Tensor,
    src_v: torch.Tensor,
    src_slots: torch.Tensor,
    dst_k: torch.Tensor,
    dst_v: torch.Tensor,
    dst_slots: torch.Tensor,
) -> None:
    """``dst[dst_slots[r]] = src[src_slots[r]]`` for K and V pools ``[N, D]`` (compaction), in place."""
    dst_k.index_copy_(0, dst_slots.long(), src_k.index_select(0, src_slots.long()))
    dst_v.index_copy_(0, dst_slots.long(), src_v.index_select(0, src_slots.long()))


def paged_decode_attention_reference(
    query: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_table: torch.Tensor,
    lengths: torch.Tensor,
    scaling: float,
    page_size: int,
) -> torch.Tensor:
    """One query token per head group over each head's paged keys.

    Parameters
    ----------
    query:
        ``[H, G, D]`` the ``G`` query heads of each stored head.
    k_pool, v_pool:
        ``[N_slots, D]`` flat pools.
    block_table, lengths:
        ``[H, max_pages]`` int32 and ``[H]`` int32.

    Returns
    -------
    ``[H, G, D]`` attention output in the query's dtype.
    """
    outputs = []
    for head in range(query.shape[0]):
        length = int(lengths[head])
        index = torch.arange(length, device=query.device)
        slots = slots_of(block_table, torch.full_like(index, head), index, page_size)
        keys, values = k_pool.index_select(0, slots).float(), v_pool.index_select(0, slots).float()
        probs = torch.softmax(query[head].float() @ keys.T * scaling, dim=-1)
        outputs.append(probs @ values)
    return torch.stack(outputs).to(query.dtype)
