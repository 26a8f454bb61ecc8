#!/usr/bin/env python
"""Sweep manifests for plain SLURM arrays (no submitit needed); the logic lives in kvbench/app/sweep.py.

Write the manifest of an experiment's unfinished jobs (and print the sbatch command)::

    python scripts/slurm_sweep.py cake_t1
    python scripts/slurm_sweep.py cake_t1 model=llama3.1-8b-instruct budget=128L     # command-line sweeps win
    python scripts/slurm_sweep.py --name smoke model=tiny method=snapkv,streamingllm budget=64L,128L
    python scripts/slurm_sweep.py cake_t1 --submit --parallel 16 -- --partition=gpu --time=08:00:00

Status only (nothing written)::

    python scripts/slurm_sweep.py cake_t1 --status

Run one line of a manifest (what slurm/array.sbatch does; the index defaults to $SLURM_ARRAY_TASK_ID)::

    python scripts/slurm_sweep.py --exec logs/sweeps/cake_t1/manifest-<hash>.txt --index 3

Relative paths inside job configs (``run.output_root``) are relative to the repository root: the tool and the
jobs both work from there.  Exit status: 0 on success, 2 on bad input, 3 with ``--strict`` when any job is invalid.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from kvbench.app import sweep
from kvbench.errors import KVBenchError


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Command-line arguments; everything after ``--`` is passed to sbatch."""
    sbatch_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, sbatch_args = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("items", nargs="*", help="experiment name (conf/experiment/<name>.yaml), then overrides")
    parser.add_argument("--name", help="sweep name (default: the experiment, else 'adhoc'); names the manifest folder")
    parser.add_argument("-o", "--output", type=Path, help="manifest path (default logs/sweeps/<name>/manifest-<hash>)")
    parser.add_argument("--status", action="store_true", help="print the job states only; write nothing")
    parser.add_argument("--list", action="store_true", help="also print every job with its state")
    parser.add_argument("--strict", action="store_true", help="exit 3 if any job is invalid")
    parser.add_argument("--submit", action="store_true", help="submit the manifest with sbatch")
    parser.add_argument(
        "--parallel",
        type=int,
        default=int(os.environ.get("KVBENCH_ARRAY_PARALLELISM", "16")),
        help="array throttle %%N (default $KVBENCH_ARRAY_PARALLELISM, else 16; 0 = none)",
    )
    parser.add_argument(
        "--max-array-size",
        type=int,
        default=int(os.environ.get("KVBENCH_MAX_ARRAY_SIZE", "1000")),
        help="split into several arrays of at most this many tasks (SLURM MaxArraySize - 1; default 1000)",
    )
    parser.add_argument("--no-share", action="store_true", help="one job per array task (no shared prefills)")
    parser.add_argument(
        "--group-size",
        type=int,
        help="most jobs per array task sharing a prefill (default: run.prefill_group_size, null = no limit)",
    )
    parser.add_argument("--exec", dest="exec_manifest", type=Path, help="run one line of this manifest")
    parser.add_argument("--index", type=int, help="with --exec: 0-based line (default offset + $SLURM_ARRAY_TASK_ID)")
    parser.add_argument("--offset", type=int, default=0, help="with --exec: added to $SLURM_ARRAY_TASK_ID")
    parser.add_argument("--no-check", action="store_true", help="with --exec: start run.py even if complete")
    args = parser.parse_args(argv)
    args.sbatch_args = sbatch_args
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.exec_manifest is not None:
            manifest = args.exec_manifest.resolve()
            index = args.index if args.index is not None else sweep.task_index(args.offset)
            from kvbench.app.cli import reporting_errors

            with reporting_errors():  # a line of several jobs runs here; a single job replaces this process
                sweep.exec_line(sweep.manifest_line(manifest, index), check=not args.no_check)
            return 0
        items = list(args.items)
        experiment = items.pop(0) if items and "=" not in items[0] else None
        if experiment is None and not items:
            print("error: give an experiment name and/or overrides (see --help)", file=sys.stderr)
            return 2
        name = args.name or experiment or "adhoc"
        output = args.output.resolve() if args.output else None
        os.chdir(sweep.REPO)
        jobs = sweep.plan(experiment, items, name=args.name)
    except KVBenchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(sweep.summary(jobs), file=sys.stderr)
    if args.group_size is not None and args.group_size < 1:
        print(f"error: --group-size {args.group_size}: give a number of jobs >= 1", file=sys.stderr)
        return 2
    tasks = sweep.manifest_tasks(jobs, share=not args.no_share, size=args.group_size)
    if args.list or args.status:
        for job in jobs:
            print(f"{job.state:8} {job.line}" + (f"    # {job.reason}" if job.reason else ""))
        print(sweep.task_listing(tasks))
    invalid = any(job.state == "invalid" for job in jobs)
    if args.status:
        return 3 if args.strict and invalid else 0
    text = sweep.manifest_text(jobs, tasks)
    todo = len(tasks)
    if todo == 0:
        print("nothing to run: every valid job is complete", file=sys.stderr)
        return 3 if args.strict and invalid else 0
    path = sweep.write_manifest(output or (sweep.REPO / sweep.default_manifest_path(name, text)), text)
    print(f"manifest: {path} ({todo} array tasks, {len(sweep.pending(jobs))} jobs)", file=sys.stderr)
    commands = sweep.sbatch_commands(path, todo, args.parallel, args.max_array_size, args.sbatch_args)
    if args.submit:
        try:
            ids = sweep.submit(commands)
        except KVBenchError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(f"submitted array job(s): {' '.join(ids)}; logs in {sweep.SLURM_LOG_DIR}/", file=sys.stderr)
        print(" ".join(ids))
    else:
        print(f"submit with (from {sweep.REPO}; mkdir -p {sweep.SLURM_LOG_DIR} first):", file=sys.stderr)
        for command in commands:
            print(shlex.join(command))
    return 3 if args.strict and invalid else 0


if __name__ == "__main__":
    sys.exit(main())
