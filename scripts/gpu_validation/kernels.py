"""The kernels phase's checks of ``scripts/gpu_validate.py``: every Triton kernel against its torch implementation
on ragged, paged states (:data:`KERNEL_CHECKS`, one row each: relative error, tolerance, timings, finiteness).
Imports of torch and kvbench are deferred to the calls, as in the script (``TRITON_INTERPRET`` must be set first)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def _paged_state(lengths: list[int], page: int, dim: int, dtype: Any, device: Any, extra: int) -> tuple:
    """Pools ``[N, D]``, positions, a shuffled block table ``[H, P]`` and lengths for ragged heads, with room for
    ``extra`` more tokens per head."""
    import torch

    gen = torch.Generator().manual_seed(sum(lengths))
    pages = [-(-(n + extra) // page) for n in lengths]
    order = torch.randperm(sum(pages), generator=gen).to(torch.int32)
    table = torch.zeros(len(lengths), max(pages), dtype=torch.int32)
    first = 0
    for head, count in enumerate(pages):
        table[head, :count] = order[first : first + count]
        first += count
    slots = sum(pages) * page
    k_pool = torch.randn(slots, dim, generator=gen).to(device=device, dtype=dtype)
    v_pool = torch.randn(slots, dim, generator=gen).to(device=device, dtype=dtype)
    pos_pool = torch.zeros(slots, dtype=torch.int32, device=device)
    return k_pool, v_pool, pos_pool, table.to(device), torch.tensor(lengths, dtype=torch.int32, device=device)


def _ragged(tokens: int, heads: int) -> list[int]:
    import torch

    gen = torch.Generator().manual_seed(tokens)
    return [tokens - int(x) for x in torch.randint(0, max(1, tokens // 4), (heads,), generator=gen)]


#: Time a kernel's second call (the first compiles it); off in the CPU dry run, where the interpreter is slow.
WARM_TIMING = {"enabled": True}


def _timed(device: Any, function: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """``function(*args, **kwargs)`` and its wall time in ms (device synchronised before and after); the kernels
    checked are idempotent (same inputs, same writes), so the warm call's result is the one returned."""
    from kvbench.bench.timing import synchronize

    if WARM_TIMING["enabled"]:
        function(*args, **kwargs)
    synchronize(device)
    start = time.perf_counter()
    out = function(*args, **kwargs)
    synchronize(device)
    return out, 1000 * (time.perf_counter() - start)


def _rel_err(got: Any, want: Any) -> float:
    got, want = got.float(), want.float()
    finite = want.isfinite()
    scale = float(want[finite].abs().max()) if finite.any() else 1.0
    return float((got[finite] - want[finite]).abs().max()) / max(scale, 1e-12)


def _tolerance(dtype: Any) -> float:
    import torch

    return 1e-4 if dtype == torch.float32 else 2e-2


def _states(tokens: int, heads_q: int, heads: int, dim: int, rows: int, dtype: Any, device: Any) -> tuple:
    """Queries ``[H_q, rows, D]`` and keys ``[H, S, D]`` as transposed views of ``[S, H, D]`` (the model's layout)."""
    import torch

    gen = torch.Generator().manual_seed(tokens + rows)
    keys = torch.randn(tokens, heads, dim, generator=gen).to(device=device, dtype=dtype).transpose(0, 1)
    queries = (torch.randn(rows, heads_q, dim, generator=gen) * 1.5).to(device=device, dtype=dtype).transpose(0, 1)
    return queries, keys


def check_window_stats(tokens, heads_q, heads, dim, window, dtype, device) -> dict[str, Any]:
    from kvbench import kernels

    queries, keys = _states(tokens, heads_q, heads, dim, window, dtype, device)
    prob = None if str(dtype) == "torch.float32" else dtype
    got, triton_ms = _timed(device, kernels.window_stats, queries, keys, dim**-0.5, prob_dtype=prob, impl="triton")
    want, torch_ms = _timed(device, kernels.window_stats, queries, keys, dim**-0.5, prob_dtype=prob, impl="torch")
    fields = ("col_sum", "col_m2", "col_max", "col_entropy", "row_lse", "row_entropy")
    err = max(_rel_err(getattr(got, f), getattr(want, f)) for f in fields)
    finite = all(bool(getattr(got, f).isfinite().all()) for f in ("col_sum", "col_max", "row_lse"))
    return _kernel_row(f"q[{heads_q},{window},{dim}] k[{heads},{tokens},{dim}]T", err, dtype, triton_ms, torch_ms,
                       finite)  # fmt: skip


def check_causal_column_sums(tokens, heads_q, heads, dim, window, dtype, device) -> dict[str, Any]:
    from kvbench import kernels

    rows = tokens if tokens <= 32768 else 4096  # 128K: one prefill chunk's rows against every key
    queries, keys = _states(tokens, heads_q, heads, dim, rows, dtype, device)
    got, triton_ms = _timed(device, kernels.causal_column_sums, queries, keys, dim**-0.5, impl="triton")
    want, torch_ms = _timed(device, kernels.causal_column_sums, queries, keys, dim**-0.5, impl="torch")
    return _kernel_row(f"q[{heads_q},{rows},{dim}] k[{heads},{tokens},{dim}]T", _rel_err(got, want), dtype, triton_ms,
                       torch_ms, bool(got.isfinite().all()))  # fmt: skip


def check_paged_append(tokens, heads_q, heads, dim, window, dtype, device) -> dict[str, Any]:
    import torch

    from kvbench import kernels

    lengths, new = _ragged(tokens, heads), 256
    errors, times = [], [0.0, 0.0]
    for count in (1, new):
        states = [list(_paged_state(lengths, 16, dim, dtype, device, new)) for _ in range(2)]
        gen = torch.Generator().manual_seed(count)
        new_k = torch.randn(heads, count, dim, generator=gen).to(device=device, dtype=dtype)
        new_v = torch.randn(heads, count, dim, generator=gen).to(device=device, dtype=dtype)
        for index, impl in enumerate(("triton", "torch")):
            k, v, pos, table, lens = states[index]
            _, ms = _timed(device, kernels.paged_append, k, v, pos, new_k, new_v, table, lens, tokens, 16, impl=impl)
            times[index] += ms
        errors += [_rel_err(a, b) for a, b in zip(states[0][:3], states[1][:3], strict=True)]
    return _kernel_row(f"H={heads} ragged ~{tokens}, +1 and +{new} tokens, page 16", max(errors), dtype, *times,
                       bool(states[0][0].isfinite().all()))  # fmt: skip


def check_copy_rows(tokens, heads_q, heads, dim, window, dtype, device) -> dict[str, Any]:
    import torch

    from kvbench import kernels

    gen = torch.Generator().manual_seed(tokens)
    count = tokens * heads
    src_k = torch.randn(count, dim, generator=gen).to(device=device, dtype=dtype)
    src_v = torch.randn(count, dim, generator=gen).to(device=device, dtype=dtype)
    src = torch.randperm(count, generator=gen)[: count // 2].to(device)
    dst = torch.randperm(count, generator=gen)[: count // 2].to(device)
    outs = []
    times = []
    for impl in ("triton", "torch"):
        dst_k, dst_v = torch.zeros_like(src_k), torch.zeros_like(src_v)
        _, ms = _timed(device, kernels.copy_rows, src_k, src_v, src, dst_k, dst_v, dst, impl=impl)
        outs.append((dst_k, dst_v))
        times.append(ms)
    err = max(_rel_err(outs[0][0], outs[1][0]), _rel_err(outs[0][1], outs[1][1]))
    return _kernel_row(f"{count // 2} of {count} rows x {dim}", err, dtype, *times, bool(outs[0][0].isfinite().all()))


def check_paged_decode(tokens, heads_q, heads, dim, window, dtype, device) -> dict[str, Any]:
    import torch

    from kvbench import kernels

    lengths = _ragged(tokens, heads)
    k, v, _, table, lens = _paged_state(lengths, 16, dim, dtype, device, 0)
    groups = heads_q // heads
    query = torch.randn(heads, groups, dim, generator=torch.Generator().manual_seed(1)).to(device=device, dtype=dtype)
    args = (query, k, v, table, lens, dim**-0.5, 16, max(lengths))
    got, triton_ms = _timed(device, kernels.paged_decode_attention, *args, impl="triton")
    want, torch_ms = _timed(device, kernels.paged_decode_attention, *args, impl="torch")
    return _kernel_row(f"q[{heads},{groups},{dim}] ragged ~{tokens}, page 16", _rel_err(got, want), dtype, triton_ms,
                       torch_ms, bool(got.isfinite().all()))  # fmt: skip


def _kernel_row(shape: str, err: float, dtype: Any, triton_ms: float, torch_ms: float, finite: bool) -> dict:
    tolerance = _tolerance(dtype)
    return {"shape": shape, "max_rel_err": f"{err:.3g}", "tolerance": tolerance, "ok": finite and err <= tolerance,
            "triton_ms": round(triton_ms, 3), "torch_ms": round(torch_ms, 3), "finite": finite}  # fmt: skip


KERNEL_CHECKS: dict[str, Callable[..., dict[str, Any]]] = {
    "paged_decode_attention": check_paged_decode,
    "window_stats": check_window_stats,
    "causal_column_sums": check_causal_column_sums,
    "paged_append": check_paged_append,
    "copy_rows": check_copy_rows,
}
