"""Dispatchers: each op runs its Triton kernel on CUDA tensors when Triton is installed, and a pure-torch
implementation otherwise (CPU, or ``impl="torch"``).  ``impl="triton"`` forces the kernel (CPU tensors work under
``TRITON_INTERPRET=1``, which is how the tests run them without a GPU).
"""

from __future__ import annotations

import functools
import math

import torch

from kernels import reference
from kernels.stats import WindowStats

IMPLS = ("auto", "triton", "torch")


@functools.cache
def triton_available() -> bool:
    """Whether ``import triton`` works (the kernels module compiles lazily, at first launch)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def use_triton(impl: str, *tensors: torch.Tensor) -> bool:
    """Resolve ``impl``: ``auto`` -> Triton iff installed and every tensor is on CUDA."""
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r}; valid: {', '.join(IMPLS)}")
    if impl == "torch":
        return False
    if impl == "triton":
        if not triton_available():
            raise RuntimeError("impl='triton' but triton is not installed (pip install triton)")
        return True
    return triton_available() and all(t.is_cuda for t in tensors)


def _pow2(n: int, floor: int = 16) -> int:
    return max(floor, 1 << max(0, math.ceil(math.log2(max(n, 1)))))


# ------------------------------------------------------------------------------------------ window statistics
def window_stats(
    queries: torch.Tensor,
    keys: torch.Tensor,
    scaling: float,
    *,
    eps: float = reference.ENTROPY_EPS,
    impl: str = "auto",
    chunk: int = 4096,
) -> WindowStats:
    """Fused observation-window scoring: reductions of ``softmax(q k^T * scaling)`` without the ``W x S`` matrix.

    Parameters
    ----------
    queries:
        ``[H_q, W, D]`` post-RoPE window queries; query ``i`` sits at position ``S - W + i`` (causal in the window).
    keys:
        ``[H, S, D]``; ``H`` divides ``H_q`` (consecutive query heads share a key head).
    scaling:
        Logit scale (``D ** -0.5``, or a method's own temperature, e.g. AhaKV's).
    eps:
        The ``eps`` of the column entropy ``-sum A log(A + eps)`` (CAKE uses 1e-10).
    impl:
        ``auto`` / ``triton`` / ``torch`` (see module docstring).
    chunk:
        Keys per block of the torch path: its peak extra memory is ``H_q x W x chunk`` floats.

    Returns
    -------
    :class:`~kernels.stats.WindowStats` (float32 ``[H_q, S]`` column and ``[H_q, W]`` row statistics).
    """
    num_q, window, dim = queries.shape
    num_heads, length, key_dim = keys.shape
    if key_dim != dim or num_q % num_heads:
        raise ValueError(f"queries {tuple(queries.shape)} do not match keys {tuple(keys.shape)}")
    if window > length:
        raise ValueError(f"window {window} longer than the {length} keys")
    if use_triton(impl, queries, keys):
        return _window_stats_triton(queries, keys, scaling, eps)
    return _window_stats_torch(queries, keys, scaling, eps, chunk)


def _window_logits(grouped: torch.Tensor, keys: torch.Tensor, start: int, stop: int, scaling: float, window: int):
    """Scaled, causally masked logits ``[H_q, W, stop-start]`` float32 for keys ``start:stop``."""
    num_heads = keys.shape[0]
    block = keys[:, start:stop].float()
    logits = torch.bmm(grouped, block.transpose(1, 2)) * scaling  # [H, G*W, c]
    logits = logits.reshape(-1, window, stop - start)
    length = keys.shape[1]
    cols = torch.arange(start, stop, device=keys.device)
    limit = torch.arange(length - window, length, device=keys.device)
    valid = cols[None, :] <= limit[:, None]  # [W, c]
    del num_heads
    return logits.masked_fill(~valid[None], float("-inf")), valid


def _window_stats_torch(queries: torch.Tensor, keys: torch.Tensor, scaling: float, eps: float, chunk: int):
    """Two passes over key chunks: online log-sum-exp per row, then column reductions."""
    num_q, window, dim = queries.shape
    num_heads, length, _ = keys.shape
    grouped = queries.float().reshape(num_heads, (num_q // num_heads) * window, dim)
    device = queries.device
    row_max = torch.full((num_q, window), float("-inf"), device=device)
    row_sum = torch.zeros((num_q, window), device=device)
    row_dot = torch.zeros((num_q, window), device=device)  # sum exp(l - m) * l
    for start in range(0, length, chunk):
        stop = min(start + chunk, length)
        logits, valid = _window_logits(grouped, keys, start, stop, scaling, window)
        new_max = torch.maximum(row_max, logits.amax(dim=-1))
        alpha = torch.where(torch.isinf(row_max), 0.0, torch.exp(row_max - new_max))
        probs = torch.exp(logits - new_max[..., None])  # masked -> 0 (new_max is finite after chunk 0)
        row_sum = row_sum * alpha + probs.sum(dim=-1)
        row_dot = row_dot * alpha + (probs * logits.masked_fill(~valid[None], 0.0)).sum(dim=-1)
        row_max = new_max
    lse = row_max + torch.log(row_sum)
    row_entropy = lse - row_dot / row_sum
    col_sum = torch.empty((num_q, length), device=device)
    col_sq, col_max, col_ent = torch.empty_like(col_sum), torch.empty_like(col_sum), torch.empty_like(col_sum)
    for start in range(0, length, chunk):
        stop = min(start + chunk, length)
        logits, _ = _window_logits(grouped, keys, start, stop, scaling, window)
        probs = torch.exp(logits - lse[..., None])
        col_sum[:, start:stop] = probs.sum(dim=1)
        col_sq[:, start:stop] = (probs * probs).sum(dim=1)
        col_max[:, start:stop] = probs.amax(dim=1)
        col_ent[:, start:stop] = -(probs * torch.log(probs + eps)).sum(dim=1)
    return WindowStats(col_sum, col_sq, col_max, col_ent, lse, row_entropy, window)


# ------------------------------------------------------------------------------------------ all-rows column sums
def causal_column_sums(
    queries: torch.Tensor,
    keys: torch.Tensor,
    scaling: float,
    *,
    prob_dtype: torch.dtype | None = None,
    max_block_bytes: int = 64 << 20,
) -> torch.Tensor:
    """Attention each key receives from every query of a causal prefill: column sums of ``softmax(q k^T)``.

    H2O's prefill score, without the ``S x S`` matrix: query rows are processed in blocks of ``b`` rows, each
    against the keys it may see, so the peak extra memory is two ``H_q x b x S`` float32 blocks (logits and
    probabilities; ``b`` chosen so one block fits ``max_block_bytes``).

    Parameters
    ----------
    queries:
        ``[H_q, S, D]`` post-RoPE queries of the prompt; query ``i`` sits at position ``i``.
    keys:
        ``[H, S, D]``; ``H`` divides ``H_q`` (consecutive query heads share a key head).
    scaling:
        Logit scale.
    prob_dtype:
        When given, each probability is rounded to this dtype before it is summed (the reference code casts its
        float32 softmax to the model dtype); the sums themselves stay float32.

    Returns
    -------
    ``[H_q, S]`` float32 column sums (column ``j`` sums rows ``j .. S-1``).
    """
    num_q, length, dim = queries.shape
    num_heads, key_length, key_dim = keys.shape
    if key_dim != dim or num_q % num_heads or key_length != length:
        raise ValueError(f"queries {tuple(queries.shape)} do not match keys {tuple(keys.shape)}")
    groups = num_q // num_heads
    rows_per_block = max(1, max_block_bytes // max(1, num_q * length * 4))
    keys32 = keys.float()
    sums = torch.zeros((num_q, length), device=queries.device, dtype=torch.float32)
    for start in range(0, length, rows_per_block):
        stop = min(start + rows_per_block, length)
        rows = stop - start
        block = queries[:, start:stop].float().reshape(num_heads, groups * rows, dim)
        logits = torch.bmm(block, keys32[:, :stop].transpose(1, 2)).reshape(num_q, rows, stop)
        positions = torch.arange(stop, device=queries.device)
        future = positions[None, :] > positions[start:stop, None]  # [rows, stop]
        logits.mul_(scaling).masked_fill_(future[None], float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        del logits  # at most two blocks alive: logits and probabilities
        if prob_dtype is not None:
            probs = probs.to(prob_dtype).float()
        sums[:, :stop] += probs.sum(dim=1)
    return sums


def _window_stats_triton(queries: torch.Tensor, keys: torch.Tensor, scaling: float, eps: float) -> WindowStats:
    from kernels import triton_kernels as tk

    queries = queries.contiguous()
    keys = keys.contiguous()
    num_q, window, dim = queries.shape
    num_heads, length, _ = keys.shape
    device = queries.device
    lse = torch.empty((num_q, window), device=device, dtype=torch.float32)
    row_entropy = torch.empty_like(lse)
    col = [torch.empty((num_q, length), device=device, dtype=torch.float32) for _ in range(4)]
    block_w, block_d, block_s = _pow2(window), _pow2(dim), 64
    common = dict(BLOCK_W=block_w, BLOCK_S=block_s, BLOCK_D=block_d)
    strides = (queries.stride(0), queries.stride(1), keys.stride(0), keys.stride(1))
    groups = num_q // num_heads
    tk._window_rows_kernel[(num_q,)](
        queries, keys, lse, row_entropy, window, length, dim, groups, float(scaling), *strides, **common
    )
    tk._window_cols_kernel[(num_q, triton_cdiv(length, block_s))](
        queries, keys, lse, *col, window, length, dim, groups, float(scaling), float(eps), *strides, **common
    )
    return WindowStats(col[0], col[1], col[2], col[3], lse, row_entropy, window)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ------------------------------------------------------------------------------------------ paged storage
def paged_append(
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    pos_pool: torch.Tensor,
    new_k: torch.Tensor,
    new_v: torch.Tensor,
    block_table: torch.Tensor,
    lengths: torch.Tensor,
    start_position: int,
    page_size: int,
    *,
    impl: str = "auto",
) -> None:
    """Append ``q`` tokens to every head of a paged layer, in place: ``O(H * q * D)`` work, independent of the
    number of tokens already stored.  Shapes as in :func:`kernels.reference.paged_append_reference`
    (pools ``[N_slots, D]`` contiguous, ``new_k``/``new_v`` ``[H, q, D]``, block table ``[H, max_pages]`` int32,
    ``lengths`` ``[H]`` int32 before the append; the caller allocates pages and then advances ``lengths``)."""
    if not use_triton(impl, k_pool, new_k):
        reference.paged_append_reference(
            k_pool, v_pool, pos_pool, new_k, new_v, block_table, lengths, start_position, page_size
        )
        return
    from kernels import triton_kernels as tk

    num_heads, new_tokens, dim = new_k.shape
    if new_k.stride(-1) != 1 or new_v.stride(-1) != 1:
        new_k, new_v = new_k.contiguous(), new_v.contiguous()
    tk._paged_append_kernel[(new_tokens, num_heads)](
        k_pool, v_pool, pos_pool, new_k, new_v, block_table, lengths,
        int(start_position), int(page_size), dim,
        new_k.stride(0), new_k.stride(1), new_v.stride(0), new_v.stride(1), block_table.stride(0),
        BLOCK_D=_pow2(dim, 1),
    )  # fmt: skip


def copy_rows(
    src_k: torch.Tensor,
    src_v: torch.Tensor,
    src_slots: torch.Tensor,
    dst_k: torch.Tensor,
    dst_v: torch.Tensor,
    dst_slots: torch.Tensor,
    *,
    impl: str = "auto",
) -> None:
    """Compaction primitive: ``dst[dst_slots] = src[src_slots]`` for K and V pools ``[N, D]`` (rows ``R``)."""
    if src_slots.numel() == 0:
        return
    if not use_triton(impl, src_k, dst_k):
        reference.copy_rows_reference(src_k, src_v, src_slots, dst_k, dst_v, dst_slots)
        return
    from kernels import triton_kernels as tk

    dim = src_k.shape[-1]
    tk._copy_rows_kernel[(src_slots.numel(),)](
        src_k, src_v, src_slots.contiguous(), dst_k, dst_v, dst_slots.contiguous(), dim, BLOCK_D=_pow2(dim, 1)
    )


def paged_decode_attention(
    query: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_table: torch.Tensor,
    lengths: torch.Tensor,
    scaling: float,
    page_size: int,
    max_length: int,
    *,
    impl: str = "auto",
    chunk: int = 1024,
) -> torch.Tensor:
    """Decode attention (one new token) over per-head paged KV: ``[H, G, D]`` queries -> ``[H, G, D]`` output.

    The Triton path is split-K (flash-decoding): ``ceil(max_length / chunk)`` programs per head, partials merged
    here.  ``max_length`` is the longest head (a host int, so no device sync is needed).
    """
    if not use_triton(impl, query, k_pool):
        return reference.paged_decode_attention_reference(
            query, k_pool, v_pool, block_table, lengths, scaling, page_size
        )
    from kernels import triton_kernels as tk

    query = query.contiguous()
    num_heads, groups, dim = query.shape
    splits = max(1, triton_cdiv(max_length, chunk))
    device = query.device
    part_m = torch.empty((num_heads, splits, groups), device=device, dtype=torch.float32)
    part_l = torch.empty_like(part_m)
    part_acc = torch.empty((num_heads, splits, groups, dim), device=device, dtype=torch.float32)
    tk._paged_decode_kernel[(num_heads, splits)](
        query, k_pool, v_pool, block_table, lengths, part_m, part_l, part_acc,
        groups, dim, int(page_size), int(chunk), splits, float(scaling), block_table.stride(0),
        BLOCK_G=_pow2(groups), BLOCK_N=32, BLOCK_D=_pow2(dim),
    )  # fmt: skip
    top = part_m.amax(dim=1, keepdim=True)
    weight = torch.exp(part_m - top)  # [H, splits, G]
    total = (part_l * weight).sum(dim=1)  # [H, G]
    out = (part_acc * weight[..., None]).sum(dim=1) / total[..., None]
    return out.to(query.dtype)
