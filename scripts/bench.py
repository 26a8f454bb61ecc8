#!/usr/bin/env python
"""Performance bench: prefill time, decode ms/token, peak memory and cache bytes vs context length per method
(versus the full cache) on random-weight models of real architectures, storage micro-benchmarks, and the papers'
efficiency tables rebuilt beside the paper numbers.  Writes CSVs, Markdown tables and PNG plots under ``--out``.

    python scripts/bench.py --preset cpu                     # this machine, a few minutes (make bench)
    python scripts/bench.py --preset gpu                     # real sizes on a CUDA GPU (H200-class)
    python scripts/bench.py --preset gpu --archs mistral-7b --contexts 131072 --methods full snapkv \\
        --decode-tokens 64 --out results/bench/gpu_128k      # one slice of it

Filters (--archs, --methods, --contexts, --backends) keep only the matching cells of the preset; --budget,
--decode-tokens, --page-size, --repeats, --prefill-chunk, --scoring-impl override every cell.  See kvbench/bench/
for what is measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch

from kvbench.bench import ARCHITECTURES, preset, rebuild_from_csv, run_plan


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="cpu", choices=["cpu", "gpu", "smoke"], help="cell list to start from")
    parser.add_argument("--out", default="results/bench", help="output folder")
    parser.add_argument("--archs", nargs="+", choices=sorted(ARCHITECTURES), help="keep these architectures")
    parser.add_argument("--methods", nargs="+", help="keep these conf/method presets")
    parser.add_argument("--contexts", nargs="+", type=int, help="replace the context lengths")
    parser.add_argument("--backends", nargs="+", choices=["auto", "torch", "paged"], help="replace the backends")
    parser.add_argument("--budget", help="budget of every evicting cell (e.g. 1024L, 128L, 0.2x)")
    parser.add_argument("--decode-tokens", type=int, help="tokens decoded per cell")
    parser.add_argument("--page-size", type=int, help="paged backend page size (multiple of 256 -> varlen_attn)")
    parser.add_argument("--repeats", type=int, help="timed repetitions per cell (median)")
    parser.add_argument("--prefill-chunk", type=int, help="tokens per prefill forward (0: one forward)")
    parser.add_argument("--scoring-impl", choices=["auto", "triton", "torch", "dense"], help="scorers' kernels")
    parser.add_argument("--device", help="cpu / cuda / cuda:N (default: the preset's)")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], help="model dtype")
    parser.add_argument("--peak-gbps", type=float, help="peak memory bandwidth for the decode fraction")
    parser.add_argument("--no-micro", action="store_true", help="skip the append / bytes micro-benchmarks")
    parser.add_argument("--micro-sizes", nargs="+", type=int, help="cache sizes of the append micro-benchmark")
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    parser.add_argument("--from-csv", help="only rebuild tables and plots from this bench.csv (no runs)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.from_csv:
        tables = rebuild_from_csv(Path(args.from_csv), Path(args.out))
        print(json.dumps(tables, indent=2))
        return {"tables": tables}
    plan = preset(args.preset)
    specs = plan.specs
    if args.archs:
        specs = [s for s in specs if s.arch in args.archs]
    if args.methods:
        specs = [s for s in specs if s.method in args.methods]
        known = {s.method for s in specs}
        base = {(s.arch, s.context, s.backend): s for s in specs}
        for key, spec in base.items():  # methods not in the preset: add them on the preset's grid
            for method in args.methods:
                if method not in known:
                    specs.append(dataclasses.replace(spec, method=method))
            del key
    if args.contexts:
        grid = {(s.arch, s.method, s.backend): s for s in specs}
        specs = [dataclasses.replace(s, context=n) for s in grid.values() for n in args.contexts]
    if args.backends:
        grid = {(s.arch, s.method, s.context): s for s in specs}
        specs = [dataclasses.replace(s, backend=b) for s in grid.values() for b in args.backends]
    overrides = {
        "budget": args.budget,
        "decode_tokens": args.decode_tokens,
        "page_size": args.page_size,
        "repeats": args.repeats,
        "prefill_chunk": args.prefill_chunk,
        "scoring_impl": args.scoring_impl,
    }
    overrides = {k: v for k, v in overrides.items() if v is not None}
    specs = [dataclasses.replace(s, **overrides) for s in specs]
    # One model build per arch; backends interleaved cell by cell, so load changes on a shared machine hit both.
    specs.sort(key=lambda s: (list(ARCHITECTURES).index(s.arch), s.context, s.method != "full", s.method, s.backend))
    if not specs:
        raise SystemExit("no cells left after the filters")
    plan = dataclasses.replace(plan, specs=specs)
    if args.device:
        plan.device = args.device
    if args.dtype:
        plan.dtype = args.dtype
    if args.peak_gbps:
        plan.peak_gbps = args.peak_gbps
    if args.no_micro:
        plan.micro = False
    if args.micro_sizes:
        plan.micro_sizes = args.micro_sizes
    out = Path(args.out)
    summary = run_plan(plan, out, log=lambda line: print(line, flush=True))
    print(json.dumps(summary.get("targets", {}), indent=2))
    print(f"wrote {out}/ (bench.csv, append.csv, bytes.csv, cake_t13.*, adakv_max_context.*, xkv_t4.*, *.png)")
    return summary


if __name__ == "__main__":
    main()
