#!/usr/bin/env python
"""Rebuild every paper table from our runs, next to the paper's numbers, plus plots (``make tables``).

    python scripts/tables.py --runs results/runs --paper results/paper --out results/tables --plots results/plots

For each table in ``results/paper`` writes ``<out>/<table>.{md,csv,tex}`` (ours / paper / difference in the
paper's layout and precision, best in bold and second underlined), ``<out>/all_tables.tex`` (one LaTeX document
of them all), ``<out>/index.md``, ``<out>/missing_runs.{md,csv}`` (every cell we cannot fill), ``<out>/runs.csv``
and ``<out>/runs_summary.{md,csv}`` (all runs), ``<out>/breakdowns.{md,csv}`` (every sub-score a run records beside
its headline: LongBench v2's difficulty and length buckets, SCBench's turns, pass@n; docs/dashboards.md), and PNG
plots under ``--plots`` (score versus budget per paper table with the paper's values dashed, and per model and task
of any runs; needle heatmaps per run and dataset).
``--pdf`` compiles ``all_tables.pdf`` (needs pdflatex; ``make tables-pdf``).  ``--check-paper`` also writes
``<out>/paper_checks.csv``: every printed average recomputed from the paper's own cells, errata flagged.

``--synthetic N`` first writes made-up runs (the papers' numbers plus Gaussian noise of standard deviation N,
marked ``synthetic`` everywhere they show) under ``--runs``: a demonstration of filled tables without a GPU.
Use a folder of its own for them (e.g. ``--runs results/synthetic_runs``), never ``results/runs``.

A ``--runs`` folder that does not exist or holds no run exits with status 2 and one line, before anything is written
(an empty set of tables never replaces the ones there).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import pandas as pd

from kvbench.errors import KVBenchError
from kvbench.reporting.aggregate import incomplete_run_notes, require_runs
from kvbench.reporting.breakdowns import write_breakdowns
from kvbench.reporting.paper_refs import (
    DEFAULT_PAPER_DIR,
    TABLES,
    check_printed_aggregates,
    errata_keys,
    load_reference,
)
from kvbench.reporting.plots import plot_needle_heatmaps, plot_paper_tables, plot_score_vs_budget
from kvbench.reporting.render import LatexError, compile_pdf
from kvbench.reporting.synthetic import write_synthetic_runs
from kvbench.reporting.tables import build_all, write_runs_overview, write_tables


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default="results/runs", help="root of the run folders")
    parser.add_argument(
        "--paper",
        default=str(DEFAULT_PAPER_DIR),
        help="folder of the paper reference CSVs (default: kvbench's shipped results/paper, from any folder)",
    )
    parser.add_argument("--out", default="results/tables", help="output folder for the tables")
    parser.add_argument("--plots", default="results/plots", help="output folder for the PNG plots")
    parser.add_argument("--tables", nargs="*", choices=sorted(TABLES), help="only these tables (default: all)")
    parser.add_argument("--formats", nargs="*", default=["md", "csv", "tex"], choices=["md", "csv", "tex"])
    parser.add_argument("--no-plots", action="store_true", help="skip the plots")
    parser.add_argument("--check-paper", action="store_true", help="also recompute the papers' printed averages")
    parser.add_argument("--pdf", action="store_true", help="compile <out>/all_tables.pdf with pdflatex")
    parser.add_argument(
        "--synthetic", type=float, metavar="NOISE", help="first write synthetic runs (paper + noise) under --runs"
    )
    args = parser.parse_args(argv)
    if args.pdf and "tex" not in args.formats:
        parser.error("--pdf needs the tex format")
    if args.synthetic is not None:
        if Path(args.runs).resolve() == Path("results/runs").resolve():  # the real runs of this working directory
            parser.error(
                "--synthetic writes made-up runs: give them a folder of their own (--runs ...), not results/runs"
            )
        n_files = write_synthetic_runs(args.runs, args.tables, noise=args.synthetic)
        print(f"{n_files} synthetic dataset results (paper + N(0, {args.synthetic:g}) noise) -> {args.runs}")

    try:
        runs = require_runs(args.runs)
    except KVBenchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for note in incomplete_run_notes(args.runs):  # issue #55: incomplete runs are listed, never ranked unflagged
        print(note, file=sys.stderr)
    comparisons = build_all(runs, args.paper, args.tables)
    missing = write_tables(comparisons, args.out, args.formats)
    write_runs_overview(runs, args.out)
    write_breakdowns(runs, args.out)
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
    if args.pdf:
        try:
            pdf = compile_pdf(Path(args.out) / "all_tables.tex")
        except LatexError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(f"PDF of every table -> {pdf}")
    if not args.no_plots:
        paper = plot_paper_tables(comparisons, args.plots, runs)
        plots = paper + plot_score_vs_budget(runs, args.plots) + plot_needle_heatmaps(runs, args.plots)
        print(f"{len(plots)} plots -> {args.plots} ({len(paper)} paper tables with their printed values dashed)")
    return 0


if __name__ == "__main__":
    # A warning (a metrics.json that disagrees with its rows, a duplicate run) as one line, without the source line.
    warnings.showwarning = lambda message, *args, **kwargs: print(f"warning: {message}", file=sys.stderr)
    raise SystemExit(main())
