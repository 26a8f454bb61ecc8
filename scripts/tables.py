#!/usr/bin/env python
"""Rebuild every paper table from our runs, next to the paper's numbers, plus plots (``make tables``).

    python scripts/tables.py --runs results/runs --paper results/paper --out results/tables --plots results/plots

For each table in ``results/paper`` writes ``<out>/<table>.{md,csv,tex}`` (ours / paper / difference, best in
bold and second underlined), ``<out>/index.md``, ``<out>/missing_runs.{md,csv}`` (every cell we cannot fill),
``<out>/runs.csv`` and ``<out>/runs_summary.{md,csv}`` (all runs), and PNG plots under ``--plots`` (score versus
budget per model and task; needle heatmaps).  ``--check-paper`` also writes ``<out>/paper_checks.csv``: every
printed average recomputed from the paper's own cells, with the known errata flagged.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd

from kvbench.reporting.aggregate import load_runs
from kvbench.reporting.paper_refs import TABLES, check_printed_aggregates, errata_keys, load_reference
from kvbench.reporting.plots import plot_needle_heatmaps, plot_score_vs_budget
from kvbench.reporting.tables import build_all, write_runs_overview, write_tables


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default="results/runs", help="root of the run folders")
    parser.add_argument("--paper", default="results/paper", help="folder of the paper reference CSVs")
    parser.add_argument("--out", default="results/tables", help="output folder for the tables")
    parser.add_argument("--plots", default="results/plots", help="output folder for the PNG plots")
    parser.add_argument("--tables", nargs="*", choices=sorted(TABLES), help="only these tables (default: all)")
    parser.add_argument("--formats", nargs="*", default=["md", "csv", "tex"], choices=["md", "csv", "tex"])
    parser.add_argument("--no-plots", action="store_true", help="skip the plots")
    parser.add_argument("--check-paper", action="store_true", help="also recompute the papers' printed averages")
    args = parser.parse_args(argv)

    runs = load_runs(args.runs)
    comparisons = build_all(runs, args.paper, args.tables)
    missing = write_tables(comparisons, args.out, args.formats)
    write_runs_overview(runs, args.out)
    filled = sum(int(c["ours"].notna().sum()) for c in comparisons.values())
    total = sum(len(c) for c in comparisons.values())
    print(
        f"{len(comparisons)} tables -> {args.out} ({filled}/{total} cells from {len(runs)} dataset results; "
        f"{len(missing)} missing runs listed in {Path(args.out) / 'missing_runs.md'})"
    )
    if args.check_paper:
        checks = pd.concat(
            [check_printed_aggregates(load_reference(t, args.paper), TABLES[t]) for t in comparisons],
            ignore_index=True,
        )
        known = errata_keys()
        checks["erratum"] = [(r.table, r.model, r.method, r.budget, r.column) in known for r in checks.itertuples()]
        checks.to_csv(Path(args.out) / "paper_checks.csv", index=False)
        unexpected = checks[~checks["within_tolerance"].astype(bool) & ~checks["erratum"]]
        print(
            f"paper checks: {len(checks)} printed aggregates recomputed, {int(checks['erratum'].sum())} known "
            f"errata, {len(unexpected)} unexpected mismatches"
        )
    if not args.no_plots:
        plots = plot_score_vs_budget(runs, args.plots) + plot_needle_heatmaps(runs, args.plots)
        print(f"{len(plots)} plots -> {args.plots}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
