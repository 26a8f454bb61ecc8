#!/usr/bin/env python
"""Time ``python run.py`` (the embedded default: four runs of 3 datasets x 10 samples) from a fresh folder.

Each repetition runs ``run.py`` in a new temporary working directory (no results, no stored samples: what a fresh
clone does) and records its wall time, its CPU time (user + system, from ``getrusage`` of the child), the load
average before and after, and the number of cores, to ``results/bench/default_run.csv``.  CPU seconds depend little
on what else the machine runs; wall seconds on a shared machine do, so the load is part of every row.  The command
runs as a user types it: no thread setting in its environment (the embedded default sets its own, one torch thread:
:data:`kvbench.app.demo.DEMO_THREADS`); ``--print-table`` also prints the table the run printed::

    python scripts/time_default_run.py --repeat 1 [--checkout PATH] [--label mine]

``--checkout`` times another checkout's ``run.py`` (e.g. the main branch, for a before/after pair).
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvbench.resources import checkout_dir

REPO = checkout_dir() or Path.cwd()
FIELDS = ["label", "checkout", "wall_s", "cpu_s", "load1_before", "load1_after", "cores", "exit_status"]


def time_once(checkout: Path) -> dict[str, object]:
    """One ``python run.py`` in a fresh temporary folder, with ``checkout`` first on the import path."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # timed as typed: the run chooses its own thread count
        env.pop(name, None)
    with tempfile.TemporaryDirectory(prefix="kvbench-time-") as folder:
        before_usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        load_before = os.getloadavg()[0]
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, str(checkout / "run.py")], cwd=folder, env=env, capture_output=True, text=True
        )
        wall = time.perf_counter() - start
        after_usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after_usage.ru_utime - before_usage.ru_utime) + (after_usage.ru_stime - before_usage.ru_stime)
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
    return {
        "stdout": done.stdout,
        "checkout": str(checkout),
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "load1_before": round(load_before, 2),
        "load1_after": round(os.getloadavg()[0], 2),
        "cores": os.cpu_count(),
        "exit_status": done.returncode,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--checkout", type=Path, default=REPO)
    parser.add_argument("--label", default="this checkout")
    parser.add_argument("--out", type=Path, default=Path("results/bench/default_run.csv"))
    parser.add_argument("--print-table", action="store_true", help="print what each run printed after its row")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    new_file = not args.out.exists()
    with args.out.open("a", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        if new_file:
            writer.writeheader()
        for _ in range(args.repeat):
            row = {"label": args.label, **time_once(args.checkout.resolve())}
            printed = str(row.pop("stdout"))
            writer.writerow(row)
            handle.flush()
            print(row, flush=True)
            if args.print_table:
                print(printed, flush=True)


if __name__ == "__main__":
    main()
