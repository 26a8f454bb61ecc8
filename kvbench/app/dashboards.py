"""``kvbench report`` and ``kvbench wandb-report``: the two dashboards' command lines.

* ``kvbench report [RUNS] --out results/site [--experiment X] [--title T] [--single-file]``: the offline results site
  (:mod:`kvbench.reporting.site`).
* ``kvbench wandb-report --entity E --project P [RUNS] [--experiment X] [--title T] [--dry-run] [--out F]``: the
  W&B Report (:mod:`kvbench.reporting.wandb_report`); ``--dry-run`` writes the report's specification JSON to
  ``--out`` (default ``results/wandb_report.json``) without a network (``--entity`` / ``--project`` optional).

Both check their input before writing anything and raise :class:`~kvbench.errors.KVBenchError` on bad input, which
:func:`kvbench.app.cli.main` reports as ``error: <message>`` with exit status 2 (argparse's usage errors also exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence

from kvbench.errors import KVBenchError


def _runs_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="?", default="results/runs", help="folder holding the run folders")
    parser.add_argument("--experiment", default=None, help="only the runs of this experiment (run.experiment)")
    parser.add_argument("--title", default=None, help="title of the site or report")


def report_main(argv: Sequence[str]) -> int:
    """``kvbench report``: build the static results site; returns the exit status."""
    parser = argparse.ArgumentParser(prog="kvbench report", description="Build the offline results site.")
    _runs_argument(parser)
    parser.add_argument("--out", default="results/site", help="folder of the site (index.html)")
    parser.add_argument(
        "--single-file", action="store_true", help="inline Plotly into index.html: one self-contained file to share"
    )
    args = parser.parse_args(list(argv))
    from kvbench.reporting.site import build_site
    from kvbench.storage.paths import check_output_folder

    args.out = check_output_folder(args.out, "--out")

    result = build_site(args.runs, args.out, args.experiment, args.title or "kvbench results", args.single_file)
    from kvbench.reporting.aggregate import incomplete_run_notes

    for note in incomplete_run_notes(args.runs):  # issue #55: incomplete runs are listed, never ranked unflagged
        print(note, file=sys.stderr)
    print(
        f"{result.n_runs} runs -> {result.index} ({result.cache_hits} unchanged, read from the cache; "
        f"{result.seconds:.1f} s)"
    )
    return 0


def wandb_report_main(argv: Sequence[str]) -> int:
    """``kvbench wandb-report``: build (and save, or with ``--dry-run`` write) the W&B Report."""
    parser = argparse.ArgumentParser(prog="kvbench wandb-report", description="Build a W&B comparison report.")
    _runs_argument(parser)
    parser.add_argument("--entity", default=None, help="W&B entity (user or team) holding the project")
    parser.add_argument("--project", default=None, help="W&B project the runs were logged to (wandb.project)")
    parser.add_argument("--dry-run", action="store_true", help="write the report specification JSON, no network")
    parser.add_argument("--out", default="results/wandb_report.json", help="where --dry-run writes the JSON")
    args = parser.parse_args(list(argv))
    from pathlib import Path

    from kvbench.reporting.dashboard_data import load_dashboard_runs
    from kvbench.reporting.wandb_report import build_report, report_spec, save_report

    if args.dry_run:
        from kvbench.storage.paths import check_output_file

        args.out = check_output_file(args.out, "--out")
    for name in ("entity", "project"):
        value = getattr(args, name)
        if value is not None and not value.strip():
            raise KVBenchError(f"--{name} is empty; give the W&B {name} the runs were logged to")
        if value is None and not args.dry_run:
            raise KVBenchError(f"--{name} is needed to save the report (or use --dry-run to write its specification)")
        setattr(args, name, value or "")
    runs = load_dashboard_runs(args.runs, experiment=args.experiment)
    report = build_report(runs, args.entity, args.project, args.experiment, args.title)
    if args.dry_run:
        spec = report_spec(report)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(spec, indent=1) + "\n", encoding="utf-8")
        n_panels = sum(len(b["metadata"]["panelBankSectionConfig"]["panels"]) for b in _grids(spec))
        print(f"report specification ({len(_grids(spec))} panel grids, {n_panels} panels) -> {out}")
    else:
        print(save_report(report))
    return 0


def _grids(spec: dict) -> list[dict]:
    return [b for b in spec["spec"]["blocks"] if b.get("type") == "panel-grid"]


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch ``report`` / ``wandb-report`` (the first argument)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command, rest = argv[0], argv[1:]
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning  # restored on exit
        return {"report": report_main, "wandb-report": wandb_report_main}[command](rest)


def _show_warning(message: Warning | str, *args: object, **kwargs: object) -> None:
    """A warning as one ``warning: <message>`` line on stderr (a metrics.json that disagrees with its rows, a
    duplicate run), without Python's source-line decoration."""
    print(f"warning: {message}", file=sys.stderr)
