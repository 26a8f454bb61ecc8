"""Sweeps without submitit: one Hydra override line per job, for plain ``sbatch --array`` jobs.

``python scripts/slurm_sweep.py <experiment> [overrides ...]`` expands the experiment's grid (``hydra.sweeper.params``
in ``conf/experiment/<experiment>.yaml``, with command-line sweeps winning, as in ``python run.py -m``), composes
every job's config exactly as ``run.py`` would, and classifies each job:

* ``complete``: its run folder holds a finished run of this very config (``run_meta.json`` status ``complete``,
  same config hash, every dataset's ``metrics.json`` present with that hash): left out of the manifest;
* ``partial`` / ``new``: written to the manifest (a partial run resumes where it stopped);
* ``invalid``: the config cannot be composed (e.g. a method preset that does not exist yet), fails validation,
  collides with a different config already in its folder, or duplicates another job's folder: reported with the
  reason and left out.

The manifest holds one array task per line: a job's overrides joined with shell quoting, or -- for jobs that share
each sample's prefill forward (issue #56, :func:`manifest_tasks`: same model, task and prefill settings, other
methods and budgets) -- several jobs separated by ``::``, run together in one process
(:func:`kvbench.run.shared_sweep.run_group`); ``slurm/array.sbatch`` runs line ``$SLURM_ARRAY_TASK_ID`` through
:func:`exec_line`.  Regenerating the manifest after a partial sweep and
resubmitting it is idempotent: finished jobs drop out, interrupted ones resume.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import shlex
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kvbench import resources
from kvbench.errors import KVBenchError

#: The source checkout the sweep tool works from (run.py, slurm/array.sbatch and scripts/slurm_sweep.py live there; an
#: installed wheel ships none of them, so there the working directory stands in).
REPO = resources.checkout_dir() or Path.cwd()
CONF_DIR = resources.conf_dir()
#: Default folder for manifests and SLURM logs (outside ``results/``).
SWEEP_LOG_DIR = Path("logs") / "sweeps"
SLURM_LOG_DIR = Path("logs") / "slurm"
ARRAY_SCRIPT = REPO / "slurm" / "array.sbatch"

STATES = ("new", "partial", "complete", "invalid")


@dataclass
class Job:
    """One model x method x budget x task job of a sweep."""

    overrides: list[str]
    state: str = "new"
    reason: str | None = None
    folder: Path | None = None
    details: dict[str, Any] = field(default_factory=dict)
    #: The composed config (valid jobs), as ``run.py`` gets it.
    cfg: Any = field(default=None, repr=False)
    #: The job validated in full, environment included (:class:`~kvbench.run.validated.ValidatedRun`; a plan made
    #: with ``check_environment``, which a local sweep's shared-prefill groups then run), else ``None``.
    validated: Any = field(default=None, repr=False)

    @property
    def line(self) -> str:
        """The manifest line: the overrides, shell-quoted."""
        return shlex.join(self.overrides)


def experiment_params(experiment: str, conf_dir: Path = CONF_DIR) -> dict[str, str]:
    """The sweep grid of ``conf/experiment/<experiment>.yaml`` (its ``hydra.sweeper.params``), in file order."""
    path = conf_dir / "experiment" / f"{experiment}.yaml"
    if not path.exists():
        available = sorted(p.stem for p in (conf_dir / "experiment").glob("*.yaml"))
        raise KVBenchError(f"no experiment {experiment!r} ({path} does not exist); available: {', '.join(available)}")
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    params = ((data.get("hydra") or {}).get("sweeper") or {}).get("params") or {}
    return {str(key): str(value) for key, value in params.items()}


def _group_options(group: str, conf_dir: Path) -> list[str] | None:
    folder = conf_dir / group.lstrip("+~")
    if not folder.is_dir():
        return None
    return sorted(p.stem for p in folder.glob("*.yaml"))


def expand_grid(params: dict[str, str], overrides: Sequence[str] = (), conf_dir: Path = CONF_DIR) -> list[list[str]]:
    """Cartesian product of the sweeps in ``params`` and ``overrides`` (an override of the same key wins).

    Returns one override list per job, keys in first-seen order; non-sweep overrides are appended to every job.
    Simple choice (``a,b``), ``range(...)`` and, for config groups, ``glob(...)`` sweeps are supported.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ValueType

    parser = OverridesParser.create()
    lines = [f"{key}={value}" for key, value in params.items()] + list(overrides)
    by_key: dict[str, Any] = {}
    for override in parser.parse_overrides(lines):
        key = override.get_key_element()
        by_key.pop(key, None)  # re-insert so that the later (command-line) override wins but keeps a stable order
        by_key[key] = override
    axes: list[list[str]] = []
    for key, override in by_key.items():
        if not override.is_sweep_override():
            axes.append([override.input_line])
        elif override.value_type == ValueType.GLOB_CHOICE_SWEEP:
            options = _group_options(override.key_or_group, conf_dir)
            if options is None:
                raise KVBenchError(f"{override.input_line}: glob() sweeps work only on config groups")
            axes.append([f"{key}={name}" for name in override.value().filter(options)])
        else:
            axes.append([f"{key}={value}" for value in override.sweep_string_iterator()])
    return [list(combo) for combo in itertools.product(*axes)]


def _short_reason(err: BaseException) -> str:
    """First meaningful line of a composition/validation error."""
    text = str(err).strip() or type(err).__name__
    first = text.splitlines()[0]
    if "Could not find '" in first:
        # Hydra: "In 'config': Could not find 'method/ada_snapkv'" -> a clearer message.
        missing = first.split("Could not find '", 1)[1].split("'", 1)[0]
        group, _, name = missing.rpartition("/")
        return f"{group} preset {name!r} does not exist (no conf/{missing}.yaml)"
    return first


class Composer:
    """Composes job configs the way ``run.py`` does (same config dir, same schemas)."""

    def __init__(self, conf_dir: Path = CONF_DIR) -> None:
        from hydra import initialize_config_dir
        from hydra.core.global_hydra import GlobalHydra

        from kvbench.config import register_configs

        register_configs()
        GlobalHydra.instance().clear()
        self._context = initialize_config_dir(config_dir=str(conf_dir.resolve()), version_base="1.3")
        self._context.__enter__()

    def compose(self, overrides: list[str]) -> Any:
        """The job's config (without the ``hydra`` node, like the ``cfg`` that ``run.py`` receives)."""
        from hydra import compose

        from kvbench.app.overrides import prepare_overrides

        return compose(config_name="config", overrides=prepare_overrides(overrides))

    def close(self) -> None:
        """Release Hydra's global state."""
        self._context.__exit__(None, None, None)


def classify(job: Job, cfg: Any) -> None:
    """Set ``job.state`` from its run folder: ``complete``, ``partial``, ``new`` or ``invalid`` (conflict)."""
    from kvbench.storage.paths import run_folder
    from kvbench.storage.reader import DamagedFile, read_metrics, read_run_meta
    from kvbench.storage.writers import (
        METRICS_FILE,
        RUN_META_FILE,
        config_hash,
        extent_covered,
        holds_results,
        same_run,
    )

    cfg_hash = config_hash(cfg)
    folder = run_folder(cfg, cfg_hash)
    job.folder = folder
    job.details["config_hash"] = cfg_hash
    meta_path = folder / RUN_META_FILE
    if not meta_path.exists():
        job.state = "partial" if folder.exists() and any(folder.iterdir()) else "new"
        return
    try:
        meta = read_run_meta(meta_path)
    except DamagedFile:  # the run repairs it when config.yaml is this job's, or refuses naming the file
        job.state = "partial"
        return
    same = same_run(folder, meta.get("config_hash"), cfg, cfg_hash)
    if not same and not holds_results(folder):
        job.state = "new"  # the folder's run wrote no prediction: the job replaces it
        return
    if not same:
        job.state = "invalid"
        job.reason = (
            f"{folder} holds a run with a different config (hash {meta.get('config_hash')} != {cfg_hash}); "
            "use run.tag=<name> or remove that folder"
        )
        return
    datasets = meta.get("datasets") or []
    if meta.get("status") == "complete" and datasets:
        for name in datasets:
            path = folder / name / METRICS_FILE
            try:
                metrics = read_metrics(path) if path.exists() else {}
            except DamagedFile:  # recomputed by the run
                metrics = {}
            if metrics.get("config_hash") != cfg_hash or not extent_covered(metrics, cfg.task.num_samples):
                job.state = "partial"
                return
        job.state = "complete"
        return
    job.state = "partial"


def plan(
    experiment: str | None,
    overrides: Sequence[str] = (),
    name: str | None = None,
    conf_dir: Path = CONF_DIR,
    check_environment: bool = False,
    name_experiment: bool = True,
) -> list[Job]:
    """Every job of the sweep, classified (see the module docstring).  ``check_environment``: also check each
    job's environment (model, data, results folder), as a local ``-m`` sweep about to run them does;
    ``name_experiment``: without an experiment, set ``run.experiment`` to ``name`` (a manifest's jobs), else leave
    it as ``run.py -m`` does."""
    from kvbench.app.validation import validate, validate_run
    from kvbench.storage.paths import variant_folder

    def check(job: Job, cfg: Any) -> Any:
        if not check_environment:
            return validate(cfg)[0]
        job.validated = validate_run(cfg)
        return job.validated.method

    params = experiment_params(experiment, conf_dir) if experiment else {}
    prefix = [f"+experiment={experiment}"] if experiment else []
    named = any(o.split("=", 1)[0].lstrip("+") == "run.experiment" for o in overrides)
    if not experiment and not named and name_experiment:
        prefix.append(f"run.experiment={name or 'adhoc'}")
    jobs = [Job(prefix + combo) for combo in expand_grid(params, overrides, conf_dir)]
    composer = Composer(conf_dir)
    seen: dict[Path, tuple[int, str]] = {}
    try:
        for index, job in enumerate(jobs):
            try:
                cfg = composer.compose(job.overrides)
                job.details["method"] = check(job, cfg)
                job.cfg = cfg
            except Exception as err:  # composition/validation errors are reported per job, never fatal
                job.state, job.reason = "invalid", _short_reason(err)
                continue
            classify(job, cfg)
            if job.folder is not None and job.state != "invalid":
                cfg_hash = job.details["config_hash"]
                if job.folder in seen and seen[job.folder][1] != cfg_hash:
                    # Another job of this sweep runs another config in that folder: this one gets its own, as the
                    # runner decides when the two start side by side (kvbench.storage.paths.resolve_variant).
                    job.folder, job.state = variant_folder(job.folder, cfg_hash), "new"
                if job.folder in seen:
                    job.state = "invalid"
                    job.reason = f"the same run as job {seen[job.folder][0]} ({job.folder}): drop one of the two"
                else:
                    seen[job.folder] = (index, cfg_hash)
    finally:
        composer.close()
    return jobs


def multirun_jobs(command_line: Sequence[str], conf_dir: Path = CONF_DIR) -> list[Job]:
    """Every job of a ``kvbench -m ...`` command line, composed and checked whole (values, and with the local
    launcher environment and run folders, :func:`plan`) before the first one runs.  Hydra's own settings
    (``hydra.*``, ``hydra/launcher=...``) are left to Hydra; ``+experiment=<name>`` brings in that experiment's
    grid."""
    experiment, overrides = None, []
    for item in command_line:
        key = item.split("=", 1)[0]
        if item.startswith("-") or key.lstrip("+~").startswith(("hydra.", "hydra/")):
            continue
        if key.lstrip("+") == "experiment":
            experiment = item.split("=", 1)[1]
        else:
            overrides.append(item)
    # A cluster launcher runs the jobs elsewhere: their environment (model, data) is checked there, as slurm_sweep.py.
    remote = any(item.split("=", 1)[0].lstrip("+") == "hydra/launcher" for item in command_line)
    return plan(experiment, overrides, name="multirun", conf_dir=conf_dir, check_environment=not remote,
                name_experiment=False)  # fmt: skip


def pending(jobs: Sequence[Job]) -> list[Job]:
    """The jobs a manifest must contain (new and partial), in sweep order."""
    return [job for job in jobs if job.state in ("new", "partial")]


#: Between the jobs of one manifest line (a shared-prefill group: one array task runs them together).
JOB_SEPARATOR = "::"


def manifest_tasks(jobs: Sequence[Job], share: bool = True, size: int | None = None) -> list[list[Job]]:
    """The pending jobs as array tasks: the jobs that share a prefill (:mod:`kvbench.run.prefill_groups`) in one
    task, at most ``size`` per task (``None``: ``run.prefill_group_size`` of the first job, null = no limit); each
    job alone when ``share`` is false or its config says so (``run.share_prefill=false``)."""
    from kvbench.run.prefill_groups import group_jobs, group_size, prefill_key, unshared_reason

    todo = pending(jobs)
    if not share or not todo:
        return [[job] for job in todo]
    keys: list[str | None] = []
    for job in todo:
        method = job.details.get("method")
        shareable = job.cfg is not None and method is not None and unshared_reason(job.cfg, method) is None
        keys.append(prefill_key(job.cfg, method) if shareable else None)
    limit = size if size is not None else group_size(todo[0].cfg) if todo[0].cfg is not None else None
    return [[todo[index] for index in group] for group in group_jobs(keys, limit)]


def manifest_text(jobs: Sequence[Job], tasks: Sequence[Sequence[Job]] | None = None) -> str:
    """Manifest contents: one line per array task (``tasks``, default one per pending job): its jobs' shell-quoted
    overrides, separated by :data:`JOB_SEPARATOR`."""
    tasks = tasks if tasks is not None else [[job] for job in pending(jobs)]
    return "".join(f" {JOB_SEPARATOR} ".join(job.line for job in task) + "\n" for task in tasks)


def task_listing(tasks: Sequence[Sequence[Job]]) -> str:
    """The dry-run listing of a manifest's tasks: per task its jobs, and whether they share a prefill."""
    lines = []
    for index, task in enumerate(tasks):
        shared = f"{len(task)} jobs, one shared prefill per sample" if len(task) > 1 else "1 job"
        lines.append(f"task {index} ({shared}):")
        lines.extend(f"    {job.state:8} {job.line}" for job in task)
    return "\n".join(lines)


def split_jobs(tokens: Sequence[str]) -> list[list[str]]:
    """A manifest line's tokens as its jobs' override lists (split on :data:`JOB_SEPARATOR`)."""
    jobs: list[list[str]] = [[]]
    for token in tokens:
        if token == JOB_SEPARATOR:
            jobs.append([])
        else:
            jobs[-1].append(token)
    return [job for job in jobs if job]


def default_manifest_path(name: str, text: str) -> Path:
    """``logs/sweeps/<name>/manifest-<hash>.txt``: content-addressed, so a running array's manifest is never
    rewritten by a later regeneration (its line numbers stay valid)."""
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    return SWEEP_LOG_DIR / name / f"manifest-{digest}.txt"


def write_manifest(path: Path, text: str) -> Path:
    """Write the manifest atomically."""
    from kvbench.storage.writers import atomic_write_text

    atomic_write_text(path, text)
    return path


def summary(jobs: Sequence[Job]) -> str:
    """Human-readable counts, plus each distinct reason for invalid jobs."""
    counts = Counter(job.state for job in jobs)
    lines = [f"{len(jobs)} jobs: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in STATES)]
    reasons = Counter(job.reason for job in jobs if job.state == "invalid")
    for reason, count in reasons.most_common():
        lines.append(f"  invalid x{count}: {reason}")
    return "\n".join(lines)


def read_manifest(path: Path) -> list[str]:
    """The non-empty lines of a manifest."""
    return [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def manifest_line(path: Path, index: int) -> list[str]:
    """Overrides of job ``index`` (0-based) of a manifest."""
    lines = read_manifest(path)
    if not 0 <= index < len(lines):
        raise KVBenchError(f"{path} has {len(lines)} jobs; index {index} is out of range")
    return shlex.split(lines[index])


def task_index(offset: int = 0) -> int:
    """The job index: ``offset + $SLURM_ARRAY_TASK_ID``."""
    value = os.environ.get("SLURM_ARRAY_TASK_ID")
    if value is None:
        raise KVBenchError("SLURM_ARRAY_TASK_ID is not set: pass --index")
    return offset + int(value)


def job_is_complete(overrides: list[str], conf_dir: Path = CONF_DIR) -> bool:
    """Whether a manifest line's run is already finished (so a requeued/resubmitted job can skip model loading)."""
    try:
        composer = Composer(conf_dir)
        try:
            job = Job(list(overrides))
            classify(job, composer.compose(job.overrides))
        finally:
            composer.close()
    except Exception:  # cannot tell (bad line, changed configs): let run.py run and report it properly
        return False
    return job.state == "complete"


def run_group_line(jobs: list[list[str]], check: bool = True) -> None:
    """Run a manifest line of several jobs (a shared-prefill group) in this process: each composed as ``run.py``
    would, the finished ones left out, the rest through :func:`kvbench.run.shared_sweep.run_group` (SIGTERM is the
    runners', as in ``run.py``); the caller reports errors (``scripts/slurm_sweep.py``: exit 2 on a user error)."""
    print(f"kvbench task: {len(jobs)} jobs sharing each sample's prefill", flush=True)
    for overrides in jobs:
        print("  python run.py " + shlex.join(overrides), flush=True)
    todo = [overrides for overrides in jobs if not (check and job_is_complete(overrides))]
    if not todo:
        print("already complete; nothing to do", flush=True)
        sys.exit(0)
    os.chdir(REPO)
    from kvbench.app.validation import validate_run
    from kvbench.run.shared_sweep import run_group

    composer = Composer()
    try:
        cfgs = [composer.compose(overrides) for overrides in todo]
    finally:
        composer.close()
    run_group([validate_run(cfg) for cfg in cfgs])


def exec_line(overrides: list[str], check: bool = True) -> None:
    """Replace this process with ``python run.py <overrides>`` (so SLURM's signals reach the runner directly); a line
    of several jobs (:data:`JOB_SEPARATOR`) runs them together here (:func:`run_group_line`)."""
    jobs = split_jobs(overrides)
    if len(jobs) > 1:
        run_group_line(jobs, check)
        return
    overrides = jobs[0] if jobs else []
    print("kvbench job: python run.py " + shlex.join(overrides), flush=True)
    if check and job_is_complete(overrides):
        print("already complete; nothing to do", flush=True)
        sys.exit(0)
    sys.stdout.flush()
    sys.stderr.flush()
    os.chdir(REPO)
    os.execv(sys.executable, [sys.executable, str(REPO / "run.py"), *overrides, *hydra_log_override(overrides)])


def hydra_log_override(overrides: Sequence[str]) -> list[str]:
    """Under SLURM, Hydra's own log folder per array task (``logs/hydra/slurm/<array job>_<task>``), so that
    concurrent jobs sharing model/task/method/budget (different ``run.tag``) never share a Hydra log folder."""
    array_job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if not (array_job and task) or any(o.startswith("hydra.run.dir=") for o in overrides):
        return []
    return [f"hydra.run.dir=logs/hydra/slurm/{array_job}_{task}"]


def sbatch_commands(
    manifest: Path, n_jobs: int, parallelism: int, max_array_size: int, sbatch_args: Sequence[str] = ()
) -> list[list[str]]:
    """``sbatch`` command lines for a manifest, split into arrays of at most ``max_array_size`` tasks."""
    commands = []
    for offset in range(0, n_jobs, max_array_size):
        size = min(max_array_size, n_jobs - offset)
        array = f"0-{size - 1}" + (f"%{parallelism}" if parallelism > 0 else "")
        commands.append(
            [
                "sbatch",
                "--parsable",
                f"--array={array}",
                *sbatch_args,
                str(ARRAY_SCRIPT),
                str(manifest),
                str(offset),
            ]
        )
    return commands


def submit(commands: Sequence[Sequence[str]]) -> list[str]:
    """Run the ``sbatch`` commands from the repository root; returns the array job ids."""
    (REPO / SLURM_LOG_DIR).mkdir(parents=True, exist_ok=True)
    ids = []
    for command in commands:
        try:
            result = subprocess.run(list(command), cwd=REPO, capture_output=True, text=True, check=False)
        except OSError as err:
            raise KVBenchError(f"cannot run sbatch ({err}); is this a SLURM login node?") from err
        if result.returncode != 0:
            raise KVBenchError(f"{shlex.join(command)} failed: {result.stderr.strip() or result.stdout.strip()}")
        ids.append(result.stdout.strip().split(";")[0])
    return ids
