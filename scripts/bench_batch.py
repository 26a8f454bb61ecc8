#!/usr/bin/env python
"""Batched decoding throughput (``run.decode_batch``, issue #33), writing CSV: decode tokens/s and samples/s against
the decode batch size, per model and method, at a fixed budget.

For each model, ``--prompts`` distinct seeded random prompts of ``--length`` tokens are prefilled once with the full
cache, recording every layer's queries, keys and values (``bench_decode.py``'s recorder); each (method, batch size)
then replays the recording into ``B`` samples' own caches and sessions (what a one-shot prefill gives each method),
and times ``--steps`` decoding steps of all ``B`` together.  ``path`` says how:

* ``batch1`` -- kvbench's batch-1 path (:func:`kvbench.inference.prefill.forward_logits` over one cache), the base of
  ``speedup_vs_1``;
* ``pooled`` -- what ``generate_batched`` runs (issue #46): the samples in one page pool per layer, one attention call
  and one decode-policy step per layer (:class:`kvbench.inference.decode_pool.PooledBatch`); at ``B = 1`` too, which
  separates the batching gain from the attention kernel's;
* ``rows`` -- the per-sample path it replaced (:func:`kvbench.inference.batched_decode.decode_step`: attention and
  policy per sample), for comparison (``--paths pooled rows``).

Every step is timed; the CSV has the medians.

* ``decode_tok_s`` = ``B / median step``, the step's CPU time (this process, all its threads): on a shared machine
  wall times follow the other jobs' load (the wall median is in ``step_wall_ms_median``);
* ``prefill_s``: CPU seconds of one real compressed prefill (:func:`kvbench.inference.prefill.prefill`) of the prompt
  with the method, once per (model, method);
* ``samples_s`` = ``B / (B * prefill_s + answer * median step)``: samples per second of a run whose samples all
  generate ``--answer`` tokens (LongBench-like: the median of LongBench's ``max_new_tokens`` is 64), prefilled one
  at a time and decoded ``B`` at a time.

Each row quotes the machine and the 1-minute load average before and after it (a shared machine)::

    OMP_NUM_THREADS=2 nice -n 5 python scripts/bench_batch.py --models tiny llama3.1-8b-2l \\
        --methods full snapkv ada_snapkv cake h2o --batches 1 2 4 8 16 32 --out docs/bench_batch/batch.csv

Models: :mod:`kvbench.bench.random_models` architectures (``tiny`` in float32, ``-2l`` 2-layer slices in bfloat16, as
``bench_decode.py``).  ``--profile B`` prints a torch profiler table of one step at batch 1 and at batch ``B``.
"""

from __future__ import annotations

import argparse
import copy
import csv
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from kvbench.bench.random_models import build_random_model, load_method
from kvbench.budget import parse_budget
from kvbench.cache.kv_cache import KVBenchCache
from kvbench.inference.batched_decode import decode_step
from kvbench.inference.decode_pool import PooledBatch
from kvbench.inference.eviction import EvictionSession
from kvbench.inference.prefill import build_cache, forward_logits, prefill

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_decode import PrefillRecorder, _LayerIndex

CPU = torch.device("cpu")
FIELDS = [
    *("model", "method", "budget", "prompt_tokens", "path", "decode_batch", "steps", "step_cpu_ms_median"),
    *("step_wall_ms_median", "decode_tok_s"),
    *("speedup_vs_1", "prefill_s", "answer_tokens", "samples_s", "machine", "loadavg_before", "loadavg_after"),
]


def record(model: torch.nn.Module, length: int, seed: int) -> tuple[PrefillRecorder, int, list[int]]:
    """One full-cache prefill of ``length`` seeded random tokens: the recording, the first new token, the ids."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, int(model.config.vocab_size), (length,), generator=generator).tolist()
    cache = KVBenchCache(int(model.config.num_hidden_layers), backend="torch")
    recorder = PrefillRecorder(cache)
    logits = forward_logits(model, ids, 0, cache, recorder, CPU)[-1]  # type: ignore[arg-type]  # a recording observer
    return recorder, int(torch.argmax(logits)), ids


def replay(model: torch.nn.Module, recording: PrefillRecorder, method: Any, budget: Any) -> EvictionSession:
    """A fresh cache + session holding the recorded prefill compressed by ``method`` (its own copy), ready to decode."""
    method = copy.deepcopy(method)
    session = EvictionSession(method, budget, build_cache(model, method))
    length = int(recording.layers[0][1].shape[1])
    session.begin_prefill(length)
    for index, (query, keys, values, scaling) in enumerate(recording.layers):
        session.cache.update(keys[None], values[None], index)
        session.after_attention(_LayerIndex(index), query[None], scaling)
    session.begin_decode()
    return session


def time_steps(
    model: torch.nn.Module,
    sessions: list[EvictionSession],
    first: list[int],
    length: int,
    steps: int,
    path: str = "pooled",
) -> tuple[float, float]:
    """Median wall and CPU (this process, all threads) seconds of ``steps`` greedy steps of every session together,
    on ``path`` (module docstring)."""
    tokens, walls, cpus = list(first), [], []
    pool = None
    if path == "pooled":
        pool = PooledBatch()
        for session in sessions:
            pool.join(session)
    for step in range(steps):
        started, cpu_started = time.perf_counter(), time.process_time()
        if pool is not None:
            logits = pool.step(model, tokens, [length + step] * len(sessions), CPU)
        elif path == "batch1":
            logits = forward_logits(model, [tokens[0]], length + step, sessions[0].cache, sessions[0], CPU)[-1:]
        else:
            logits = decode_step(model, tokens, [length + step] * len(sessions), sessions, CPU)
        tokens = logits.argmax(dim=-1).tolist()
        walls.append(time.perf_counter() - started)
        cpus.append(time.process_time() - cpu_started)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["tiny", "llama3.1-8b-2l"])
    parser.add_argument(
        "--methods", nargs="+", default=["full", "snapkv", "ada_snapkv", "cake", "h2o", "tova", "streamingllm", "ahakv"]
    )
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--budget", default="1024L")
    parser.add_argument("--length", type=int, default=4096, help="prompt tokens (LongBench-like: several K)")
    parser.add_argument("--prompts", type=int, default=2, help="distinct prompts (samples cycle over them)")
    parser.add_argument("--steps", type=int, default=8, help="timed decoding steps per row")
    parser.add_argument("--answer", type=int, default=64, help="tokens per answer for samples/s")
    parser.add_argument(
        "--paths",
        nargs="+",
        default=["pooled"],
        choices=["pooled", "rows"],
        help="batched paths to time (batch 1's own path is always timed first)",
    )
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    parser.add_argument("--out", default="results/bench/batch.csv")
    parser.add_argument("--profile", type=int, default=0, help="print a profile of one step at batch 1 and this")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    machine = f"{platform.machine()} {os.cpu_count()} cores, {args.threads} threads, torch {torch.__version__}"
    budget = parse_budget(args.budget)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as handle, torch.inference_mode():
        writer = csv.DictWriter(handle, FIELDS)
        writer.writeheader()
        for arch in args.models:
            dtype = torch.float32 if arch == "tiny" else torch.bfloat16
            model = build_random_model(arch, CPU, dtype)
            recordings = [record(model, args.length, seed) for seed in range(args.prompts)]
            for name in args.methods:
                method = load_method(name, arch)
                cpu_started = time.process_time()
                prefill(model, recordings[0][2], method=copy.deepcopy(method), budget=budget)
                prefill_s = time.process_time() - cpu_started
                base = None
                runs = [("batch1", 1)] + [
                    (path, b) for path in args.paths for b in args.batches if b > 1 or path == "pooled"
                ]
                for path, batch in runs:
                    before = os.getloadavg()[0]
                    picks = [recordings[i % len(recordings)] for i in range(batch)]
                    sessions = [replay(model, rec, method, budget) for rec, _, _ in picks]
                    firsts = [first for _, first, _ in picks]
                    wall, step = time_steps(model, sessions, firsts, args.length, args.steps, path)
                    if args.profile and batch in (1, args.profile) and path != "rows":  # batch1, and pooled
                        profile(model, [replay(model, rec, method, budget) for rec, _, _ in picks], firsts,
                                args.length, path)  # fmt: skip
                    base = base or step
                    row = {
                        "model": arch, "method": name, "budget": budget.spec, "prompt_tokens": args.length,
                        "path": path, "decode_batch": batch, "steps": args.steps,
                        "step_cpu_ms_median": round(1000 * step, 2),
                        "step_wall_ms_median": round(1000 * wall, 2),
                        "decode_tok_s": round(batch / step, 2), "speedup_vs_1": round(batch * base / step, 2),
                        "prefill_s": round(prefill_s, 3), "answer_tokens": args.answer,
                        "samples_s": round(batch / (batch * prefill_s + args.answer * step), 4), "machine": machine,
                        "loadavg_before": round(before, 2), "loadavg_after": round(os.getloadavg()[0], 2),
                    }  # fmt: skip
                    writer.writerow(row)
                    handle.flush()
                    print(", ".join(f"{k}={v}" for k, v in row.items() if k != "machine"), flush=True)
            del model


def profile(model: torch.nn.Module, sessions: list[EvictionSession], first: list[int], length: int, path: str) -> None:
    """A torch profiler table of two steps of these fresh sessions on ``path`` (by self CPU time; a pooled batch is
    joined before the profiler starts)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    pool = None
    if path == "pooled":
        pool = PooledBatch()
        for session in sessions:
            pool.join(session)
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for step in range(2):
            if pool is not None:
                pool.step(model, first, [length + step] * len(sessions), CPU)
            else:
                forward_logits(model, [first[0]], length + step, sessions[0].cache, sessions[0], CPU)
    print(f"--- profile, {path}, batch {len(sessions)} (2 steps)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))


if __name__ == "__main__":
    main()
