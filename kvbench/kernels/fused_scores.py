"""Attention-score reductions for the eviction methods, without materialising the attention matrix.

* :func:`window_stats` -- column and row statistics of the observation window's attention (``W`` rows).
* :func:`causal_column_sums` -- the attention each key receives from ``R`` causal query rows (H2O's all-rows scores,
  ``R = S``; a prefill chunk's rows when the prefill is fed in chunks).

Both take the same options: ``logit_dtype`` rounds the logits as the reference code's ``matmul(q, k^T) / sqrt(d)``
in bf16/fp16 does (the product ``q k^T`` rounded to the dtype, then the scaled logit, then its product with
``row_scale``), ``prob_dtype`` rounds every probability to the model dtype before it is reduced (the reference code
casts its float32 softmax to bf16/fp16 and reduces in that dtype), ``row_scale`` multiplies each row's scaled
logits (AhaKV's step-gain softmax).  The rounding is elementwise, in place on the blocks: it adds no memory.
Implementations (``impl``): ``triton`` (two-pass kernels from the rows' log-sum-exp; CUDA, or CPU tensors under
``TRITON_INTERPRET=1``), ``torch`` (the same two passes over key chunks / row blocks: bounded extra memory),
``dense`` (the materialising reference of :mod:`kvbench.kernels.reference`, for comparisons),
``auto`` (Triton on CUDA tensors when installed, else torch).

Shapes: ``H_q`` query heads, ``H`` key heads (``H`` divides ``H_q``; consecutive query heads share a key head),
``W`` / ``R`` query rows, ``S`` keys, ``D`` head dim.  Query row ``r`` of ``R`` sits at position ``S - R + r``
(bottom-right causal).
"""

from __future__ import annotations

import torch

from kvbench.kernels import reference
from kvbench.kernels.ops import pow2, triton_cdiv, use_triton
from kvbench.kernels.stats import WindowStats

SCORING_IMPLS = ("auto", "triton", "torch", "dense")

#: Rounding codes of the Triton kernels (``ROUND`` constexpr).
_ROUND_CODES = {None: 0, torch.bfloat16: 1, torch.float16: 2}


def _rounding_code(prob_dtype: torch.dtype | None) -> int:
    if prob_dtype in (torch.float32, torch.float64):
        return 0
    if prob_dtype not in _ROUND_CODES:
        raise ValueError(f"prob_dtype={prob_dtype}; valid: None, torch.bfloat16, torch.float16, torch.float32")
    return _ROUND_CODES[prob_dtype]


def _resolve(impl: str, *tensors: torch.Tensor) -> str:
    """``dense`` / ``triton`` / ``torch`` for ``impl`` (``auto`` -> Triton on CUDA tensors when installed)."""
    if impl == "dense":
        return "dense"
    if impl not in SCORING_IMPLS:
        raise ValueError(f"impl={impl!r}; valid: {', '.join(SCORING_IMPLS)}")
    return "triton" if use_triton(impl, *tensors) else "torch"


def _check_shapes(queries: torch.Tensor, keys: torch.Tensor, row_scale: torch.Tensor | None) -> None:
    num_q, rows, dim = queries.shape
    num_heads, length, key_dim = keys.shape
    if key_dim != dim or num_q % num_heads:
        raise ValueError(f"queries {tuple(queries.shape)} do not match keys {tuple(keys.shape)}")
    if rows > length:
        raise ValueError(f"{rows} query rows but only {length} keys (row r sits at position S - R + r)")
    if row_scale is not None and tuple(row_scale.shape) != (rows,):
        raise ValueError(f"row_scale has shape {tuple(row_scale.shape)}, expected ({rows},)")


# ------------------------------------------------------------------------------------------ window statistics
def window_stats(
    queries: torch.Tensor,
    keys: torch.Tensor,
    scaling: float,
    *,
    eps: float = reference.ENTROPY_EPS,
    prob_dtype: torch.dtype | None = None,
    row_scale: torch.Tensor | None = None,
    impl: str = "auto",
    chunk: int = 2048,
    logit_dtype: torch.dtype | None = None,
) -> WindowStats:
    """Fused observation-window scoring: reductions of ``softmax(q k^T * scaling)`` without the ``W x S`` matrix.

    Parameters
    ----------
    queries:
        ``[H_q, W, D]`` post-RoPE window queries; query ``i`` sits at position ``S - W + i`` (causal in the window).
    keys:
        ``[H, S, D]``.
    scaling:
        Logit scale (``D ** -0.5``).
    eps:
        The ``eps`` of the column entropy ``-sum A log(A + eps)`` (CAKE uses 1e-10).
    prob_dtype:
        Round each probability to this dtype before the column statistics (module docstring); ``None`` = float32.
    logit_dtype:
        Round the logits to this dtype after each op (module docstring); ``None`` = float32 logits.
    row_scale:
        ``[W]`` factor on each row's scaled logits, or ``None``.
    impl:
        ``auto`` / ``triton`` / ``torch`` / ``dense`` (module docstring).
    chunk:
        Keys per block of the torch path: its peak extra memory is a few ``H_q x W x chunk`` float32 blocks.

    Returns
    -------
    :class:`~kvbench.kernels.stats.WindowStats` (float32 ``[H_q, S]`` column and ``[H_q, W]`` row statistics).
    """
    _check_shapes(queries, keys, row_scale)
    code, logit_code = _rounding_code(prob_dtype), _rounding_code(logit_dtype)
    which = _resolve(impl, queries, keys)
    if which == "dense":
        return reference.window_stats_reference(queries, keys, scaling, eps, prob_dtype, row_scale, logit_dtype)
    if which == "triton":
        return _window_stats_triton(queries, keys, scaling, eps, code, row_scale, logit_code)
    return _window_stats_torch(queries, keys, scaling, eps, prob_dtype, row_scale, chunk, logit_dtype)


def _round_(values: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """Round float32 ``values`` to ``dtype`` and back, in place (no-op for ``None``)."""
    if dtype is not None and dtype not in (torch.float32, torch.float64):
        values.copy_(values.to(dtype))
    return values


def _block_logits(
    grouped: torch.Tensor, keys: torch.Tensor, start: int, stop: int, scaling: float, positions: torch.Tensor,
    scale: torch.Tensor | None, logit_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Scaled, causally masked float32 logits ``[H_q, R, stop-start]`` of keys ``start:stop`` and the validity mask.

    ``grouped`` is ``[H, G*R, D]`` float32 queries, ``positions`` ``[R]`` the rows' positions, ``scale`` ``[R]``;
    ``logit_dtype`` rounds the product, the scaled logit and its product with ``scale`` (module docstring).
    """
    rows = positions.shape[0]
    logits = _round_(torch.bmm(grouped, keys[:, start:stop].float().transpose(1, 2)), logit_dtype)
    logits = _round_(logits.mul_(scaling), logit_dtype).reshape(-1, rows, stop - start)
    if scale is not None:
        logits = _round_(logits.mul_(scale[None, :, None]), logit_dtype)
    cols = torch.arange(start, stop, device=keys.device)
    valid = cols[None, :] <= positions[:, None]  # [R, c]
    return logits.masked_fill(~valid[None], float("-inf")), valid


def _row_softmax_terms(
    grouped: torch.Tensor, keys: torch.Tensor, scaling: float, positions: torch.Tensor, scale: torch.Tensor | None,
    chunk: int, logit_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Pass 1 over key chunks: online log-sum-exp ``[H_q, R]`` per row and the row entropy ``lse - sum p l``."""
    rows = positions.shape[0]
    shape = (grouped.shape[0] * grouped.shape[1] // rows, rows)
    row_max = torch.full(shape, float("-inf"), device=keys.device)
    row_sum = torch.zeros(shape, device=keys.device)
    row_dot = torch.zeros(shape, device=keys.device)  # sum exp(l - m) * l
    for start in range(0, keys.shape[1], chunk):
        stop = min(start + chunk, keys.shape[1])
        logits, valid = _block_logits(grouped, keys, start, stop, scaling, positions, scale, logit_dtype)
        new_max = torch.maximum(row_max, logits.amax(dim=-1))
        alpha = torch.where(torch.isinf(row_max), 0.0, torch.exp(row_max - new_max))
        probs = torch.exp(logits - new_max[..., None])  # masked -> 0 (every row sees key 0: finite after chunk 0)
        row_sum = row_sum * alpha + probs.sum(dim=-1)
        row_dot = row_dot * alpha + (probs * logits.masked_fill(~valid[None], 0.0)).sum(dim=-1)
        row_max = new_max
    lse = row_max + torch.log(row_sum)
    return lse, lse - row_dot / row_sum


def _window_stats_torch(
    queries: torch.Tensor, keys: torch.Tensor, scaling: float, eps: float, prob_dtype: torch.dtype | None,
    row_scale: torch.Tensor | None, chunk: int, logit_dtype: torch.dtype | None = None,
) -> WindowStats:  # fmt: skip
    """Two passes over key chunks: online log-sum-exp per row, then column reductions of the recomputed block."""
    num_q, window, dim = queries.shape
    num_heads, length, _ = keys.shape
    grouped = queries.float().reshape(num_heads, (num_q // num_heads) * window, dim)
    positions = torch.arange(length - window, length, device=keys.device)
    scale = row_scale.float().to(keys.device) if row_scale is not None else None
    lse, row_entropy = _row_softmax_terms(grouped, keys, scaling, positions, scale, chunk, logit_dtype)
    col_sum = torch.empty((num_q, length), device=keys.device)
    col_m2, col_max, col_ent = torch.empty_like(col_sum), torch.empty_like(col_sum), torch.empty_like(col_sum)
    for start in range(0, length, chunk):
        stop = min(start + chunk, length)
        logits, _ = _block_logits(grouped, keys, start, stop, scaling, positions, scale, logit_dtype)
        probs = reference.round_probs(torch.exp(logits - lse[..., None]), prob_dtype)
        del logits
        sums = probs.sum(dim=1)
        col_sum[:, start:stop] = sums
        col_m2[:, start:stop] = ((probs - (sums / window)[:, None]) ** 2).sum(dim=1)
        col_max[:, start:stop] = probs.amax(dim=1)
        col_ent[:, start:stop] = -(probs * torch.log(probs + eps)).sum(dim=1)
    return WindowStats(col_sum, col_m2, col_max, col_ent, lse, row_entropy, window)


def _window_stats_triton(
    queries: torch.Tensor, keys: torch.Tensor, scaling: float, eps: float, code: int, row_scale: torch.Tensor | None,
    logit_code: int = 0,
) -> WindowStats:  # fmt: skip
    from kvbench.kernels import triton_kernels as tk

    queries, keys = queries.contiguous(), keys.contiguous()
    num_q, window, dim = queries.shape
    num_heads, length, _ = keys.shape
    device = queries.device
    lse = torch.empty((num_q, window), device=device, dtype=torch.float32)
    row_entropy = torch.empty_like(lse)
    col = [torch.empty((num_q, length), device=device, dtype=torch.float32) for _ in range(4)]
    scale = row_scale.float().contiguous().to(device) if row_scale is not None else lse  # dummy pointer when unused
    blocks = dict(BLOCK_S=64, BLOCK_D=pow2(dim), HAS_SCALE=row_scale is not None, LOGIT_ROUND=logit_code)
    strides = (queries.stride(0), queries.stride(1), keys.stride(0), keys.stride(1))
    groups = num_q // num_heads
    tk._rows_lse_kernel[(num_q, 1)](
        queries, keys, scale, lse, row_entropy, window, length, dim, groups, float(scaling), *strides,
        BLOCK_R=pow2(window), ENTROPY=True, **blocks,
    )  # fmt: skip
    tk._window_cols_kernel[(num_q, triton_cdiv(length, 64))](
        queries, keys, scale, lse, *col, window, length, dim, groups, float(scaling), float(eps), *strides,
        BLOCK_W=pow2(window), ROUND=code, **blocks,
    )  # fmt: skip
    return WindowStats(col[0], col[1], col[2], col[3], lse, row_entropy, window)


# ------------------------------------------------------------------------------------------ all-rows column sums
def causal_column_sums(
    queries: torch.Tensor,
    keys: torch.Tensor,
    scaling: float,
    *,
    prob_dtype: torch.dtype | None = None,
    row_scale: torch.Tensor | None = None,
    impl: str = "auto",
    max_block_bytes: int = 64 << 20,
    logit_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Attention each key receives from every causal query row: column sums of ``softmax(q k^T * scaling)``.

    H2O's prefill score (``R = S``), or one prefill chunk's share of it (``R`` rows at the end of the ``S`` keys
    stored so far).  Never the ``R x S`` matrix: the torch path takes query rows in blocks of ``b`` rows against
    the keys they may see (extra memory: a float32 copy of the keys and a few float32 ``H_q x b x S`` blocks, ``b``
    chosen so one fits ``max_block_bytes``); the Triton path is two passes, the rows' log-sum-exp then the column
    sums from it, over ``64 x 64`` tiles (extra memory: the ``H_q x R`` log-sum-exps).

    Parameters
    ----------
    queries:
        ``[H_q, R, D]`` post-RoPE queries; row ``r`` sits at position ``S - R + r``.
    keys:
        ``[H, S, D]``.
    scaling:
        Logit scale.
    prob_dtype:
        When given, each probability is rounded to this dtype before it is summed (the reference code casts its
        float32 softmax to the model dtype); the sums themselves stay float32.
    logit_dtype:
        Round the logits to this dtype after each op (module docstring); ``None`` = float32 logits.
    row_scale:
        ``[R]`` factor on each row's scaled logits, or ``None``.
    impl:
        ``auto`` / ``triton`` / ``torch`` / ``dense`` (module docstring).

    Returns
    -------
    ``[H_q, S]`` float32 column sums (column ``j`` sums the rows at positions ``>= j``).
    """
    _check_shapes(queries, keys, row_scale)
    code, logit_code = _rounding_code(prob_dtype), _rounding_code(logit_dtype)
    which = _resolve(impl, queries, keys)
    if which == "dense":
        return reference.causal_column_sums_reference(queries, keys, scaling, prob_dtype, row_scale, logit_dtype)
    if which == "triton":
        return _column_sums_triton(queries, keys, scaling, code, row_scale, logit_code)
    return _column_sums_torch(queries, keys, scaling, prob_dtype, row_scale, max_block_bytes, logit_dtype)


def _column_sums_torch(
    queries: torch.Tensor, keys: torch.Tensor, scaling: float, prob_dtype: torch.dtype | None,
    row_scale: torch.Tensor | None, max_block_bytes: int, logit_dtype: torch.dtype | None = None,
) -> torch.Tensor:  # fmt: skip
    num_q, rows, dim = queries.shape
    num_heads, length, _ = keys.shape
    groups = num_q // num_heads
    offset = length - rows  # row r sits at position offset + r
    device = queries.device
    rows_per_block = max(1, max_block_bytes // max(1, num_q * length * 4))
    keys32 = keys.float()  # once: converting per row block would copy the keys S / rows_per_block times
    sums = torch.zeros((num_q, length), device=device, dtype=torch.float32)
    for start in range(0, rows, rows_per_block):
        stop = min(start + rows_per_block, rows)
        count, visible = stop - start, offset + stop
        block = queries[:, start:stop].float().reshape(num_heads, groups * count, dim)
        logits = _round_(torch.bmm(block, keys32[:, :visible].transpose(1, 2)), logit_dtype)
        logits = _round_(logits.view(num_q, count, visible).mul_(scaling), logit_dtype)
        if row_scale is not None:
            _round_(logits.mul_(row_scale[start:stop].float().to(device)[None, :, None]), logit_dtype)
        positions = torch.arange(visible, device=device)
        future = positions[None, :] > positions[offset + start : offset + stop, None]  # [count, visible]
        logits.masked_fill_(future[None], float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        del logits  # at most two blocks alive: logits and probabilities
        sums[:, :visible] += reference.round_probs(probs, prob_dtype).sum(dim=1)
    return sums


def _column_sums_triton(
    queries: torch.Tensor, keys: torch.Tensor, scaling: float, code: int, row_scale: torch.Tensor | None,
    logit_code: int = 0,
) -> torch.Tensor:  # fmt: skip
    from kvbench.kernels import triton_kernels as tk

    queries, keys = queries.contiguous(), keys.contiguous()
    num_q, rows, dim = queries.shape
    num_heads, length, _ = keys.shape
    device = queries.device
    lse = torch.empty((num_q, rows), device=device, dtype=torch.float32)
    sums = torch.empty((num_q, length), device=device, dtype=torch.float32)
    scale = row_scale.float().contiguous().to(device) if row_scale is not None else lse  # dummy pointer when unused
    blocks = dict(BLOCK_R=64, BLOCK_S=64, BLOCK_D=pow2(dim), HAS_SCALE=row_scale is not None, LOGIT_ROUND=logit_code)
    strides = (queries.stride(0), queries.stride(1), keys.stride(0), keys.stride(1))
    groups = num_q // num_heads
    tk._rows_lse_kernel[(num_q, triton_cdiv(rows, 64))](
        queries, keys, scale, lse, lse, rows, length, dim, groups, float(scaling), *strides, ENTROPY=False, **blocks
    )
    tk._causal_cols_kernel[(num_q, triton_cdiv(length, 64))](
        queries, keys, scale, lse, sums, rows, length, dim, groups, float(scaling), *strides, ROUND=code, **blocks
    )
    return sums
