"""The ``kvbench`` console script and ``python run.py``: one Hydra app, one exit code (2) per user error.

* :func:`main` -- the entry point of both: ``kvbench list methods|tasks|models|budgets`` (:mod:`kvbench.app.listing`),
  else the Hydra app over the shipped config tree (:func:`kvbench.resources.conf_dir`, an absolute path, so the
  installed package finds it from any working directory; results go under the working directory's ``results/``).
* :func:`run_job` -- one configuration: the checks that need no torch first (:mod:`kvbench.app.validation`), the
  method family and its parameters (torch, not transformers), then the runner (or, for ``python run.py`` alone,
  the embedded demo).
* :func:`check_sweep` -- a ``-m`` sweep is composed and validated whole before its first job (every job's values,
  environment and run folder); the invalid jobs are listed at once and nothing runs (exit 2).  ``--continue-on-error``
  (kvbench's flag, taken off before Hydra reads the command line) runs the valid jobs anyway and keeps going past a
  failing job, recording each failure (:func:`run_sweep_job`, ``<sweep dir>/failed_jobs.jsonl``); the sweep then
  exits 2 (1 if a failure was a bug) listing them.
* :func:`reporting_errors` -- a :class:`~kvbench.errors.KVBenchError` becomes ``error: <message>`` on stderr and
  exit status 2, without a traceback unless ``KVBENCH_DEBUG=1``; SIGTERM/SIGINT exit 143/130 (the run resumes
  from where it stopped); anything else is a bug and keeps its traceback (exit 1).
* :func:`~kvbench.app.hydra_errors.hydra_error_message` -- Hydra's own errors (unknown preset, misspelt key, wrongly
  typed value, override syntax) rewritten in the same form.  :func:`main` sets ``HYDRA_FULL_ERROR=1`` so Hydra
  raises them instead of printing its own report, and :func:`reporting_hydra_errors` reports them, also with exit
  status 2.

Nothing here imports torch before the config checks pass; transformers is imported by the runner.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from kvbench.app.hydra_errors import hydra_error_message, one_paragraph
from kvbench.app.validation import validate_run
from kvbench.errors import INTERRUPTED_EXIT, USER_ERROR_EXIT, Interrupted, KVBenchError, environment_error_message
from kvbench.run.validated import ValidatedRun

#: Environment variable that adds the traceback to user-error reports.
DEBUG_ENV = "KVBENCH_DEBUG"


def debug_enabled() -> bool:
    """Whether ``KVBENCH_DEBUG`` (set and not ``0``) asks for tracebacks with user errors."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def report_user_error(message: str) -> None:
    """Print ``error: <message>`` to stderr (with the current traceback first when debugging)."""
    if debug_enabled() and sys.exc_info()[0] is not None:
        traceback.print_exc()
    print(f"error: {one_paragraph(message)}", file=sys.stderr, flush=True)


@contextmanager
def reporting_errors() -> Iterator[None]:
    """Turn user errors and stop signals into a message and an exit status (see the module docstring)."""
    try:
        yield
    except KVBenchError as err:
        report_user_error(str(err))
        sys.exit(USER_ERROR_EXIT)
    except Interrupted as err:
        print(f"interrupted ({err}); predictions so far are saved, rerun the same command to resume", file=sys.stderr)
        sys.exit(INTERRUPTED_EXIT)
    except KeyboardInterrupt:
        print("interrupted (Ctrl-C); predictions so far are saved, rerun the same command to resume", file=sys.stderr)
        sys.exit(130)
    except OSError as err:  # disk full, permission denied, a file in the way: the environment, not a bug
        message = environment_error_message(err)
        if message is None:
            _report_bug()
        report_user_error(str(message))
        sys.exit(USER_ERROR_EXIT)
    except Exception:  # a bug, not a user error: keep its traceback (and never let Hydra's handler relabel it)
        _report_bug()


def _report_bug() -> None:
    """A bug: print its traceback, ask for a report, exit 1."""
    traceback.print_exc()
    print("kvbench: unexpected error (the traceback above); please report it", file=sys.stderr, flush=True)
    sys.exit(1)


def main() -> None:
    """``kvbench [overrides ...]`` / ``python run.py [overrides ...]``, or ``kvbench list <target>``.

    With no arguments: the embedded default (tiny model, offline synthetic task, CPU) beside its variants."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Hydra raises its own errors instead of printing them (exit 1); reporting_hydra_errors reports them (exit 2).
    os.environ["HYDRA_FULL_ERROR"] = "1"
    if sys.argv[1:2] == ["list"]:
        from kvbench.app.listing import main as list_main

        sys.exit(list_main(sys.argv[2:]))
    if sys.argv[1:2] in (["report"], ["wandb-report"]):  # the dashboards (kvbench/app/dashboards.py)
        from kvbench.app.dashboards import main as dashboards_main

        with reporting_errors():
            sys.exit(dashboards_main(sys.argv[1:]))
    from kvbench.app.overrides import prepare_overrides

    # Any budget spec (budget=80L, budget=0.3x, budget=512) and a number given to any group, as Hydra composes them.
    continue_on_error = CONTINUE_FLAG in sys.argv[1:]
    sys.argv[1:] = [arg for arg in sys.argv[1:] if arg != CONTINUE_FLAG]  # kvbench's flag, not Hydra's
    sys.argv[1:] = flags_first(sys.argv[1:])
    with reporting_errors():
        sys.argv[1:] = prepare_overrides(sys.argv[1:])  # a method= naming a broken plug-in: one error line, exit 2
        check_sweep(sys.argv[1:], continue_on_error)
    with reporting_hydra_errors(sys.argv[1:]):
        hydra_app(continue_on_error)()
    if FAILED_JOBS:
        report_failed_jobs()


#: Hydra's flags that take no value: accepted anywhere on the command line (Hydra's argparse wants them before the
#: overrides, and names a later one "unrecognized arguments").
VALUELESS_FLAGS = ("-m", "--multirun")


def flags_first(args: Sequence[str]) -> list[str]:
    """``args`` with :data:`VALUELESS_FLAGS` moved before the overrides (``budget=64L -m`` = ``-m budget=64L``)."""
    return [arg for arg in args if arg in VALUELESS_FLAGS] + [arg for arg in args if arg not in VALUELESS_FLAGS]


#: ``kvbench -m --continue-on-error ...``: a failed job is recorded and the sweep goes on (:func:`run_sweep_job`).
CONTINUE_FLAG = "--continue-on-error"
#: The jobs of this sweep that failed under :data:`CONTINUE_FLAG`: ``(job number, overrides, exit status)``.
FAILED_JOBS: list[tuple[int, list[str], int]] = []


def is_multirun(args: Sequence[str]) -> bool:
    """Whether a command line asks Hydra for a sweep (``-m``, ``--multirun``, ``hydra.mode=MULTIRUN``)."""
    return any(arg in ("-m", "--multirun") or arg.replace(" ", "") == "hydra.mode=MULTIRUN" for arg in args)


def check_sweep(args: Sequence[str], continue_on_error: bool) -> None:
    """A sweep is checked whole before its first job: every job composed and validated (values, environment, run
    folders).  Invalid jobs are listed at once and nothing runs (exit 2); with :data:`CONTINUE_FLAG` they are
    listed as a warning and the sweep runs, recording each failure."""
    if not is_multirun(args):
        if continue_on_error:
            raise KVBenchError(f"{CONTINUE_FLAG} applies to sweeps only: add -m (e.g. kvbench -m {CONTINUE_FLAG} ...).")
        return
    from kvbench.app.sweep import multirun_jobs

    jobs = multirun_jobs(args)
    bad = [(index, job) for index, job in enumerate(jobs) if job.state == "invalid"]
    if not any(item.split("=", 1)[0].lstrip("+") == "hydra/launcher" for item in args):  # jobs run in this process
        plan_sharing([job.validated for job in jobs if job.state != "invalid" and job.validated is not None])
    elif not bad:  # a cluster launcher: one launcher job per shared-prefill group (kvbench/app/shared_tasks.py)
        from kvbench.app.shared_tasks import grouped_command_line

        grouped = grouped_command_line(args, jobs)
        if grouped is not None:
            print(f"{len(jobs)} jobs in shared-prefill tasks: {grouped[-2]}", file=sys.stderr, flush=True)
            sys.argv[1:] = grouped
    if not bad:
        return
    lines = [f"  job {index} ({' '.join(job.overrides)}): {job.reason}" for index, job in bad]
    if continue_on_error:
        print(f"warning: {len(bad)} of {len(jobs)} jobs of this sweep are invalid; they will fail:", file=sys.stderr)
        print("\n".join(lines), file=sys.stderr, flush=True)
        return
    print(
        f"error: {len(bad)} of {len(jobs)} jobs of this sweep are invalid, so none ran. Fix them, or pass "
        f"{CONTINUE_FLAG} to run the others:",
        file=sys.stderr,
    )
    print("\n".join(lines), file=sys.stderr, flush=True)
    sys.exit(USER_ERROR_EXIT)


#: A local sweep's shared-prefill groups (issue #56; :class:`kvbench.app.sweep_sharing.SweepSharing`), planned by
#: :func:`check_sweep` before the first job runs; ``None`` outside a sweep.
SHARING: Any = None


def plan_sharing(runs: Sequence[ValidatedRun]) -> None:
    """Group a local sweep's jobs that share a prefill (:data:`SHARING`; ``runs``: the jobs as the sweep's check
    validated them) and list the groups."""
    global SHARING
    from kvbench.app.sweep_sharing import SweepSharing

    SHARING = SweepSharing.plan(runs)
    for line in SHARING.listing():
        print(line, file=sys.stderr, flush=True)


def run_sweep_job(job: Callable[[], None]) -> None:
    """Run one job of a sweep under :data:`CONTINUE_FLAG`: a failure (its message already printed) is recorded in
    :data:`FAILED_JOBS` and in ``<sweep dir>/failed_jobs.jsonl``, and the sweep goes on; a stop signal still
    stops it."""
    try:
        job()
    except SystemExit as exited:
        code = exited.code if isinstance(exited.code, int) else 1
        if code == 0 or code in (INTERRUPTED_EXIT, 130):
            raise
        from hydra.core.hydra_config import HydraConfig

        hydra = HydraConfig.get()
        overrides, number = list(hydra.overrides.task), int(hydra.job.num)
        FAILED_JOBS.append((number, overrides, code))
        print(f"job {number} failed (exit {code}); the sweep goes on ({CONTINUE_FLAG})", file=sys.stderr, flush=True)
        try:
            path = Path(hydra.sweep.dir) / "failed_jobs.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps({"job": number, "overrides": overrides, "exit_status": code}) + "\n")
        except OSError as err:
            print(f"warning: cannot record the failure in {hydra.sweep.dir}: {err}", file=sys.stderr)


def report_failed_jobs() -> None:
    """After a sweep under :data:`CONTINUE_FLAG`: list the failed jobs; exit 1 if any was a bug, else 2."""
    print(f"error: {len(FAILED_JOBS)} job(s) of this sweep failed (the rest ran):", file=sys.stderr)
    for number, overrides, code in FAILED_JOBS:
        print(f"  job {number} (exit {code}): {' '.join(overrides)}", file=sys.stderr)
    sys.exit(1 if any(code == 1 for _, _, code in FAILED_JOBS) else USER_ERROR_EXIT)


def hydra_app(continue_on_error: bool = False) -> Callable[[], None]:
    """The Hydra app over the shipped config tree; Hydra reads the overrides from ``sys.argv``.
    ``continue_on_error``: each job runs through :func:`run_sweep_job`."""
    import hydra

    from kvbench import resources
    from kvbench.config import register_configs

    register_configs()

    @hydra.main(version_base="1.3", config_path=str(resources.conf_dir()), config_name="config")
    def app(cfg: DictConfig) -> None:
        """Run one configuration (Hydra calls this once per job in a sweep)."""
        # `kvbench` / `python run.py` alone (or with extent/run settings only): the embedded default beside its
        # variants.
        overrides = sys.argv[1:]
        job = lambda: run_job(cfg, demo=demo_overrides(overrides), overrides=overrides)  # noqa: E731
        run_sweep_job(job) if continue_on_error else job()

    return app


#: Overrides that keep ``kvbench`` / ``python run.py`` on the embedded default's comparison: they change how much
#: is run and where, not what (``python run.py task.num_samples=2`` is the comparison on 2 samples per dataset).
DEMO_KEEPING_PREFIXES = ("task.num_samples=", "seed=", "run.", "wandb.")


def demo_overrides(overrides: Sequence[str]) -> bool:
    """Whether these command-line overrides still run the embedded default's comparison (see
    :data:`DEMO_KEEPING_PREFIXES`; ``run.tag`` names a variant, so it does not)."""
    return all(o.startswith(DEMO_KEEPING_PREFIXES) and not o.startswith("run.tag=") for o in overrides)


def run_job(cfg: DictConfig, demo: bool = False, overrides: Sequence[str] = ()) -> None:
    """Run one configuration as ``run.py`` does; exits with status 2 on a user error.  ``demo``: the embedded
    default's comparison, its variants composed with ``overrides`` too."""
    with reporting_errors(), forgetting_refused_job_logs():
        if cfg.run.get("shared_tasks"):  # a cluster launcher's job: a line of shared-prefill tasks (check_sweep)
            from kvbench.app.shared_tasks import run_manifest_task

            run_manifest_task(str(cfg.run.shared_tasks), int(cfg.run.shared_task))
            return
        validated = validate_run(cfg)  # the method family's parameters before the runner imports transformers
        if demo:
            from kvbench.app.demo import run_demo

            run_demo(cfg, overrides)
        elif SHARING is None or not SHARING.run_job(validated):  # a sweep's group runs its jobs together
            from kvbench.run.runner import Runner

            runner = Runner(validated)
            reason = SHARING.reason(cfg) if SHARING is not None else None
            runner.prefill_sharing = {"shared": False, "reason": reason or "run alone"}
            runner.run()


@contextmanager
def forgetting_refused_job_logs() -> Iterator[None]:
    """A job refused with a user error before it claimed any run folder leaves no trace under ``results/``: Hydra's
    ``.hydra`` snapshots and log of it are removed again (:func:`kvbench.storage.paths.forget_hydra_job_output`).
    Outside a Hydra app (the API) there is nothing to remove."""
    from hydra.core.hydra_config import HydraConfig

    from kvbench.storage.folder import CLAIMED_FOLDERS
    from kvbench.storage.paths import forget_hydra_job_output

    if not HydraConfig.initialized():
        yield
        return
    hydra = HydraConfig.get()
    output_dir = Path(hydra.runtime.output_dir)
    log_name = f"{hydra.job.name}.log"
    log = output_dir / log_name
    log_size = log.stat().st_size if log.exists() else None
    claims = len(CLAIMED_FOLDERS)
    try:
        yield
    except KVBenchError:
        if len(CLAIMED_FOLDERS) == claims:
            for handler in list(logging.getLogger().handlers):  # Hydra's file handler of this job's log
                if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename) == log.resolve():
                    logging.getLogger().removeHandler(handler)
                    handler.close()
            first_of_sweep = str(hydra.mode) == "RunMode.MULTIRUN" and int(hydra.job.get("num", 0) or 0) == 0
            forget_hydra_job_output(output_dir, log_name, log_size, Path(hydra.sweep.dir) if first_of_sweep else None)
        raise


@contextmanager
def reporting_hydra_errors(overrides: Sequence[str]) -> Iterator[None]:
    """Report an error raised by Hydra itself (composition, overrides) as a user error: exit status 2."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        yield
    except (HydraException, OmegaConfBaseException) as err:  # run_job reports everything raised inside a job
        report_user_error(hydra_error_message(err, overrides))
        sys.exit(USER_ERROR_EXIT)
