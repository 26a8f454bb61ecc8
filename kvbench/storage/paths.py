"""Where a run's files go, computed once: the results root (:func:`output_root`), the run folder (:func:`run_folder`),
the checks that the path can hold a folder (:func:`check_run_folder_path`), and Hydra's own log folder
(:func:`hydra_log_dir`).

``run.output_root`` is taken as the user wrote it, with three explicit rules:

* empty (``run.output_root=``) is refused: results would otherwise land straight in the current folder;
* a leading ``~`` is expanded to the home folder (``~/x``, ``~user/x``), never a folder literally named ``~``; an
  unknown ``~user`` is refused;
* a relative root is relative to the folder the command was started in, even when Hydra changed the working
  folder (``hydra.job.chdir=true``).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from kvbench.errors import KVBenchError
from kvbench.storage.folder import holder_config
from kvbench.storage.reader import DamagedFile, read_run_meta
from kvbench.storage.writers import (
    CONFIG_FILE,
    RUN_META_FILE,
    config_differences,
    config_hash,
    holds_results,
    run_dir,
    same_run,
)

#: Separates a run folder's name from the config hash that makes it unique (``64L@1a2b3c4d``).
VARIANT_MARK = "@"
#: Hex digits of the config hash in a variant folder's name.
VARIANT_HASH_DIGITS = 8

#: Hydra's logs when ``run.output_root`` gives no usable place (empty, or a parent where no folder can be made).
FALLBACK_LOG_DIR = Path(tempfile.gettempdir()) / "kvbench-hydra-logs"


def expand_root(raw: Any, key: str = "run.output_root") -> Path:
    """``raw`` as a results root under the rules of the module docstring; :class:`KVBenchError` when it cannot be."""
    text = "" if raw is None else str(raw)
    if not text.strip():
        raise KVBenchError(
            f"{key}={text!r} is empty: results would land in the current folder. Give a folder, e.g. "
            f"{key}=results/runs (the default)."
        )
    if text != text.strip():
        raise KVBenchError(f"{key}={text!r} has surrounding spaces; give the folder without them.")
    expanded = os.path.expanduser(text)
    if expanded.startswith("~"):
        raise KVBenchError(
            f"{key}={text!r}: {text.split('/')[0]} is not a user with a home folder on this machine. Give the path "
            "in full (or ~/<folder> for your own home)."
        )
    path = Path(expanded)
    if not path.is_absolute():
        path = _launch_dir() / path if _launch_dir() != Path.cwd() else path
    return path


def _launch_dir() -> Path:
    """The folder the command was started in (Hydra's ``runtime.cwd`` when it changed the working folder)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            return Path(HydraConfig.get().runtime.cwd)
    except Exception:  # outside a Hydra app (the API, tests): the working folder is the launch folder
        pass
    return Path.cwd()


def output_root(cfg: Any) -> Path:
    """``cfg.run.output_root`` expanded (see the module docstring)."""
    return expand_root(cfg.run.output_root)


def run_folder(cfg: Any, cfg_hash: str | None = None, announce: bool = False) -> Path:
    """The run's results folder: the one place it is computed (validation, the runner, the sweep planner, W&B).

    The folder is ``<model>/<task>/<method>/<budget>[~<tag>]`` (:func:`~kvbench.storage.writers.run_dir`) unless
    that folder holds a run of another config (another config hash, with results); then it is the *variant folder*
    ``<budget>[~<tag>]@<first 8 hex digits of the config hash>`` beside it (:func:`resolve_variant`).  So two
    commands whose settings give different results never share a folder, a run with more samples extends its own,
    and every existing folder keeps its name.  ``cfg_hash``: :func:`~kvbench.storage.writers.config_hash` of
    ``cfg`` when the caller has it.  ``announce``: print a note to stderr when a new variant folder is chosen (the
    runner does, once), naming what differs from the run in the plain folder."""
    base = run_dir(output_root(cfg), cfg.model.name, cfg.task.name, cfg.method.name, cfg.budget.name, cfg.run.tag)
    folder = resolve_variant(base, cfg, cfg_hash or config_hash(cfg))
    if announce and folder != base and not folder.exists():
        diffs = config_differences(base, cfg) if (base / CONFIG_FILE).exists() else []
        shown = "; ".join(diffs[:4]) + (" ..." if len(diffs) > 4 else "")
        print(
            f"note: {base} holds a run with other settings{f' ({shown})' if shown else ''}; this run's results go "
            f"to {folder.name} beside it.",
            file=sys.stderr,
        )
    return folder


def variant_folder(base: Path, cfg_hash: str) -> Path:
    """The variant folder of config ``cfg_hash`` beside the plain folder ``base`` (``64L`` -> ``64L@1a2b3c4d``)."""
    return base.with_name(f"{base.name}{VARIANT_MARK}{cfg_hash[:VARIANT_HASH_DIGITS]}")


def resolve_variant(base: Path, cfg: Any, cfg_hash: str) -> Path:
    """``base`` or its variant folder for the run ``cfg`` (hash ``cfg_hash``), decided by what is on disk:

    1. the variant folder, if it exists (this config ran there before: the run resumes it);
    2. the variant folder, if a live process of another config holds ``base``'s lock (a sweep's jobs started side
       by side: the holder line names its config hash, :func:`~kvbench.storage.folder.holder_line`);
    3. ``base``, if it holds no run, the same run (:func:`~kvbench.storage.writers.same_run`), a run that wrote no
       result (replaced, as before), or a run whose ``run_meta.json`` is damaged (the runner repairs or refuses it);
    4. else the variant folder: ``base`` holds another configuration's results, which stay untouched.
    """
    variant = variant_folder(base, cfg_hash)
    if variant.exists():
        return variant
    holder = holder_config(base)  # a live run of another config holds it (it may not have written run_meta yet)
    if holder is not None and holder != cfg_hash:
        return variant
    meta_path = base / RUN_META_FILE
    if not meta_path.exists():
        return base
    try:
        recorded = read_run_meta(meta_path).get("config_hash")
    except DamagedFile:
        return base
    if same_run(base, recorded, cfg, cfg_hash) or not holds_results(base):
        return base
    return variant


def check_run_folder_path(root: Path, folder: Path) -> None:
    """Every existing part of ``folder``'s path is a folder in which this process can make a folder; else
    :class:`KVBenchError` naming the file in the way (or the place that refuses folders).

    Checked by making (and removing) an empty folder there, not by ``os.access``: root passes ``os.access`` for
    places that refuse new folders (``/proc``), read-only mounts and full disks included."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        above_root = existing == root or existing in root.parents
        where = "run.output_root" if above_root else "the run folder"
        raise KVBenchError(
            f"run.output_root={str(root)!r}: {existing} is a file, not a folder, where {where} "
            f"{root if above_root else folder} needs one. Move that file away or point run.output_root at a folder."
        )
    try:
        probe = tempfile.mkdtemp(prefix=".kvbench-probe-", dir=existing)
    except OSError as err:
        raise KVBenchError(
            f"run.output_root={str(root)!r}: cannot create a folder in {existing} ({err.strerror or err}). Point "
            "run.output_root at a folder you can write (e.g. run.output_root=results/runs)."
        ) from None
    os.rmdir(probe)


def check_output_folder(path: Path, option: str) -> Path:
    """``path`` (``~`` expanded) can be (or is) a folder this process writes in; else :class:`KVBenchError` naming
    ``option`` (e.g. ``--out``) and what is in the way.  For the report commands' output folders."""
    path = Path(os.path.expanduser(str(path)))
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise KVBenchError(f"{option} {path}: {existing} is a file, not a folder. Give a folder (it is created).")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".kvbench-probe-", dir=existing))
    except OSError as err:
        raise KVBenchError(
            f"{option} {path}: cannot create a folder in {existing} ({err.strerror or err}). Give a folder you can "
            "write."
        ) from None
    return path


def check_output_file(path: Path, option: str) -> Path:
    """``path`` (``~`` expanded) can be written as a file: not a folder, and its folder can be made."""
    path = Path(os.path.expanduser(str(path)))
    if path.is_dir():
        raise KVBenchError(f"{option} {path} is a folder; give a file name (e.g. {path / 'report.json'}).")
    check_output_folder(path.parent, option)
    return path


def hydra_log_dir(raw_root: Any) -> str:
    """Hydra's own log folder (``hydra.run.dir``/``hydra.sweep.dir``, the ``kvbench_logs`` resolver): ``logs/hydra``
    beside the results root (``results/logs/hydra`` for the default ``results/runs``), so Hydra writes nothing in the
    current folder unless the results go there too; a temporary folder when the root is unusable (the run then
    fails validation, naming it)."""
    try:
        root = expand_root(raw_root)
    except KVBenchError:
        return str(FALLBACK_LOG_DIR)
    logs = root.parent / "logs" / "hydra"
    first_missing = next((p for p in reversed([logs, *logs.parents]) if not p.exists()), None)
    try:
        logs.mkdir(parents=True, exist_ok=True)
    except OSError:
        return str(FALLBACK_LOG_DIR)
    LOG_ROOTS.setdefault(logs.absolute(), first_missing.absolute() if first_missing is not None else None)
    return str(logs)


#: The Hydra log roots :func:`hydra_log_dir` gave in this process, each with the outermost folder it created for it
#: (``results/`` itself on a fresh checkout; ``None``: it existed): :func:`forget_hydra_job_output` removes them
#: again, when empty, after a refused command.
LOG_ROOTS: dict[Path, Path | None] = {}
#: Hydra's snapshot files of a job (``hydra.output_subdir``, ``.hydra``).
HYDRA_SNAPSHOTS = ("config.yaml", "hydra.yaml", "overrides.yaml")


def forget_hydra_job_output(
    output_dir: Path, log_name: str, log_size_at_start: int | None, sweep_dir: Path | None
) -> None:
    """Remove what Hydra wrote for a job that was refused before its run started (so a refused command leaves no
    trace under ``results/``): the job's ``.hydra`` snapshots, its log file (``log_size_at_start``: the file's size
    when the job started, 0 or ``None`` when it was new; an older log is cut back to that size, never removed),
    ``sweep_dir``'s ``multirun.yaml`` (given for a sweep's first job only), then every folder on the way up that is
    left empty, below the log root, and above it only the folders this process created (:data:`LOG_ROOTS`)."""
    for name in HYDRA_SNAPSHOTS:
        (output_dir / ".hydra" / name).unlink(missing_ok=True)
    log = output_dir / log_name
    if log.exists():
        if not log_size_at_start:
            log.unlink()
        else:
            os.truncate(log, log_size_at_start)
    if sweep_dir is not None:
        (sweep_dir / "multirun.yaml").unlink(missing_ok=True)
    _remove_empty_up((output_dir / ".hydra").absolute())


def _remove_empty_up(folder: Path) -> None:
    """Remove ``folder`` and its parents while they are empty and removable (:func:`forget_hydra_job_output`)."""
    current = folder
    while current != current.parent and _removable(current):
        try:
            current.rmdir()
        except OSError:  # not empty (another run's logs) or gone
            if current.exists():
                return
        current = current.parent


def _removable(folder: Path) -> bool:
    """Whether ``folder`` lies below a log root of this process, or inside a folder this process created for one."""
    for logs, created in LOG_ROOTS.items():
        if folder != logs and folder.is_relative_to(logs):
            return True
        if created is not None and folder.is_relative_to(created):
            return True
    return False
