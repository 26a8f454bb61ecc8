#!/usr/bin/env python
"""Peak extra memory and time of H2O's prefill scores: row-blocked column sums vs the dense ``S x S`` reference.

H2O scores every context token by the attention it receives from *every* prompt query.  The dense computation
materialises ``H_q x S x S`` float32 probabilities (64 GiB per head at 128K); :func:`kvbench.kernels.causal_column_sums`
processes the query rows in blocks, so its extra memory is ``H_q x block x S`` floats (capped by
``--block-mib``).  Each measurement runs in a fresh subprocess; on CPU the peak is the growth of the process's
maximum resident set size over the inputs, on CUDA ``torch.cuda.max_memory_allocated``.  Writes a CSV::

    python scripts/bench_h2o_scores.py --contexts 4096 8192 16384 131072 --dense-up-to 16384 \\
        --out results/bench/h2o_scores.csv

A benchmark that writes numbers, not a test.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

_CHILD = r"""
import json, resource, sys, time
import torch
from kvbench.kernels import causal_column_sums
from kvbench.kernels.reference import causal_column_sums_reference
impl, context, heads, kv_heads, dim, block_mib, device = {args!r}
torch.manual_seed(0)
queries = torch.randn(heads, context, dim, device=device)
keys = torch.randn(kv_heads, context, dim, device=device)
if device == "cuda":
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats(); base = torch.cuda.memory_allocated()
else:
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
start = time.perf_counter()
if impl == "blocked":
    out = causal_column_sums(queries, keys, dim ** -0.5, max_block_bytes=block_mib << 20)
else:
    out = causal_column_sums_reference(queries, keys, dim ** -0.5)
if device == "cuda":
    torch.cuda.synchronize(); peak = torch.cuda.max_memory_allocated() - base
else:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
print(json.dumps({{"seconds": time.perf_counter() - start, "peak_extra_bytes": int(peak),
                  "checksum": float(out.sum())}}))
"""


def measure(impl: str, context: int, heads: int, kv_heads: int, dim: int, block_mib: int, device: str) -> dict:
    code = _CHILD.format(args=(impl, context, heads, kv_heads, dim, block_mib, device))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        return {"seconds": "", "peak_extra_bytes": "", "error": result.stderr.strip().splitlines()[-1][:200]}
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", nargs="+", type=int, default=[4096, 8192, 16384, 32768])
    parser.add_argument("--dense-up-to", type=int, default=8192, help="largest context run with the dense reference")
    parser.add_argument("--heads", type=int, default=4, help="query heads")
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--block-mib", type=int, default=64, help="cap of the blocked path's probability block")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default="results/bench/h2o_scores.csv")
    args = parser.parse_args()
    rows = []
    for context in args.contexts:
        for impl in ("blocked", "dense"):
            if impl == "dense" and context > args.dense_up_to:
                continue
            got = measure(impl, context, args.heads, args.kv_heads, args.dim, args.block_mib, args.device)
            row = {
                "impl": impl,
                "context": context,
                "heads": args.heads,
                "dim": args.dim,
                "block_mib": args.block_mib if impl == "blocked" else "",
                "dense_matrix_bytes": args.heads * context * context * 4,
                **got,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fields = sorted({key for row in rows for key in row}, key=lambda k: list(rows[0]).index(k) if k in rows[0] else 99)
    with open(out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
