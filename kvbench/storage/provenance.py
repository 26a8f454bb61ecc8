"""Where and when a run ran, for ``run_meta.json``: the git commit of the checkout, the time, the SLURM job and
the device."""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import datetime, timezone

import torch

#: The checkout's output folder: changes under it are results, not code (:func:`git_commit`).
OUTPUT_FOLDER = "results"


def git_commit() -> str | None:
    """The repository's HEAD commit (with ``-dirty`` when tracked files outside ``results/`` have uncommitted
    changes), if available; None for an installed wheel (``kvbench_version`` identifies that code; never the commit
    of a repository it sits in).  What runs and scripts write under ``results/`` (committed tables and papers' numbers
    included) is output, not the code that computed a result, so it never marks the tree dirty."""
    from kvbench.resources import checkout_dir

    root = checkout_dir()
    if root is None:
        return None
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", f":(exclude){OUTPUT_FOLDER}"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("-dirty" if dirty else "")


def now() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def slurm_job_id() -> str | None:
    """``<array job>_<task>`` (or the plain job id) when running under SLURM."""
    array_job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array_job and task:
        return f"{array_job}_{task}"
    return os.environ.get("SLURM_JOB_ID")


def device_name(spec: str) -> str:
    """The GPU's name, or the CPU's with the thread count, for ``model.device`` ``spec``."""
    if torch.cuda.is_available() and spec != "cpu":
        return torch.cuda.get_device_name(0)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
