#!/usr/bin/env python
"""A sweep's cost, shared prefill against one job at a time (issue #56), writing CSV.

One bench run times both ways of running the same jobs (``--methods`` x ``--budgets``) over the same seeded random
prompts of ``--prompt-tokens`` tokens, each answer ``--new-tokens`` tokens (greedy, no stop token):

* ``alone``: every job prefills every sample itself (:func:`kvbench.inference.prefill.prefill`), then decodes
  (:func:`kvbench.inference.generate.decode_prefilled`) -- what every harness does;
* ``shared``: one prefill forward per sample for all jobs (:func:`kvbench.inference.shared_prefill.shared_prefill`:
  each job compresses its own copy of every layer), then each job decodes alone.

Times are this process's CPU time (``time.process_time``, one torch thread: a loaded shared machine disturbs it less
than the wall clock), split into prefill (the forward, compression, question) and decode, with the wall clock and
the load average beside them.  The script checks that both ways give every job the same tokens (``identical``).
Rows: one per mode, then ``ratio`` (alone / shared).  ``docs/performance.md`` projects the split to a GPU::

    OMP_NUM_THREADS=1 nice -n 5 python scripts/bench_sweep.py --arch llama3.1-8b-2l --prompt-tokens 8192 \\
        --new-tokens 16 --samples 1 --out results/bench/sweep.csv

Architectures: :mod:`kvbench.bench.random_models` (``llama3.1-8b-2l``: the 2-layer Llama-3.1-8B slice, random
weights, float32 on CPU by default).
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from kvbench import resources
from kvbench.bench.random_models import ARCHITECTURES, build_random_model, load_method
from kvbench.budget import parse_budget
from kvbench.config import MethodConfig
from kvbench.eviction.base import build_method
from kvbench.inference.generate import decode_prefilled
from kvbench.inference.prefill import prefill
from kvbench.inference.shared_prefill import PrefillJob, shared_prefill

#: Four one-shot methods (prefill compression only) with the same cache layout (KV heads): one group.
METHODS = ("snapkv_kvpress", "pyramidkv_kvpress", "knorm", "expected_attention_kvpress")
BUDGETS = ("256L", "512L", "1024L", "2048L")
FIELDS = ["mode", "arch", "prompt_tokens", "new_tokens", "jobs", "samples", "prefill_cpu_s", "decode_cpu_s",
          "total_cpu_s", "wall_s", "identical", "load_before", "load_after", "machine"]  # fmt: skip


class TokenIds:
    """The tokenizer of random weights: a text is its token ids (nothing stops on a string)."""

    @staticmethod
    def decode(ids: list[int], skip_special_tokens: bool = True) -> str:
        return " ".join(map(str, ids))


def method_named(name: str, arch: str):
    """A preset of conf/method, else a one-class family at its defaults."""
    presets = {path.stem for path in (resources.conf_dir() / "method").glob("*.yaml")}
    if name in presets:
        return load_method(name, arch)
    return build_method(OmegaConf.merge(OmegaConf.structured(MethodConfig), {"name": name, "family": name}))


def prompts(count: int, tokens: int, vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(7)
    return [torch.randint(10, vocab, (tokens,), generator=generator).tolist() for _ in range(count)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="llama3.1-8b-2l", choices=sorted(ARCHITECTURES))
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--prompt-tokens", type=int, default=8192)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--samples", type=int, default=1)
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--budgets", nargs="+", default=list(BUDGETS))
    parser.add_argument("--prefill-chunk", type=int, default=None, help="run.prefill_chunk (default: automatic)")
    parser.add_argument(
        "--alone-jobs",
        type=int,
        default=None,
        help="time only this many of the jobs alone (spread over the list; the alone row then covers those jobs, "
        "and no ratio row is written): for a machine too slow for every job's own prefill",
    )
    parser.add_argument("--out", type=Path, default=Path("results") / "bench" / "sweep.csv")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model = build_random_model(args.arch, torch.device("cpu"), getattr(torch, args.dtype))
    jobs = [(name, budget) for name in args.methods for budget in args.budgets]
    methods = {name: method_named(name, args.arch) for name in args.methods}
    samples = prompts(args.samples, args.prompt_tokens, int(model.config.vocab_size))
    machine = f"{platform.node()} ({os.cpu_count()} cores)"
    count = len(jobs) if args.alone_jobs is None else max(1, min(args.alone_jobs, len(jobs)))
    spread = [jobs[round(i * (len(jobs) - 1) / max(count - 1, 1))] for i in range(count)]
    alone_jobs = jobs if count == len(jobs) else spread
    rows, tokens = [], {}
    for mode in ("shared", "alone"):
        load_before = os.getloadavg()[0]
        prefill_s = decode_s = 0.0
        wall = time.perf_counter()
        with torch.inference_mode():
            for index, prompt in enumerate(samples):
                start = time.process_time()
                if mode == "shared":
                    batch = [PrefillJob(methods[name], parse_budget(budget)) for name, budget in jobs]
                    states = shared_prefill(model, prompt, [], batch, prefill_chunk=args.prefill_chunk)
                    prefill_s += time.process_time() - start
                    for job, state in zip(jobs, states, strict=True):
                        start = time.process_time()
                        output = decode_prefilled(model, TokenIds(), state, args.new_tokens, set())
                        decode_s += time.process_time() - start
                        tokens[(mode, index, job)] = output.token_ids
                    continue
                for job in alone_jobs:
                    start = time.process_time()
                    state = prefill(model, prompt, method=methods[job[0]], budget=parse_budget(job[1]),
                                    prefill_chunk=args.prefill_chunk)  # fmt: skip
                    prefill_s += time.process_time() - start
                    start = time.process_time()
                    output = decode_prefilled(model, TokenIds(), state, args.new_tokens, set())
                    decode_s += time.process_time() - start
                    tokens[(mode, index, job)] = output.token_ids
        rows.append({"mode": mode, "prefill_cpu_s": prefill_s, "decode_cpu_s": decode_s,
                     "total_cpu_s": prefill_s + decode_s, "wall_s": time.perf_counter() - wall,
                     "load_before": load_before, "load_after": os.getloadavg()[0]})  # fmt: skip
        print(f"{mode}: prefill {prefill_s:.1f} s CPU, decode {decode_s:.1f} s CPU", flush=True)
    keys = [(index, job) for index in range(len(samples)) for job in alone_jobs]
    identical = all(tokens[("shared", *key)] == tokens[("alone", *key)] for key in keys)
    shared, alone = rows
    ratio = {key: alone[key] / shared[key] if shared[key] else float("nan") for key in
             ("prefill_cpu_s", "decode_cpu_s", "total_cpu_s", "wall_s")}  # fmt: skip
    if len(alone_jobs) == len(jobs):
        rows.append({"mode": "ratio", **ratio})
    else:
        alone["mode"] = f"alone ({len(alone_jobs)} of the jobs: {' '.join('/'.join(job) for job in alone_jobs)})"
    common = {"arch": args.arch, "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
              "jobs": len(jobs), "samples": len(samples), "identical": identical, "machine": machine}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        for row in rows:
            writer.writerow({**common, **{k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}})
    if len(alone_jobs) == len(jobs):
        print(f"alone / shared total CPU: {ratio['total_cpu_s']:.2f}x; identical tokens: {identical}; {args.out}")
    else:
        print(f"{len(alone_jobs)} of {len(jobs)} jobs timed alone; identical tokens: {identical}; {args.out}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
