#!/usr/bin/env python
"""Peak memory of eviction scoring and of the compressed prefill against context length, per method: the fused
kernels (the default path) against the dense reference computation (``scoring_impl=dense``: the materialised
window / all-rows attention the scorers computed before), one-shot against chunked prefill (``run.prefill_chunk``).

Each cell runs in a fresh subprocess.  CPU: the peak is the growth of the resident set over what the cell holds
before the measured step (``VmHWM`` of ``/proc/self/status``, reset through ``/proc/self/clear_refs`` once the inputs
exist); CUDA: ``torch.cuda.max_memory_allocated`` over the memory allocated before the step.

* ``scoring`` -- one layer of a real-size architecture (``--arch``, random bf16 keys, values and the prompt's
  queries): the compression step at the end of a prefill (the session's attention statistics, the layer allocator,
  the scorer, the eviction).  ``dense_bytes`` is the float32 attention matrix the dense reference materialises
  (``H_q x W x S``; ``H_q x S x S`` for H2O / AhaKV without RA), cells over ``--dense-limit-gib`` are not run.
* ``prefill`` -- a whole compressed prefill of a 2-layer slice (``--arch``, default ``llama3.1-8b-2l``) through the
  model and the cache (:func:`kvbench.bench.run_cell`): peak memory, time, cache bytes.

    python scripts/bench_scoring.py scoring --contexts 4096 32768 131072 --out results/bench/scoring.csv
    python scripts/bench_scoring.py prefill --contexts 4096 32768 --chunks 0 4096 --out results/bench/prefill.csv
    python scripts/bench_scoring.py scoring --device cuda --out results/bench/scoring_gpu.csv    # on a GPU
    python scripts/bench_scoring.py table results/bench/scoring.csv        # the CSVs as a Markdown table

A benchmark that writes numbers, not a test.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_METHODS = ["snapkv", "pyramidkv", "ada_snapkv", "cake", "h2o", "tova", "ahakv", "xkv"]
ALL_ROWS_METHODS = {"h2o", "cake_h2o", "ahakv_no_ra"}  # the dense reference materialises H_q x S x S


# ---------------------------------------------------------------------------------------------------- memory probes
def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


class PeakMemory:
    """Peak bytes allocated beyond the level at :meth:`start` (CPU resident set, or CUDA allocator)."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")

    def start(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident set
            self.base = _status_kib("VmRSS") * 1024

    def peak(self) -> int:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            return int(torch.cuda.max_memory_allocated() - self.base)
        return int(_status_kib("VmHWM") * 1024 - self.base)


# ---------------------------------------------------------------------------------------------------- cells (child)
class _Layer:
    def __init__(self, idx: int) -> None:
        self.layer_idx = idx


def _compression_step(cell: dict[str, Any], context: int):
    """A one-layer cache holding ``context`` random tokens, its session, the prompt's queries and the step."""
    import torch

    from kvbench.bench import ARCHITECTURES, load_method
    from kvbench.budget import parse_budget
    from kvbench.cache.kv_cache import KVBenchCache
    from kvbench.inference.eviction import EvictionSession

    config = ARCHITECTURES[cell["arch"]]
    num_q, num_kv = config["num_attention_heads"], config["num_key_value_heads"]
    dim = config["hidden_size"] // num_q
    device = torch.device(cell["device"])
    method = load_method(cell["method"], cell["arch"])
    expand = num_q // num_kv if method.gqa_granularity == "query_head" else 1
    torch.manual_seed(0)
    cache = KVBenchCache(1, expand_factor=expand, backend="torch")
    keys = torch.randn(1, num_kv, context, dim, dtype=torch.bfloat16, device=device)
    cache.update(keys, torch.randn_like(keys), 0)
    del keys
    query = torch.randn(1, num_q, context, dim, dtype=torch.bfloat16, device=device)  # the prefill's query tensor
    session = EvictionSession(method, parse_budget(cell["budget"]), cache, scoring_impl=cell["impl"])
    session.begin_prefill(context)

    def step() -> None:
        with torch.inference_mode():
            session.after_attention(_Layer(0), query, dim**-0.5)  # type: ignore[arg-type]
        if device.type == "cuda":
            torch.cuda.synchronize()

    return cache, step


def scoring_cell(cell: dict[str, Any]) -> dict[str, Any]:
    """The compression step of one real-size layer (module docstring), after a warm-up step on 2K tokens (imports,
    thread pools and kernels are not counted)."""
    from kvbench import kernels

    kernels.triton_available()
    _compression_step(cell, 2048)[1]()
    cache, step = _compression_step(cell, cell["context"])
    memory = PeakMemory(cell["device"])
    memory.start()
    start = time.perf_counter()
    step()
    seconds = time.perf_counter() - start
    return {"peak_extra_bytes": memory.peak(), "seconds": round(seconds, 3), "kept": sum(cache.head_lengths()[0])}


def prefill_cell(cell: dict[str, Any]) -> dict[str, Any]:
    """A whole compressed prefill of a random-weight slice through the model and the cache."""
    import torch

    from kvbench.bench import RunSpec, build_random_model, load_method, run_cell
    from kvbench.budget import parse_budget

    device = torch.device(cell["device"])
    model = build_random_model(cell["arch"], device, torch.bfloat16)
    method_name = cell["method"]
    budget = parse_budget("full" if method_name == "full" else cell["budget"])
    spec = RunSpec(
        cell["arch"], method_name, cell["context"], cell["budget"], 1, backend="torch",
        prefill_chunk=cell["chunk"], scoring_impl=cell["impl"],
    )  # fmt: skip
    with torch.inference_mode():  # warm-up (allocator, kernels) on a short prompt
        run_cell(
            model, load_method("full"), parse_budget("full"), RunSpec(cell["arch"], "full", 256, "full", 1), device
        )
    memory = PeakMemory(cell["device"])
    memory.start()
    with torch.inference_mode():
        result = run_cell(model, load_method(method_name, spec.arch), budget, spec, device)
    return {
        "peak_extra_bytes": memory.peak(),
        "prefill_s": round(result["prefill_s"], 3),
        "cache_bytes_after_prefill": result["cache_bytes_after_prefill"],
        "peak_prefill_cache_bytes": result["peak_prefill_cache_bytes"],
    }


# ---------------------------------------------------------------------------------------------------- driver
def run_child(kind: str, cell: dict[str, Any], timeout: float) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", kind, json.dumps(cell)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f} s"}
    if done.returncode != 0:
        lines = (done.stderr.strip() or f"exit status {done.returncode}").splitlines()
        return {"error": lines[-1][:200]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def dense_bytes(method: str, arch: str, context: int) -> int:
    """Bytes of the float32 attention matrix the dense reference materialises for ``method`` (one layer)."""
    from kvbench.bench import ARCHITECTURES, load_method

    num_q = ARCHITECTURES[arch]["num_attention_heads"]
    rows = context if method in ALL_ROWS_METHODS else min(load_method(method).window, context)
    return num_q * rows * context * 4


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fields: list[str] = []
    for row in rows:
        fields += [key for key in row if key not in fields]
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def markdown_table(paths: list[Path]) -> str:
    """The CSVs as one Markdown table: a row per (method, context, chunk), fused and dense side by side."""
    rows: list[dict[str, str]] = []
    for path in paths:
        with open(path) as handle:
            rows += list(csv.DictReader(handle))
    cells: dict[tuple[str, int, int], dict[str, dict[str, str]]] = {}
    for row in rows:
        cells.setdefault((row["method"], int(row["context"]), int(row["chunk"])), {})[row["impl"]] = row

    def mib(row: dict[str, str] | None) -> str:
        if row is None:
            return ""
        if row.get("error"):
            return row["error"]
        return f"{int(row['peak_extra_bytes']) / 2**20:,.0f}"

    def seconds(row: dict[str, str] | None) -> str:
        return "" if row is None or row.get("error") else row.get("seconds") or row.get("prefill_s", "")

    lines = [
        "| method | context | prefill chunk | fused peak MiB | dense peak MiB | dense matrix MiB | fused s | dense s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (method, context, chunk), by_impl in sorted(cells.items(), key=lambda item: (item[0][1], item[0][0])):
        fused, dense = by_impl.get("auto"), by_impl.get("dense")
        matrix = int((fused or dense or {}).get("dense_bytes", 0) or 0) / 2**20
        lines.append(
            f"| {method} | {context} | {chunk or 'one forward'} | {mib(fused)} | {mib(dense)} | {matrix:,.0f} "
            f"| {seconds(fused)} | {seconds(dense)} |"
        )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "table":
        print(markdown_table([Path(p) for p in sys.argv[2:]]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, cell = sys.argv[2], json.loads(sys.argv[3])
        import torch

        torch.set_num_threads(cell["threads"])
        print(json.dumps((scoring_cell if kind == "scoring" else prefill_cell)(cell)))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=["scoring", "prefill"])
    parser.add_argument("--arch", help="architecture (kvbench.bench.ARCHITECTURES); default llama3.1-8b(-2l)")
    parser.add_argument("--methods", nargs="+", default=DEFAULT_METHODS, help="conf/method presets")
    parser.add_argument("--contexts", nargs="+", type=int, default=[4096, 32768, 131072])
    parser.add_argument("--impls", nargs="+", default=["auto", "dense"], help="scoring implementations")
    parser.add_argument("--chunks", nargs="+", type=int, default=[0], help="prefill chunk sizes (prefill part)")
    parser.add_argument("--budget", default="1024L")
    parser.add_argument("--dense-limit-gib", type=float, default=8.0, help="skip dense cells needing more")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per cell")
    parser.add_argument("--out", help="CSV path (default results/bench/<part>.csv)")
    args = parser.parse_args()
    arch = args.arch or ("llama3.1-8b" if args.part == "scoring" else "llama3.1-8b-2l")
    out = Path(args.out or f"results/bench/{args.part}.csv")
    chunks = args.chunks if args.part == "prefill" else [0]
    rows = []
    for context in args.contexts:
        for method in args.methods:
            for impl in args.impls:
                for chunk in chunks:
                    if method == "full" and impl != args.impls[0]:
                        continue  # nothing to score
                    matrix = 0 if method == "full" else dense_bytes(method, arch, context)
                    cell = {
                        "arch": arch, "method": method, "context": context, "impl": impl, "chunk": chunk,
                        "budget": args.budget, "device": args.device, "threads": args.threads,
                    }  # fmt: skip
                    if impl == "dense" and matrix > args.dense_limit_gib * 2**30:
                        result: dict[str, Any] = {"error": f"not run: dense matrix {matrix / 2**30:.0f} GiB"}
                    else:
                        result = run_child(args.part, cell, args.timeout)
                    row = {**cell, "dense_bytes": matrix, **result}
                    del row["threads"]
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    write_csv(out, rows)  # after every cell: a long run keeps what it measured
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
