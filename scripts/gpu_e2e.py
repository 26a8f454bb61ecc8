#!/usr/bin/env python
"""End to end on real-size architectures (issue #18, part 1): every method family, one LongBench-fixture sample and
one RULER sample, through :func:`kvbench.evaluate`, with random bf16 weights and the papers' real tokenizers.

Writes one CSV row per (architecture, method, task): status, seconds, requested == achieved cache lengths
(``allocation_exact`` of every prediction row), kept fraction, the error if any.  Meant for a GPU machine::

    python scripts/gpu_e2e.py --device cuda --out $OUT/e2e.csv                       # both archs, all families
    python scripts/gpu_e2e.py --archs mistral-7b-2l --device cpu --ruler-length 4096 \\
        --methods snapkv cake --out /tmp/e2e.csv                                       # CPU smoke check

A benchmark-style script that writes numbers, not a test.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
import traceback
from pathlib import Path

#: One preset per method family (conf/method/), the budget they run at, and NACL's short-prompt variant off.
FAMILY_PRESETS = [
    "streamingllm",
    "h2o",
    "tova",
    "snapkv",
    "pyramidkv",
    "ada_snapkv",
    "cake",
    "ahakv",
    "xkv",
    "nacl",
]
#: Architecture -> (real tokenizer, chat template, conf/model preset whose prompt settings apply); the 2-layer
#: Llama slice has a 32K vocabulary, too small for the Llama-3 tokenizer, so only Mistral's slice is here.
ARCH_TOKENIZERS = {
    "llama3.1-8b": ("llama3", "llama3.1", "llama3.1-8b-instruct"),
    "mistral-7b": ("mistral-v3", "mistral-v0.3", "mistral-7b-instruct-v0.3"),
    "mistral-7b-2l": ("mistral-v3", "mistral-v0.3", "mistral-7b-instruct-v0.3"),
}


def run_one(model, tokenizer, preset: str, method: str, budget: str, task: str, overrides: list[str]) -> dict:
    import kvbench

    start = time.perf_counter()
    evaluation = kvbench.evaluate(
        model, tokenizer, method=method, budget=budget, task=task, limit=1, model_config=preset, overrides=overrides
    )
    rows = [row for rows in evaluation.predictions.values() for row in rows]
    exact = [row["cache"]["requested_per_head"] == row["cache"]["achieved_per_head"] for row in rows]
    kept = [r.mean_kept_fraction for r in evaluation.results]
    return {
        "status": "ok",
        "seconds": round(time.perf_counter() - start, 2),
        "samples": len(rows),
        "allocation_exact": all(exact) and bool(exact),
        "kept_fraction": round(sum(kept) / max(1, len(kept)), 4),
        "context_tokens": max((row.get("cache", {}).get("context_tokens", 0) for row in rows), default=0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archs", nargs="+", default=["mistral-7b", "llama3.1-8b"], choices=sorted(ARCH_TOKENIZERS))
    parser.add_argument("--methods", nargs="+", default=FAMILY_PRESETS)
    parser.add_argument("--budget", default="1024L")
    parser.add_argument("--ruler-length", type=int, default=32768)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=Path("results/bench/e2e.csv"))
    args = parser.parse_args()

    import torch

    from kvbench.bench.random_models import build_random_model
    from kvbench.models.tokenizers import build_tokenizer

    tasks = {
        "longbench": ["task=longbench", "task.data_dir=fixtures", "task.datasets=[qasper]"],
        "ruler": ["task=ruler", f"task.length={args.ruler_length}", "task.datasets=[niah_single_1]"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fields = ["arch", "method", "task", "status", "seconds", "samples", "allocation_exact", "kept_fraction"]
    fields += ["context_tokens", "error"]
    with args.out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for arch in args.archs:
            tokenizer_name, template, preset = ARCH_TOKENIZERS[arch]
            tokenizer = build_tokenizer(tokenizer_name, template)
            model = build_random_model(arch, torch.device(args.device), torch.bfloat16)
            for method in args.methods:
                for task, task_overrides in tasks.items():
                    row = {"arch": arch, "method": method, "task": task}
                    try:
                        row.update(run_one(model, tokenizer, preset, method, args.budget, task_overrides[0][5:],
                                           task_overrides[1:]))  # fmt: skip
                    except Exception as err:  # a failing cell is a result; the next cells still run
                        row.update(status="error", error=f"{type(err).__name__}: {err}"[:300])
                        traceback.print_exc()
                    writer.writerow(row)
                    handle.flush()
                    print(json.dumps(row), flush=True)
            del model
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
