#!/usr/bin/env python
"""Collect every run under ``results/runs`` into one tidy table (one row per model x task x method x budget x
dataset), discovered from the runs' own ``metrics.json`` files.

    python scripts/aggregate.py --runs results/runs --out results/tables/runs.csv

Writes the tidy CSV (``--out``) and, next to it, ``runs_summary.{csv,md}`` (one row per run, one column per
dataset); ``--settings`` adds one ``setting.<key>`` column per method/budget setting.  A ``--runs`` folder that does
not exist or holds no run exits with status 2 and one line, writing nothing (never an empty table over one there).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvbench.errors import KVBenchError
from kvbench.reporting.aggregate import expand_settings, require_runs, run_summary
from kvbench.reporting.tables import write_runs_overview


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default="results/runs", help="root of the run folders")
    parser.add_argument("--out", default="results/tables/runs.csv", help="tidy CSV to write")
    parser.add_argument("--settings", action="store_true", help="expand settings into setting.<key> columns")
    parser.add_argument("--strict", action="store_true", help="fail on an unreadable metrics.json")
    args = parser.parse_args(argv)

    try:
        runs = require_runs(args.runs, strict=args.strict)
    except KVBenchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = Path(args.out)
    write_runs_overview(runs, out.parent)
    table = expand_settings(runs) if args.settings else runs
    table.to_csv(out, index=False)
    n_runs = len(run_summary(runs))
    print(f"{len(runs)} dataset results from {n_runs} runs under {args.runs} -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
