"""A bench plan (cells + device settings), its named presets, and the driver that runs it and writes every output:
``bench.csv``, the micro-benchmarks' ``append.csv`` / ``bytes.csv``, the rebuilt paper tables, plots and
``summary.json``."""

from __future__ import annotations

import csv
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kvbench.bench.efficiency_tables import rebuild_tables, write_csv
from kvbench.bench.micro import append_scaling, stored_bytes, targets
from kvbench.bench.random_models import build_random_model, load_method
from kvbench.bench.speed_plots import plot_all
from kvbench.bench.timed_cells import RunSpec, run_cell
from kvbench.bench.timing import device_name, peak_bandwidth, resolve_device
from kvbench.budget import parse_budget


@dataclass
class BenchPlan:
    """A list of cells plus the device settings."""

    specs: list[RunSpec]
    device: str = "auto"
    dtype: str = "bfloat16"
    peak_gbps: float | None = None
    micro: bool = True
    micro_sizes: list[int] = field(default_factory=lambda: [1024, 4096, 16384, 65536, 131072])
    micro_heads: int = 8
    micro_dim: int = 128


def run_plan(plan: BenchPlan, out_dir: Path, log: Any = print) -> dict[str, Any]:
    """Run every cell and the micro-benchmarks; write CSVs, plots and the rebuilt tables under ``out_dir``."""
    from kvbench.models.loading import DTYPES

    out_dir.mkdir(parents=True, exist_ok=True)
    device = resolve_device(plan.device)
    dtype = DTYPES[plan.dtype]
    peak_gbps, peak_source = peak_bandwidth(device, plan.peak_gbps)
    meta = {
        "device": str(device),
        "device_name": device_name(device),
        "dtype": plan.dtype,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "peak_gbps": round(peak_gbps, 1),
        "peak_source": peak_source,
    }
    log(f"device {meta['device_name']} ({device}), {plan.dtype}, peak bandwidth {peak_gbps:.1f} GB/s ({peak_source})")
    rows: list[dict[str, Any]] = []
    models: dict[str, torch.nn.Module] = {}
    for spec in plan.specs:
        if spec.arch not in models:
            models.clear()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            start = time.perf_counter()
            models[spec.arch] = build_random_model(spec.arch, device, dtype)
            log(f"built {spec.arch} in {time.perf_counter() - start:.1f} s")
            warm = RunSpec(spec.arch, "full", min(256, spec.context), "full", 2, spec.backend, spec.page_size)
            with torch.inference_mode():
                run_cell(models[spec.arch], load_method("full", spec.arch), parse_budget("full"), warm, device)
        model = models[spec.arch]
        method = load_method(spec.method, spec.arch)
        budget = parse_budget("full" if spec.method == "full" else spec.budget)
        results = []
        for _ in range(max(1, spec.repeats)):
            method = load_method(spec.method, spec.arch)  # decode policies keep per-sample state
            with torch.inference_mode():
                results.append(run_cell(model, method, budget, spec, device))
        result = results[0] if len(results) == 1 else _median_result(results)
        bytes_read = result["weight_bytes_read"] + result["cache_bytes_read_per_token"]
        per_token_s = result["decode_ms_per_token"] / 1000
        row = {
            "arch": spec.arch,
            "device": meta["device_name"],
            "dtype": plan.dtype,
            "backend": result["backend_used"],
            "method": spec.method,
            "budget": budget.spec,
            "context": spec.context,
            "prefill_chunk": spec.prefill_chunk,
            "scoring_impl": spec.scoring_impl,
            "decode_tokens": spec.decode_tokens,
            **{k: v for k, v in result.items() if k != "backend_used"},
            "decode_bandwidth_gbps": bytes_read / per_token_s / 1e9 if per_token_s > 0 else "",
            "decode_bandwidth_fraction": bytes_read / per_token_s / 1e9 / peak_gbps if per_token_s > 0 else "",
        }
        rows.append(row)
        log(
            f"{spec.arch:>15} {row['backend']:>5} {spec.method:<13} {spec.context:>7} prefill {row['prefill_s']:8.3f} s"
            f"  decode {row['decode_ms_per_token']:8.2f} ms/tok  cache {row['cache_bytes_final'] / 2**20:9.2f} MiB"
            f"  bw {100 * float(row['decode_bandwidth_fraction'] or 0):5.1f}% of peak"
        )
    models.clear()
    _add_prefill_overhead(rows)
    write_csv(out_dir / "bench.csv", rows)
    summary: dict[str, Any] = {"meta": meta, "runs": len(rows)}
    if plan.micro:
        append_rows = append_scaling(device, dtype, plan.micro_sizes, plan.micro_heads, plan.micro_dim, log=log)
        write_csv(out_dir / "append.csv", append_rows)
        bytes_rows = stored_bytes(device, dtype, plan.micro_heads, plan.micro_dim, log=log)
        write_csv(out_dir / "bytes.csv", bytes_rows)
        summary["targets"] = targets(append_rows, bytes_rows, rows)
    else:
        append_rows, bytes_rows = [], []
    tables = rebuild_tables(rows, out_dir, meta)
    summary["tables"] = tables
    plot_all(rows, append_rows, out_dir)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return summary


def rebuild_from_csv(bench_csv: Path, out_dir: Path) -> dict[str, str]:
    """Rebuild the tables and plots from existing CSVs (e.g. several GPU slices concatenated into one bench.csv)."""
    with open(bench_csv) as handle:
        rows: list[dict[str, Any]] = list(csv.DictReader(handle))
    append_csv = bench_csv.parent / "append.csv"
    append_rows: list[dict[str, Any]] = []
    if append_csv.exists():
        with open(append_csv) as handle:
            append_rows = list(csv.DictReader(handle))
    summary_path = bench_csv.parent / "summary.json"
    meta = {"device": "?", "device_name": rows[0]["device"] if rows else "?", "dtype": "?", "torch": torch.__version__}
    if summary_path.exists():
        meta = json.loads(summary_path.read_text()).get("meta", meta)
    out_dir.mkdir(parents=True, exist_ok=True)
    tables = rebuild_tables(rows, out_dir, meta)
    plot_all(rows, append_rows, out_dir)
    return tables


def _median_result(results: list[dict[str, Any]]) -> dict[str, Any]:
    merged = dict(results[-1])
    for key in ("prefill_s", "decode_s", "decode_ms_per_token"):
        merged[key] = statistics.median(r[key] for r in results)
    return merged


def _add_prefill_overhead(rows: list[dict[str, Any]]) -> None:
    """``prefill_vs_full``: prefill time with eviction / full-cache prefill time (same arch, backend, context and
    prefill chunking)."""

    def key(row: dict[str, Any]) -> tuple[Any, ...]:
        return row["arch"], row["backend"], row["context"], row.get("prefill_chunk", 0)

    full = {key(r): r["prefill_s"] for r in rows if r["method"] == "full"}
    for row in rows:
        base = full.get(key(row))
        row["prefill_vs_full"] = row["prefill_s"] / base if base else ""


def preset(name: str) -> BenchPlan:
    """Named plans: ``cpu`` (this machine, a few minutes), ``gpu`` (real sizes; H200-class), ``smoke`` (tests)."""
    if name == "smoke":
        specs = [RunSpec("tiny", m, 256, "32L", 3, backend=b) for b in ("torch", "paged") for m in ("full", "snapkv")]
        return BenchPlan(specs, device="cpu", dtype="float32", micro_sizes=[256, 1024], micro_heads=2, micro_dim=16)
    if name == "cpu":
        methods = ["full", "snapkv", "pyramidkv", "ada_snapkv", "cake", "streamingllm", "h2o"]
        specs = [
            RunSpec("tiny", m, n, "128L", 32, backend=b, repeats=2)
            for b in ("torch", "paged")
            for n in (1024, 2048, 4096, 8192)
            for m in methods
        ]
        specs += [
            RunSpec("llama3.1-8b-2l", m, n, "256L", 4, backend=b)
            for b in ("torch", "paged")
            for n in (1024, 2048)
            for m in ("full", "snapkv", "cake")
        ]
        return BenchPlan(specs, device="cpu", dtype="bfloat16")
    if name == "gpu":
        methods = ["full", "snapkv", "pyramidkv", "cake", "ada_snapkv"]
        lengths = (7168, 15360, 31744, 64512, 130048)  # CAKE Table 13 prefill lengths (+1024 decoded)
        specs = [RunSpec("mistral-7b", m, n, "1024L", 1024) for n in lengths for m in methods]
        specs += [RunSpec("mistral-7b", m, 32768, "1024L", 8, backend="torch") for m in ("full", "snapkv")]
        specs += [RunSpec("llama3.1-8b", m, 8192, "1024L", 256) for m in ("full", "snapkv", "xkv")]
        return BenchPlan(specs, device="cuda", dtype="bfloat16")
    raise ValueError(f"unknown preset {name!r}; valid: smoke, cpu, gpu")
