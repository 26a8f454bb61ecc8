"""Dispatchers: each op runs its Triton kernel on CUDA tensors when Triton is installed, and a pure-torch
implementation otherwise (CPU, or ``impl="torch"``).  ``impl="triton"`` forces the kernel (CPU tensors work under
``TRITON_INTERPRET=1``, which is how the tests run them without a GPU).
"""

from __future__ import annotations

import functools
import math

import torch

from kvbench.kernels import reference

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


#: ``tl.dot`` needs at least 16 rows: the decode kernel uses it only for GQA groups this large.
DOT_MIN_ROWS = 16


def pow2(n: int, floor: int = 16) -> int:
    """The smallest power of two >= ``n`` and >= ``floor`` (Triton block sizes)."""
    return max(floor, 1 << max(0, math.ceil(math.log2(max(n, 1)))))


def triton_cdiv(a: int, b: int) -> int:
    """Ceil division (Triton grid sizes)."""
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
    number of tokens already stored.  Shapes as in :func:`kvbench.kernels.reference.paged_append_reference`
    (pools ``[N_slots, D]`` contiguous, ``new_k``/``new_v`` ``[H, q, D]``, block table ``[H, max_pages]`` int32,
    ``lengths`` ``[H]`` int32 before the append; the caller allocates pages and then advances ``lengths``)."""
    if not use_triton(impl, k_pool, new_k):
        reference.paged_append_reference(
            k_pool, v_pool, pos_pool, new_k, new_v, block_table, lengths, start_position, page_size
        )
        return
    from kvbench.kernels import triton_kernels as tk

    num_heads, new_tokens, dim = new_k.shape
    if new_k.stride(-1) != 1 or new_v.stride(-1) != 1:
        new_k, new_v = new_k.contiguous(), new_v.contiguous()
    tk._paged_append_kernel[(new_tokens, num_heads)](
        k_pool, v_pool, pos_pool, new_k, new_v, block_table, lengths,
        int(start_position), int(page_size), dim,
        new_k.stride(0), new_k.stride(1), new_v.stride(0), new_v.stride(1), block_table.stride(0),
        BLOCK_D=pow2(dim, 1),
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
    from kvbench.kernels import triton_kernels as tk

    dim = src_k.shape[-1]
    tk._copy_rows_kernel[(src_slots.numel(),)](
        src_k, src_v, src_slots.contiguous(), dst_k, dst_v, dst_slots.contiguous(), dim, BLOCK_D=pow2(dim, 1)
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
    from kvbench.kernels import triton_kernels as tk

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
        BLOCK_G=pow2(groups, 1), BLOCK_N=32, BLOCK_D=pow2(dim), USE_DOT=groups >= DOT_MIN_ROWS,
    )  # fmt: skip
    top = part_m.amax(dim=1, keepdim=True)
    weight = torch.exp(part_m - top)  # [H, splits, G]
    total = (part_l * weight).sum(dim=1)  # [H, G]
    out = (part_acc * weight[..., None]).sum(dim=1) / total[..., None]
    return out.to(query.dtype)
