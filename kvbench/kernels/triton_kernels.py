"""Triton kernels (imported only when ``triton`` is installed).

Every kernel has a pure-torch reference in :mod:`kvbench.kernels.reference`; ``tests/kernels/test_kernels.py`` runs
both under ``TRITON_INTERPRET=1`` (CPU tensors), so CI without a GPU checks them.  Inputs must be contiguous where
noted.
"""

from __future__ import annotations

import triton
import triton.language as tl

NEG_BIG = -1.0e30


# ------------------------------------------------------------------------------------------ attention scores
@triton.jit
def _round_probs(p, ROUND: tl.constexpr):
    """Round float32 values (probabilities, logits) to bf16 (``ROUND`` 1) or fp16 (2) and back, to nearest even as
    torch's cast.

    bf16 is rounded with integer arithmetic on the bits (the interpreter's float cast truncates): adding
    ``0x7FFF`` plus the kept lowest bit rounds the magnitude, whatever the sign; ``p`` is finite.
    """
    if ROUND == 1:
        bits = p.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        p = bits.to(tl.float32, bitcast=True)
    elif ROUND == 2:
        p = p.to(tl.float16).to(tl.float32)
    return p


@triton.jit
def _load_tile(ptr, index, dims, count, D, stride):
    """Rows ``index`` (``< count``) x columns ``dims`` (``< D``) of a row-major ``[count, D]`` slab, as float32."""
    mask = (index[:, None] < count) & (dims[None, :] < D)
    return tl.load(ptr + index[:, None] * stride + dims[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _scaled_logits(q, k, scaling, scale_ptr, rows, R, HAS_SCALE: tl.constexpr, LOGIT_ROUND: tl.constexpr):
    """``q k^T * scaling`` (float32, IEEE), times each row's factor when ``HAS_SCALE``; with ``LOGIT_ROUND`` (codes
    of :func:`_round_probs`) each op's result is rounded to the model dtype, as the reference's dtype matmul."""
    logits = _round_probs(tl.dot(q, tl.trans(k), input_precision="ieee"), LOGIT_ROUND)
    logits = _round_probs(logits * scaling, LOGIT_ROUND)
    if HAS_SCALE:
        factor = tl.load(scale_ptr + rows, mask=rows < R, other=1.0)
        logits = _round_probs(logits * factor[:, None], LOGIT_ROUND)
    return logits


@triton.jit
def _rows_lse_kernel(
    q_ptr, k_ptr, scale_ptr, lse_ptr, ent_ptr,
    R, S, D, groups, scaling,
    sq_h, sq_r, sk_h, sk_s,
    BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, HAS_SCALE: tl.constexpr,
    ENTROPY: tl.constexpr, LOGIT_ROUND: tl.constexpr,
):  # fmt: skip
    """Pass 1, one program per (query head, row block): each row's online log-sum-exp over the keys it may see
    (row ``r`` sits at position ``S - R + r``), and with ``ENTROPY`` its entropy ``lse - sum p l``."""
    hq = tl.program_id(0)
    block = tl.program_id(1)
    hk = hq // groups
    rows = block * BLOCK_R + tl.arange(0, BLOCK_R)
    dims = tl.arange(0, BLOCK_D)
    q = _load_tile(q_ptr + hq * sq_h, rows, dims, R, D, sq_r)
    m = tl.full((BLOCK_R,), NEG_BIG, tl.float32)
    s = tl.zeros((BLOCK_R,), tl.float32)
    t = tl.zeros((BLOCK_R,), tl.float32)
    limit = S - R + rows  # last key each row may see
    visible = tl.minimum(S, S - R + (block + 1) * BLOCK_R)  # keys seen by the block's last row
    for start in range(0, visible, BLOCK_S):
        cols = start + tl.arange(0, BLOCK_S)
        k = _load_tile(k_ptr + hk * sk_h, cols, dims, S, D, sk_s)
        logits = _scaled_logits(q, k, scaling, scale_ptr, rows, R, HAS_SCALE, LOGIT_ROUND)
        valid = (cols[None, :] < S) & (cols[None, :] <= limit[:, None]) & (rows[:, None] < R)
        logits = tl.where(valid, logits, NEG_BIG)
        m_new = tl.maximum(m, tl.max(logits, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.where(valid, tl.exp(logits - m_new[:, None]), 0.0)
        s = s * alpha + tl.sum(p, axis=1)
        if ENTROPY:
            t = t * alpha + tl.sum(p * tl.where(valid, logits, 0.0), axis=1)
        m = m_new
    s = tl.where(rows < R, s, 1.0)  # padded rows: keep the arithmetic finite
    lse = m + tl.log(s)
    tl.store(lse_ptr + hq * R + rows, lse, mask=rows < R)
    if ENTROPY:
        tl.store(ent_ptr + hq * R + rows, lse - t / s, mask=rows < R)


@triton.jit
def _window_cols_kernel(
    q_ptr, k_ptr, scale_ptr, lse_ptr, sum_ptr, m2_ptr, max_ptr, colent_ptr,
    W, S, D, groups, scaling, eps,
    sq_h, sq_w, sk_h, sk_s,
    BLOCK_W: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, HAS_SCALE: tl.constexpr,
    ROUND: tl.constexpr, LOGIT_ROUND: tl.constexpr,
):  # fmt: skip
    """Pass 2 of the window statistics, one program per (query head, key block): recompute the (rounded)
    probabilities of all ``W`` rows, reduce over them: sum, centred sum of squares (two-pass: every row is in the
    block), max, entropy."""
    hq = tl.program_id(0)
    block = tl.program_id(1)
    hk = hq // groups
    rows = tl.arange(0, BLOCK_W)
    dims = tl.arange(0, BLOCK_D)
    cols = block * BLOCK_S + tl.arange(0, BLOCK_S)
    q = _load_tile(q_ptr + hq * sq_h, rows, dims, W, D, sq_w)
    k = _load_tile(k_ptr + hk * sk_h, cols, dims, S, D, sk_s)
    lse = tl.load(lse_ptr + hq * W + rows, mask=rows < W, other=0.0)
    logits = _scaled_logits(q, k, scaling, scale_ptr, rows, W, HAS_SCALE, LOGIT_ROUND)
    valid = (cols[None, :] < S) & (cols[None, :] <= (S - W + rows)[:, None]) & (rows[:, None] < W)
    p = _round_probs(tl.where(valid, tl.exp(logits - lse[:, None]), 0.0), ROUND)
    total = tl.sum(p, axis=0)
    centred = tl.where(rows[:, None] < W, p - (total / W)[None, :], 0.0)
    out = hq * S + cols
    keep = cols < S
    tl.store(sum_ptr + out, total, mask=keep)
    tl.store(m2_ptr + out, tl.sum(centred * centred, axis=0), mask=keep)
    tl.store(max_ptr + out, tl.max(p, axis=0), mask=keep)
    tl.store(colent_ptr + out, -tl.sum(p * tl.log(p + eps), axis=0), mask=keep)


@triton.jit
def _causal_cols_kernel(
    q_ptr, k_ptr, scale_ptr, lse_ptr, sum_ptr,
    R, S, D, groups, scaling,
    sq_h, sq_r, sk_h, sk_s,
    BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, HAS_SCALE: tl.constexpr,
    ROUND: tl.constexpr, LOGIT_ROUND: tl.constexpr,
):  # fmt: skip
    """Pass 2 of the all-rows column sums, one program per (query head, key block): loop over the row blocks that
    may see the block's keys, recompute the (rounded) probabilities from the rows' log-sum-exp, sum them per key."""
    hq = tl.program_id(0)
    block = tl.program_id(1)
    hk = hq // groups
    cols = block * BLOCK_S + tl.arange(0, BLOCK_S)
    dims = tl.arange(0, BLOCK_D)
    k = _load_tile(k_ptr + hk * sk_h, cols, dims, S, D, sk_s)
    acc = tl.zeros((BLOCK_S,), tl.float32)
    first = tl.maximum(block * BLOCK_S - (S - R), 0)  # the first row that sees the block's first key
    for start in range((first // BLOCK_R) * BLOCK_R, R, BLOCK_R):
        rows = start + tl.arange(0, BLOCK_R)
        q = _load_tile(q_ptr + hq * sq_h, rows, dims, R, D, sq_r)
        lse = tl.load(lse_ptr + hq * R + rows, mask=rows < R, other=0.0)
        logits = _scaled_logits(q, k, scaling, scale_ptr, rows, R, HAS_SCALE, LOGIT_ROUND)
        valid = (cols[None, :] < S) & (cols[None, :] <= (S - R + rows)[:, None]) & (rows[:, None] < R)
        acc += tl.sum(_round_probs(tl.where(valid, tl.exp(logits - lse[:, None]), 0.0), ROUND), axis=0)
    tl.store(sum_ptr + hq * S + cols, acc, mask=cols < S)


# ------------------------------------------------------------------------------------------ paged storage
@triton.jit
def _paged_append_kernel(
    k_pool, v_pool, pos_pool, new_k, new_v, block_table, lengths,
    start_position, page_size, D, snk_h, snk_t, snv_h, snv_t, sbt_h,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    """One program per (new token, head) -- tokens on grid axis 0, which has no 65535 limit (a 128K prefill) --
    finds the slot through the block table and writes K, V and the position."""
    tok = tl.program_id(0)
    head = tl.program_id(1)
    dims = tl.arange(0, BLOCK_D)
    index = tl.load(lengths + head) + tok
    page = tl.load(block_table + head * sbt_h + index // page_size)
    slot = page.to(tl.int64) * page_size + index % page_size
    k = tl.load(new_k + head * snk_h + tok * snk_t + dims, mask=dims < D)
    v = tl.load(new_v + head * snv_h + tok * snv_t + dims, mask=dims < D)
    tl.store(k_pool + slot * D + dims, k.to(k_pool.dtype.element_ty), mask=dims < D)
    tl.store(v_pool + slot * D + dims, v.to(v_pool.dtype.element_ty), mask=dims < D)
    tl.store(pos_pool + slot, start_position + tok)


@triton.jit
def _copy_rows_kernel(src_k, src_v, src_slots, dst_k, dst_v, dst_slots, D, BLOCK_D: tl.constexpr):
    """One program per row: ``dst[dst_slots[r]] = src[src_slots[r]]`` for K and V (pools ``[N, D]``)."""
    row = tl.program_id(0)
    dims = tl.arange(0, BLOCK_D)
    src = tl.load(src_slots + row).to(tl.int64)
    dst = tl.load(dst_slots + row).to(tl.int64)
    tl.store(dst_k + dst * D + dims, tl.load(src_k + src * D + dims, mask=dims < D), mask=dims < D)
    tl.store(dst_v + dst * D + dims, tl.load(src_v + src * D + dims, mask=dims < D), mask=dims < D)


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_pool, v_pool, block_table, lengths, m_out, l_out, acc_out,
    G, D, page_size, chunk, num_splits, scaling, sbt_h,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, USE_DOT: tl.constexpr,
):  # fmt: skip
    """Split-K decode attention: program (head, split) covers tokens ``[split*chunk, (split+1)*chunk)`` of the head
    and writes its partial max ``m``, normaliser ``l`` and unnormalised output ``acc`` (combined on the host side).

    ``q_ptr`` is ``[H, G, D]`` contiguous; partials are ``[H, splits, G]`` and ``[H, splits, G, D]`` float32.
    ``BLOCK_G`` is the group rounded up to a power of two (not to 16): below 16 rows (``USE_DOT`` false) ``q k^T``
    and ``p v`` are float32 broadcast products summed over the block, so a GQA group of 4 does 4 rows of work, not 16;
    ``tl.dot`` (float32 IEEE, as the reference) runs from 16 rows up.
    """
    head = tl.program_id(0)
    split = tl.program_id(1)
    groups = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, BLOCK_D)
    q = tl.load(
        q_ptr + head * G * D + groups[:, None] * D + dims[None, :],
        mask=(groups[:, None] < G) & (dims[None, :] < D),
        other=0.0,
    ).to(tl.float32)
    length = tl.load(lengths + head)
    begin = split * chunk
    end = tl.minimum(begin + chunk, length)
    m = tl.full((BLOCK_G,), NEG_BIG, tl.float32)
    s = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), tl.float32)
    for start in range(begin, end, BLOCK_N):
        index = start + tl.arange(0, BLOCK_N)
        inside = index < end
        page = tl.load(block_table + head * sbt_h + index // page_size, mask=inside, other=0)
        slot = page.to(tl.int64) * page_size + index % page_size
        k = tl.load(k_pool + slot[:, None] * D + dims[None, :], mask=inside[:, None] & (dims[None, :] < D), other=0.0)
        v = tl.load(v_pool + slot[:, None] * D + dims[None, :], mask=inside[:, None] & (dims[None, :] < D), other=0.0)
        if USE_DOT:
            logits = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee") * scaling
        else:
            logits = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2) * scaling
        logits = tl.where(inside[None, :], logits, NEG_BIG)
        m_new = tl.maximum(m, tl.max(logits, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.where(inside[None, :], tl.exp(logits - m_new[:, None]), 0.0)
        s = s * alpha + tl.sum(p, axis=1)
        if USE_DOT:
            acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
        m = m_new
    base = (head * num_splits + split) * G
    tl.store(m_out + base + groups, m, mask=groups < G)
    tl.store(l_out + base + groups, s, mask=groups < G)
    tl.store(
        acc_out + (base + groups[:, None]) * D + dims[None, :], acc, mask=(groups[:, None] < G) & (dims[None, :] < D)
    )
