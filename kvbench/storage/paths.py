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
import tempfile
from pathlib import Path
from typing import Any

from kvbench.errors import KVBenchError
from kvbench.storage.writers import run_dir

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


def run_folder(cfg: Any) -> Path:
    """The run's results folder: the one place it is computed (validation, the runner, the sweep planner, W&B)."""
    kv_quant = cfg.get("kv_quant") if hasattr(cfg, "get") else getattr(cfg, "kv_quant", None)
    kv_name = None if kv_quant is None else kv_quant.get("name") if hasattr(kv_quant, "get") else kv_quant.name
    return run_dir(
        output_root(cfg), cfg.model.name, cfg.task.name, cfg.method.name, cfg.budget.name, cfg.run.tag, kv_name
    )


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
    try:
        logs.mkdir(parents=True, exist_ok=True)
    except OSError:
        return str(FALLBACK_LOG_DIR)
    return str(logs)
