"""Every kernel in ``kvbench/kernels/`` against its pure-torch reference, on random inputs with ragged lengths.

Without a GPU the Triton kernels run under the Triton interpreter (``TRITON_INTERPRET=1``, set below, triton
re-imported if torch._dynamo imported it first), so CI checks them on CPU; with CUDA they run compiled on the GPU.
"""

from __future__ import annotations

import pytest
import torch

from kvbench import kernels
from kvbench.kernels import reference

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
IMPLS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(not kernels.triton_available(), reason="no triton"))]
STAT_FIELDS = ("col_sum", "col_m2", "col_max", "col_entropy", "row_lse", "row_entropy")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    ("num_q", "num_kv", "window", "length", "dim", "chunk"),
    [(4, 2, 8, 50, 16, 16), (6, 3, 13, 97, 24, 32), (2, 2, 1, 17, 16, 4), (8, 1, 32, 130, 32, 4096)],
)
def test_window_stats_match_reference(impl, num_q, num_kv, window, length, dim, chunk) -> None:
    """Fused scoring == statistics of the materialised window attention (GQA, odd sizes, W=1, chunked torch)."""
    gen = _gen(length)
    queries = torch.randn(num_q, window, dim, generator=gen) * 1.5
    keys = torch.randn(num_kv, length, dim, generator=gen)
    scaling = dim**-0.5
    expected = reference.window_stats_reference(queries, keys, scaling)
    got = kernels.window_stats(queries.to(DEVICE), keys.to(DEVICE), scaling, impl=impl, chunk=chunk)
    for name in STAT_FIELDS:
        torch.testing.assert_close(getattr(got, name).cpu(), getattr(expected, name), rtol=1e-4, atol=1e-5, msg=name)
    probs = reference.window_probs_reference(queries, keys, scaling)
    torch.testing.assert_close(got.mean.cpu(), probs.mean(dim=1), rtol=1e-4, atol=1e-6)
    if window > 1:
        torch.testing.assert_close(got.var().cpu(), probs.var(dim=1), rtol=1e-3, atol=1e-6)
        torch.testing.assert_close(
            got.var(unbiased=False).cpu(), probs.var(dim=1, unbiased=False), rtol=1e-3, atol=1e-6
        )


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("prob_dtype", [torch.bfloat16, torch.float16])
def test_window_stats_round_each_probability_and_scale_rows(impl, prob_dtype) -> None:
    """``prob_dtype``: every column statistic is of the probabilities rounded to the model dtype (the references'
    cast); ``row_scale``: each row's logits times its factor (AhaKV).  Equal to the materialised computation up to
    one rounding step of the few probabilities that sit on a rounding boundary."""
    gen = _gen(5)
    queries, keys = torch.randn(4, 9, 16, generator=gen) * 2, torch.randn(2, 75, 16, generator=gen)
    row_scale = torch.rand(9, generator=gen) + 0.5
    expected = reference.window_stats_reference(queries, keys, 0.25, prob_dtype=prob_dtype, row_scale=row_scale)
    got = kernels.window_stats(
        queries.to(DEVICE), keys.to(DEVICE), 0.25, prob_dtype=prob_dtype, row_scale=row_scale.to(DEVICE), impl=impl,
        chunk=32,
    )  # fmt: skip
    for name in ("col_sum", "col_m2", "col_max", "col_entropy"):
        torch.testing.assert_close(getattr(got, name).cpu(), getattr(expected, name), rtol=1e-2, atol=2e-4, msg=name)
    # The maxima are single rounded probabilities: representable in the model dtype, and mostly bit-equal.
    col_max = got.col_max.cpu()
    assert torch.equal(col_max.to(prob_dtype).float(), col_max)
    assert (col_max == expected.col_max).float().mean() > 0.95
    torch.testing.assert_close(got.row_lse.cpu(), expected.row_lse, rtol=1e-5, atol=1e-5)
    unrounded = kernels.window_stats(queries.to(DEVICE), keys.to(DEVICE), 0.25, row_scale=row_scale.to(DEVICE))
    assert not torch.equal(unrounded.col_sum.cpu(), got.col_sum.cpu())


@pytest.mark.parametrize("impl", IMPLS)
def test_window_stats_variance_is_two_pass(impl) -> None:
    """Window rows that attend almost alike (CAKE's small-variance columns): the centred sum of squares keeps the
    variance to float32 accuracy, where sum(A^2) - sum(A)^2 / W loses it to cancellation."""
    gen = _gen(9)
    queries = torch.randn(1, 1, 16, generator=gen).expand(2, 32, 16) + 1e-3 * torch.randn(2, 32, 16, generator=gen)
    keys = torch.randn(1, 300, 16, generator=gen)
    probs = reference.window_probs_reference(queries.double(), keys.double(), 0.25).double()
    expected = probs.var(dim=1)[:, :268]  # candidates: every row sees them
    got = kernels.window_stats(queries.to(DEVICE), keys.to(DEVICE), 0.25, impl=impl).var().cpu()[:, :268]
    torch.testing.assert_close(got.double(), expected, rtol=2e-2, atol=0.0)
    naive = ((probs.float() ** 2).sum(dim=1) - probs.float().sum(dim=1) ** 2 / 32) / 31
    assert (naive[:, :268].double() - expected).abs().max() > (got.double() - expected).abs().max()


def test_window_stats_matches_the_methods_window_attention() -> None:
    """The fused statistics agree with the dense reference ``kvbench.eviction.token_scores.window_attention``."""
    from kvbench.eviction.token_scores import window_attention

    gen = _gen(7)
    queries, keys = torch.randn(4, 16, 16, generator=gen), torch.randn(2, 80, 16, generator=gen)
    attention = window_attention(queries, keys, 0.25)
    stats = kernels.window_stats(queries, keys, 0.25)
    torch.testing.assert_close(stats.col_sum, attention.sum(dim=1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stats.col_max, attention.amax(dim=1), rtol=1e-5, atol=1e-6)
    dense = kernels.window_stats(queries, keys, 0.25, impl="dense")
    torch.testing.assert_close(dense.col_sum, attention.sum(dim=1))


@pytest.mark.parametrize(
    ("num_q", "num_kv", "length", "block_bytes"), [(4, 2, 70, 1 << 30), (4, 2, 70, 700), (3, 1, 33, 1)]
)
def test_causal_column_sums_match_the_dense_causal_softmax(num_q, num_kv, length, block_bytes) -> None:
    """H2O's all-rows scores, row-blocked (one block, ~2 rows, one row at a time) == the full S x S softmax."""
    gen = _gen(length)
    queries, keys = torch.randn(num_q, length, 16, generator=gen) * 2, torch.randn(num_kv, length, 16, generator=gen)
    expected = reference.causal_column_sums_reference(queries, keys, 0.25)
    got = kernels.causal_column_sums(queries, keys, 0.25, max_block_bytes=block_bytes)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert float(expected[:, -1].min()) > 0 and torch.allclose(expected.sum(dim=1), torch.full((num_q,), length * 1.0))
    # Rounding each probability to bf16 before summing (the reference code's cast) changes the sums slightly.
    rounded = kernels.causal_column_sums(queries, keys, 0.25, prob_dtype=torch.bfloat16)
    assert not torch.equal(rounded, got)
    torch.testing.assert_close(rounded, got, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    ("rows", "prob_dtype", "scaled"), [(90, None, False), (33, torch.bfloat16, True), (1, None, True)]
)
def test_causal_column_sums_kernel_matches_reference(impl, rows, prob_dtype, scaled) -> None:
    """The two-pass column sums (Triton: tiles of 64 rows x 64 keys) == the materialised softmax, for a whole
    prefill (R = S), a prefill chunk's last rows (R < S) and one row; with probability rounding and row scales."""
    gen = _gen(rows)
    queries, keys = torch.randn(4, rows, 16, generator=gen) * 2, torch.randn(2, 90, 16, generator=gen)
    row_scale = torch.rand(rows, generator=gen) + 0.5 if scaled else None
    expected = reference.causal_column_sums_reference(queries, keys, 0.25, prob_dtype, row_scale)
    got = kernels.causal_column_sums(
        queries.to(DEVICE), keys.to(DEVICE), 0.25, prob_dtype=prob_dtype,
        row_scale=row_scale.to(DEVICE) if scaled else None, impl=impl, max_block_bytes=3000,
    )  # fmt: skip
    atol = 1e-5 if prob_dtype is None else 2e-3  # a probability on a bf16 rounding boundary may round the other way
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-4, atol=atol)
    torch.testing.assert_close(got.sum(dim=1).cpu(), expected.sum(dim=1), rtol=1e-3, atol=atol * 10)


def test_scoring_ops_name_bad_arguments() -> None:
    queries, keys = torch.zeros(4, 8, 16), torch.zeros(2, 20, 16)
    with pytest.raises(ValueError, match="impl='fused'"):
        kernels.window_stats(queries, keys, 1.0, impl="fused")
    with pytest.raises(ValueError, match="prob_dtype"):
        kernels.causal_column_sums(queries, keys, 1.0, prob_dtype=torch.int8)
    with pytest.raises(ValueError, match="row_scale"):
        kernels.window_stats(queries, keys, 1.0, row_scale=torch.ones(3))
    with pytest.raises(ValueError, match="8 query rows but only 5 keys"):
        kernels.causal_column_sums(queries, keys[:, :5], 1.0)


def _paged_state(gen: torch.Generator, lengths: list[int], page_size: int, dim: int, spare_pages: int = 3):
    """Random pools with pages handed out in a shuffled order, a block table and per-head lengths."""
    heads = len(lengths)
    pages_per_head = [-(-(n + 5) // page_size) for n in lengths]  # room for 5 more tokens
    total = sum(pages_per_head) + spare_pages
    order = torch.randperm(total, generator=gen).tolist()
    table = torch.zeros(heads, max(pages_per_head), dtype=torch.int32)
    for head, count in enumerate(pages_per_head):
        table[head, :count] = torch.tensor([order.pop() for _ in range(count)], dtype=torch.int32)
    k_pool = torch.randn(total * page_size, dim, generator=gen)
    v_pool = torch.randn(total * page_size, dim, generator=gen)
    pos_pool = torch.randint(0, 1000, (total * page_size,), generator=gen, dtype=torch.int32)
    return k_pool, v_pool, pos_pool, table, torch.tensor(lengths, dtype=torch.int32)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("new_tokens", [1, 5])
def test_paged_append_matches_reference(impl: str, new_tokens: int) -> None:
    gen = _gen(new_tokens)
    state = _paged_state(gen, [0, 7, 16, 33], page_size=8, dim=12)
    new_k, new_v = torch.randn(4, new_tokens, 12, generator=gen), torch.randn(4, new_tokens, 12, generator=gen)
    expected = [t.clone() for t in state[:3]]
    reference.paged_append_reference(*expected, new_k, new_v, state[3], state[4], 40, 8)
    got = [t.clone().to(DEVICE) for t in state[:3]]
    kernels.paged_append(
        *got, new_k.to(DEVICE), new_v.to(DEVICE), state[3].to(DEVICE), state[4].to(DEVICE), 40, 8, impl=impl
    )
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a.cpu(), b)
    # Only the H * q addressed slots changed.
    changed = (expected[0] != state[0]).any(dim=1).sum().item()
    assert changed == 4 * new_tokens


@pytest.mark.parametrize("impl", IMPLS)
def test_copy_rows_matches_reference(impl: str) -> None:
    gen = _gen(3)
    src_k, src_v = torch.randn(64, 20, generator=gen), torch.randn(64, 20, generator=gen)
    dst_k, dst_v = torch.zeros(40, 20), torch.zeros(40, 20)
    src_slots = torch.randperm(64, generator=gen)[:25]
    dst_slots = torch.randperm(40, generator=gen)[:25]
    expected = [dst_k.clone(), dst_v.clone()]
    reference.copy_rows_reference(src_k, src_v, src_slots, *expected, dst_slots)
    got = [dst_k.to(DEVICE), dst_v.to(DEVICE)]
    kernels.copy_rows(src_k.to(DEVICE), src_v.to(DEVICE), src_slots.to(DEVICE), *got, dst_slots.to(DEVICE), impl=impl)
    assert torch.equal(got[0].cpu(), expected[0]) and torch.equal(got[1].cpu(), expected[1])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("groups", "chunk"), [(1, 1024), (4, 16), (3, 40), (16, 64)])  # 16: the tl.dot path
def test_paged_decode_attention_matches_reference_and_sdpa(impl: str, groups: int, chunk: int) -> None:
    """Split-K paged decode == gather + softmax reference == SDPA over each head's contiguous keys."""
    gen = _gen(groups)
    lengths = [1, 9, 64, 101]
    k_pool, v_pool, _, table, lens = _paged_state(gen, lengths, page_size=8, dim=16)
    query = torch.randn(4, groups, 16, generator=gen)
    expected = reference.paged_decode_attention_reference(query, k_pool, v_pool, table, lens, 0.25, 8)
    got = kernels.paged_decode_attention(
        query.to(DEVICE), k_pool.to(DEVICE), v_pool.to(DEVICE), table.to(DEVICE), lens.to(DEVICE), 0.25, 8,
        max(lengths), impl=impl, chunk=chunk,
    )  # fmt: skip
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-4, atol=1e-5)
    for head, length in enumerate(lengths):
        index = torch.arange(length)
        slots = reference.slots_of(table, torch.full_like(index, head), index, 8)
        keys, values = k_pool[slots], v_pool[slots]
        sdpa = torch.nn.functional.scaled_dot_product_attention(
            query[head][None, :, None],
            keys.expand(groups, -1, -1)[None],
            values.expand(groups, -1, -1)[None],
            scale=0.25,
        )
        torch.testing.assert_close(expected[head], sdpa[0, :, 0], rtol=1e-4, atol=1e-5)


def test_auto_uses_torch_without_cuda() -> None:
    """``impl='auto'`` picks the torch path for CPU tensors (the automatic fallback) and Triton only on CUDA."""
    cpu = torch.zeros(1)
    assert not kernels.use_triton("auto", cpu)
    if torch.cuda.is_available() and kernels.triton_available():
        assert kernels.use_triton("auto", cpu.cuda())
    with pytest.raises(ValueError):
        kernels.use_triton("cuda", cpu)
