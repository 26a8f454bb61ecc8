"""Storage micro-benchmarks: the time of one append against the cache size per backend (:func:`append_scaling`),
stored bytes against kept tokens after a per-head eviction (:func:`stored_bytes`), and the targets they check."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable
from typing import Any

import torch

from kvbench.bench.timing import device_name, synchronize
from kvbench.cache.kv_cache import KVBenchCache
from kvbench.cache.paged import PagedLayer


def append_scaling(
    device: torch.device,
    dtype: torch.dtype,
    sizes: Iterable[int],
    heads: int = 8,
    dim: int = 128,
    steps: int = 64,
    log: Any = print,
) -> list[dict[str, Any]]:
    """Time of appending one decoded token to one layer holding ``S`` tokens per head, per backend.

    ``paged`` reserves its decode headroom first (``reserve``), ``paged_growing`` does not (pool growth included,
    mean reported); ``torch`` is the ``torch.cat`` storage.  Median seconds per append over ``steps`` appends
    (fewer for torch at large sizes: each of its appends copies the whole layer).
    """
    rows = []
    for size in sizes:
        for backend in ("torch", "paged", "paged_growing"):
            layer: Any = KVBenchCache(1, backend="torch" if backend == "torch" else "paged").layers[0]
            prefill = torch.randn(1, heads, size, dim, dtype=dtype, device=device)
            layer.update(prefill, prefill)
            del prefill
            if backend == "paged":
                layer.reserve(steps)
            token = torch.randn(1, heads, 1, dim, dtype=dtype, device=device)
            count = steps if backend != "torch" or size <= 16384 else max(4, steps // 8)
            times = []
            for _ in range(count):
                synchronize(device)
                start = time.perf_counter()
                layer.update(token, token)
                synchronize(device)
                times.append(time.perf_counter() - start)
            stat = statistics.mean(times) if backend == "paged_growing" else statistics.median(times)
            rows.append(
                {
                    "backend": backend,
                    "cache_tokens_per_head": size,
                    "heads": heads,
                    "head_dim": dim,
                    "dtype": str(dtype).removeprefix("torch."),
                    "device": device_name(device),
                    "append_us": 1e6 * stat,
                    "statistic": "mean" if backend == "paged_growing" else "median",
                    "appends_timed": count,
                    "rows_written_per_append": heads if backend != "torch" else heads * (size + 1),
                }
            )
            log(f"append {backend:>13} S={size:>7}: {1e6 * stat:10.1f} us")
            del layer
    return rows


def stored_bytes(
    device: torch.device,
    dtype: torch.dtype,
    heads: int = 8,
    dim: int = 128,
    context: int = 16384,
    budgets: Iterable[int] = (128, 512, 1024, 2048),
    page_sizes: Iterable[int] = (16, 256),
    log: Any = print,
) -> list[dict[str, Any]]:
    """Bytes held by a paged layer after a per-head eviction to ``budget`` tokens per head (uniform, and ragged
    with the same total: Ada-KV-style), divided by kept tokens x bytes per token."""
    rows = []
    gen = torch.Generator().manual_seed(0)
    for page_size in page_sizes:
        for budget in budgets:
            for allocation in ("uniform", "ragged"):
                layer = PagedLayer(page_size=page_size)
                states = torch.randn(1, heads, context, dim, dtype=dtype, device=device)
                layer.update(states, states)
                if allocation == "uniform":
                    counts = [budget] * heads
                else:
                    weights = torch.rand(heads, generator=gen) + 0.2
                    counts = [max(1, int(budget * heads * w / weights.sum())) for w in weights.tolist()]
                keep = [torch.randperm(context, generator=gen)[:c].to(device) for c in counts]
                layer.keep(keep)
                per_token = dim * 2 * torch.tensor([], dtype=dtype).element_size()
                ratio = layer.allocated_bytes() / (sum(counts) * per_token)
                rows.append(
                    {
                        "page_size": page_size,
                        "budget_per_head": budget,
                        "allocation": allocation,
                        "heads": heads,
                        "kept_tokens": sum(counts),
                        "allocated_bytes": layer.allocated_bytes(),
                        "kept_bytes": sum(counts) * per_token,
                        "ratio": ratio,
                    }
                )
                log(f"bytes page={page_size:>4} budget={budget:>5} {allocation:>8}: stored/kept = {ratio:.4f}")
    return rows


def targets(
    append_rows: list[dict[str, Any]], bytes_rows: list[dict[str, Any]], runs: list[dict[str, Any]]
) -> dict[str, Any]:
    """The issue's measurable targets from the micro-benchmarks and runs."""

    def append_at(backend: str, size: int) -> float | None:
        for row in append_rows:
            if row["backend"] == backend and row["cache_tokens_per_head"] == size:
                return float(row["append_us"])
        return None

    out: dict[str, Any] = {}
    sizes = sorted({int(r["cache_tokens_per_head"]) for r in append_rows})
    if sizes:
        small, large = sizes[0], sizes[-1]
        for backend in ("paged", "paged_growing", "torch"):
            a, b = append_at(backend, small), append_at(backend, large)
            if a and b:
                out[f"append_ratio_{backend}_{large}_vs_{small}"] = round(b / a, 3)
        ratio = out.get(f"append_ratio_paged_{large}_vs_{small}")
        out["append_target_met (paged <= 1.5)"] = ratio is not None and ratio <= 1.5
    page16 = [r for r in bytes_rows if r["page_size"] == 16 and r["budget_per_head"] >= 1024]
    if page16:
        worst = max(float(r["ratio"]) for r in page16)
        out["stored_bytes_ratio_worst_page16_budget>=1024"] = round(worst, 4)
        out["bytes_target_met (<= 1.02)"] = worst <= 1.02
    paged_runs = [r for r in runs if r["backend"] == "paged" and r["method"] != "full"]
    if paged_runs:
        out["stored_bytes_ratio_runs_max"] = round(max(float(r["stored_bytes_ratio"]) for r in paged_runs), 4)
    return out
