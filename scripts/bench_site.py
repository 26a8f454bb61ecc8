#!/usr/bin/env python
"""How long ``kvbench report`` takes: a cold build of N made-up run folders, a rebuild with nothing changed, and a
rebuild after one run changed (the incremental cache at work).

    python scripts/bench_site.py --runs 500 --out results/bench/site.csv

The run folders (under ``--work``, default a temporary folder) have what a real run folder has -- ``config.yaml``,
``run_meta.json``, ``summary.json``, and per dataset ``metrics.json`` and ``predictions.jsonl`` with needle depths
and lengths (so every run has heatmaps) -- with made-up scores (flagged ``synthetic``).  The runs are spread over
models × methods × budgets; each has ``--datasets`` datasets of ``--samples`` predictions.  Writes one CSV row per
build (phase, runs, seconds, cache hits, the page's size) with the machine's CPU count and load average.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import random
import tempfile
import time
from pathlib import Path

from kvbench.reporting.site import build_site
from kvbench.storage.writers import run_dir

METHODS = ("streamingllm", "h2o", "tova", "snapkv", "pyramidkv", "ada_snapkv", "cake", "ahakv", "xkv", "nacl")
BUDGETS = ("64L", "96L", "128L", "256L", "512L", "1024L", "2048L", "32L", "48L", "768L")


def write_run(root: Path, index: int, datasets: int, samples: int, rng: random.Random) -> Path:
    """One made-up run folder (the ``index``-th combination of model, method and budget)."""
    method = METHODS[index % len(METHODS)]
    budget = BUDGETS[(index // len(METHODS)) % len(BUDGETS)]
    model = f"model{index // (len(METHODS) * len(BUDGETS))}"
    folder = run_dir(root, model, "ruler", method, budget, None)
    rows = []
    for d in range(datasets):
        name = f"niah_{d}"
        (folder / name).mkdir(parents=True, exist_ok=True)
        preds = []
        for s in range(samples):
            preds.append(
                {
                    "id": f"{name}-{s}",
                    "prediction": "x",
                    "answers": ["x" if rng.random() < 0.7 else "y"],
                    "input_tokens": 4096,
                    "extra": {"depth": 10.0 * (s % 11), "target_length": 1024 * (1 + s % 4)},
                }
            )
        (folder / name / "predictions.jsonl").write_text("".join(json.dumps(p) + "\n" for p in preds))
        score = 100 * rng.random()
        rows.append({"dataset": name, "score": score, "ci95": [max(0.0, score - 5), min(100.0, score + 5)]})
        metrics = {
            "model": model,
            "task": "ruler",
            "dataset": name,
            "method": method,
            "budget": budget,
            "tag": None,
            "metric": "string_match_all",
            "score": score,
            "n_samples": samples,
            "config_hash": f"h{index}",
            "question_mode": "aware",
            "synthetic": True,
            "cache": {"mean_requested_per_layer": [float(budget[:-1])] * 4, "mean_kept_fraction": 0.1},
            "settings": {"method_family": method},
        }
        (folder / name / "metrics.json").write_text(json.dumps(metrics))
    mean = sum(r["score"] for r in rows) / len(rows)
    (folder / "summary.json").write_text(json.dumps({"datasets": rows, "averages": {"mean": {"score": mean}}}))
    (folder / "run_meta.json").write_text(json.dumps({"config_hash": f"h{index}", "status": "complete"}))
    (folder / "config.yaml").write_text(f"run:\n  experiment: bench{index % 3}\nmethod:\n  name: {method}\n")
    return folder


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--datasets", type=int, default=3)
    parser.add_argument("--samples", type=int, default=44)
    parser.add_argument("--work", default=None, help="folder for the made-up runs and the site (default: temporary)")
    parser.add_argument("--out", default="results/bench/site.csv")
    args = parser.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="kvbench-site-bench-"))
    rng = random.Random(0)
    folders = [write_run(work / "runs", i, args.datasets, args.samples, rng) for i in range(args.runs)]
    rows = []
    for phase in ("cold", "unchanged", "one run changed"):
        if phase == "one run changed":
            metrics = folders[0] / "niah_0" / "metrics.json"
            metrics.write_text(json.dumps({**json.loads(metrics.read_text()), "score": 1.0}))
        start = time.perf_counter()
        result = build_site(work / "runs", work / "site")
        seconds = time.perf_counter() - start
        rows.append(
            {
                "phase": phase,
                "runs": result.n_runs,
                "datasets_per_run": args.datasets,
                "samples_per_dataset": args.samples,
                "seconds": round(seconds, 2),
                "cache_hits": result.cache_hits,
                "index_html_bytes": result.index.stat().st_size,
                "cpus": os.cpu_count(),
                "load_avg_1min": round(os.getloadavg()[0], 2),
                "machine": platform.machine(),
                "python": platform.python_version(),
            }
        )
        print(f"{phase}: {result.n_runs} runs in {seconds:.1f} s ({result.cache_hits} from the cache)", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"-> {out} (site: {work / 'site' / 'index.html'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
