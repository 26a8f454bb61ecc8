#!/usr/bin/env python
"""Per-method prefill cost and cache size on a small model (CPU-friendly).

For every method preset and context length: the prefill time *with eviction* divided by the full-cache prefill
time (median of ``--repeats``), decode ms/token, and the cache bytes kept after prefill.  Writes a CSV and prints
a table::

    python scripts/bench_methods.py --model tiny --lengths 1024 2048 4096 --budget 128L --out results/bench/methods.csv

This measures wall-clock time, so it belongs here and not in the unit tests.
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

import torch
from omegaconf import OmegaConf

from kvbench import resources
from kvbench.budget import parse_budget
from kvbench.config import MethodConfig, ModelConfig
from kvbench.eviction.base import build_method
from kvbench.inference.generate import generate
from kvbench.models.loading import load_model

DEFAULT_METHODS = ["full", "streamingllm", "h2o", "tova", "snapkv", "pyramidkv"]


def load_option(group: str, name: str, schema: type) -> object:
    """An option file of ``conf/<group>/`` merged into its schema (the way Hydra composes it)."""
    path = resources.conf_dir() / group / f"{name}.yaml"
    if not path.exists():
        valid = sorted(p.stem for p in (resources.conf_dir() / group).glob("*.yaml"))
        raise SystemExit(f"unknown {group} {name!r}; valid: {', '.join(valid)}")
    raw = OmegaConf.load(path)
    raw.pop("defaults", None)
    return OmegaConf.merge(OmegaConf.structured(schema), raw)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="a conf/model/ option (default: tiny)")
    parser.add_argument("--methods", nargs="+", default=DEFAULT_METHODS, help="conf/method/ options")
    parser.add_argument("--lengths", nargs="+", type=int, default=[1024, 2048, 4096], help="context lengths")
    parser.add_argument("--budget", default="128L", help="budget spec (e.g. 128L, 0.2x)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repetitions (median reported)")
    parser.add_argument("--decode-tokens", type=int, default=16, help="tokens generated for decode timing")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--out", default="results/bench/methods.csv", help="CSV output path")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model_cfg = load_option("model", args.model, ModelConfig)
    loaded = load_model(model_cfg)
    vocab = int(loaded.model.config.vocab_size)
    budget = parse_budget(args.budget)
    rows = []
    for length in args.lengths:
        ids = torch.randint(10, vocab, (length,), generator=torch.Generator().manual_seed(length)).tolist()
        full_prefill = None
        for name in args.methods:
            method = build_method(load_option("method", name, MethodConfig))
            method_budget = parse_budget("full") if name == "full" else budget
            prefill, decode, record = [], [], None
            for repeat in range(args.repeats + 1):  # the first run warms up
                out = generate(
                    loaded.model,
                    loaded.tokenizer,
                    ids,
                    [],
                    method=method,
                    budget=method_budget,
                    question_mode="aware",
                    max_new_tokens=args.decode_tokens,
                    stop_token_ids=set(),
                )
                if repeat:
                    prefill.append(out.prefill_s)
                    decode.append(out.decode_s / max(len(out.token_ids) - 1, 1))
                record = out.record
            assert record is not None
            prefill_s = statistics.median(prefill)
            if name == "full":
                full_prefill = prefill_s
            rows.append(
                {
                    "model": args.model,
                    "method": name,
                    "budget": method_budget.spec,
                    "context": length,
                    "prefill_s": round(prefill_s, 5),
                    "prefill_vs_full": round(prefill_s / full_prefill, 3) if full_prefill else "",
                    "decode_ms_per_token": round(1000 * statistics.median(decode), 3),
                    "cache_bytes_after_prefill": record.stored_bytes,
                    "kept_tokens_per_head_mean": round(
                        sum(map(sum, record.achieved_per_head)) / sum(map(len, record.achieved_per_head)), 1
                    ),
                    "threads": torch.get_num_threads(),
                    "device": str(loaded.device),
                }
            )
            print(
                f"{length:>6} {name:<14} prefill {prefill_s * 1000:8.1f} ms "
                f"(x{rows[-1]['prefill_vs_full'] or 1:.3f} of full)  decode {rows[-1]['decode_ms_per_token']:7.2f} "
                f"ms/tok  cache {record.stored_bytes / 2**20:7.3f} MiB",
                flush=True,
            )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
