"""Bench: RULER sample preparation per method run, without and with the sample cache (kvbench.storage.sample_cache).

Without the cache every method x budget run regenerates its RULER samples (RULER's size search tokenises the whole
prompt a dozen times per sample); with it the first run generates and stores them and every later run reads them.
For each task this measures, at ``--length`` (default 131072) with a real tokenizer and chat template:

* ``generate_s``: one run's preparation without the cache (what every run paid before);
* ``first_run_s``: the first run with the cache (generate + store);
* ``reuse_s``: each later run with the cache (read back), and that the samples are identical.

Writes a JSON report (default ``results/bench/sample_cache.json``) and prints a table.  Not a test: numbers depend on
the machine.  Example::

    python scripts/bench_sample_cache.py --tasks niah_single_1 niah_single_2 vt --samples 3
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import torch

from kvbench.models.loading import REAL_VOCAB_MODELS
from kvbench.models.tokenizers import build_tokenizer
from kvbench.storage.sample_cache import SampleCache
from kvbench.tasks.ruler import TASKS, build_ruler


def _task_cfg(task: str, length: int, samples: int):
    from types import SimpleNamespace

    return SimpleNamespace(
        name="ruler", kind="ruler", datasets=[task], data_dir=None, num_samples=samples, seed=42, length=length,
        lengths=None, options={"source": "shipped"},
    )  # fmt: skip


def _prepare(task: str, length: int, samples: int, tokenizer, cache: SampleCache | None) -> tuple[float, list]:
    """One run's sample preparation (build the dataset, get its samples); returns (seconds, samples as JSON)."""
    start = time.perf_counter()
    (dataset,) = build_ruler(_task_cfg(task, length, samples), tokenizer, chat_template=True)
    dataset.sample_cache = cache
    prepared = [s.to_json() for s in dataset.samples()]
    return time.perf_counter() - start, prepared


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["niah_single_1", "niah_single_2", "vt", "cwe", "qa_1"])
    parser.add_argument("--length", type=int, default=131072)
    parser.add_argument("--samples", type=int, default=3, help="samples per task (RULER's default is 500)")
    parser.add_argument("--model", default="random-llama3.1", choices=sorted(REAL_VOCAB_MODELS))
    parser.add_argument("--reuses", type=int, default=3, help="cached runs to time after the first")
    parser.add_argument("--out", default="results/bench/sample_cache.json")
    args = parser.parse_args(argv)
    unknown = [t for t in args.tasks if t not in TASKS]
    if unknown:
        parser.error(f"unknown RULER task(s) {unknown}; valid: {', '.join(TASKS)}")

    spec = REAL_VOCAB_MODELS[args.model]
    tokenizer = build_tokenizer(spec.tokenizer, spec.chat_template)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        cache = SampleCache(folder)
        for task in args.tasks:
            generate_s, reference = _prepare(task, args.length, args.samples, tokenizer, None)
            first_s, first = _prepare(task, args.length, args.samples, tokenizer, cache)
            reuse = [_prepare(task, args.length, args.samples, tokenizer, cache) for _ in range(args.reuses)]
            assert first == reference and all(samples == reference for _, samples in reuse), task
            reuse_s = sorted(seconds for seconds, _ in reuse)[len(reuse) // 2]
            stored = sum(p.stat().st_size for p in Path(folder, "ruler").glob(f"{task}-*.jsonl"))
            rows.append(
                {
                    "task": task,
                    "samples": args.samples,
                    "generate_s": round(generate_s, 3),
                    "generate_per_sample_s": round(generate_s / args.samples, 3),
                    "first_run_s": round(first_s, 3),
                    "reuse_s": round(reuse_s, 4),
                    "speedup": round(generate_s / reuse_s, 1),
                    "cache_bytes": stored,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    total_generate = sum(r["generate_s"] for r in rows)
    total_reuse = sum(r["reuse_s"] for r in rows)
    report = {
        "what": "RULER sample preparation per method run, without vs with the sample cache",
        "length": args.length,
        "model": args.model,
        "tokenizer": spec.tokenizer,
        "chat_template": spec.chat_template,
        "inputs": "shipped stand-ins (offline)",
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads",
        "tasks": rows,
        "total_generate_s": round(total_generate, 2),
        "total_reuse_s": round(total_reuse, 3),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"\n{'task':<16}{'no cache (s/run)':>18}{'per sample':>12}{'cached (s/run)':>16}{'speedup':>9}")
    for r in rows:
        line = f"{r['task']:<16}{r['generate_s']:>18.2f}{r['generate_per_sample_s']:>12.2f}{r['reuse_s']:>16.3f}"
        print(line + f"{r['speedup']:>8.0f}x")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
