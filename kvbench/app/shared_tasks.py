"""Shared-prefill groups under Hydra's cluster launchers (issue #56): ``python run.py -m ... hydra/launcher=slurm``
(or ``local``, submitit's local executor) runs one launcher job per *group* of jobs that share a prefill, not one per
job.

A launcher runs each Hydra job in a process of its own, so a group must become one Hydra job before the sweep is
handed to the launcher: :func:`grouped_command_line` (called by :func:`kvbench.app.cli.check_sweep`, which composed and
validated every job) writes the sweep's tasks as a manifest (:func:`kvbench.app.sweep.manifest_tasks`, the format of
``scripts/slurm_sweep.py``: one line per task, its jobs' overrides separated by ``::``, under
``logs/sweeps/multirun/``) and rewrites the command line into a sweep over its lines:
``run.shared_tasks=<manifest> run.shared_task=0,1,...`` with the command's Hydra settings and its overrides that no
job sweeps kept.  Each launcher job then runs its line (:func:`run_manifest_task`): its jobs composed as ``run.py``
composes them (inside the Hydra job, through Hydra's compose API), then :func:`kvbench.run.shared_sweep.run_group`
for several jobs, the runner for one.  ``run.prefill_group_size`` caps a line's jobs (a task's time limit holds all
of them).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvbench.app import sweep


def grouped_command_line(args: Sequence[str], jobs: Sequence[sweep.Job]) -> list[str] | None:
    """The command line of a remote-launcher sweep with one Hydra job per task of shared-prefill groups, or ``None``
    when no two jobs share (the sweep runs as given).  ``jobs``: the sweep's jobs, composed and classified."""
    tasks = sweep.manifest_tasks(jobs)
    if all(len(task) == 1 for task in tasks):
        return None
    text = sweep.manifest_text(jobs, tasks)
    path = sweep.write_manifest(Path.cwd() / sweep.default_manifest_path("multirun", text), text)
    kept = [item for item in args if _kept(item)]
    lines = ",".join(str(index) for index in range(len(tasks)))
    return [*kept, f"run.shared_tasks='{path}'", f"run.shared_task={lines}", "hydra.sweep.subdir=task_${hydra.job.num}"]


def _kept(item: str) -> bool:
    """Whether a command-line item stays when the sweep becomes one over manifest lines: flags, Hydra's settings and
    the launcher, and the job overrides that every job shares (not swept: e.g. ``run.output_root``, where Hydra's
    own logs go), but not ``+experiment`` (its grid is in the lines)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    key = item.split("=", 1)[0].lstrip("+~")
    if item.startswith("-") or key.startswith(("hydra.", "hydra/")):
        return True
    if key == "experiment" or "=" not in item:
        return False
    return not OverridesParser.create().parse_override(item).is_sweep_override()


def run_manifest_task(manifest: str, index: int) -> None:
    """Run line ``index`` of ``manifest`` (a launcher job of :func:`grouped_command_line`), inside the Hydra job."""
    jobs = sweep.split_jobs(sweep.manifest_line(Path(manifest), index))
    from kvbench.app.validation import validate_run
    from kvbench.run.runner import Runner
    from kvbench.run.shared_sweep import run_group

    runs = [validate_run(_compose(overrides)) for overrides in jobs]
    if len(runs) == 1:
        Runner(runs[0]).run()
    else:
        print(f"kvbench task {index}: {len(runs)} jobs sharing each sample's prefill", flush=True)
        run_group(runs)


def _compose(overrides: list[str]) -> Any:
    """A job's config as ``run.py`` composes it, through the Hydra app's own config loader."""
    from hydra import compose

    from kvbench.app.overrides import prepare_overrides

    return compose(config_name="config", overrides=prepare_overrides(overrides))
