"""Shared pieces of the runner tests: ``python run.py`` runs that several tests read, each made once per session.

* :func:`default_run`: a default-style run (snapkv 64L, the three 1K tiny_niah datasets, 2 samples each).
  tests/run/test_runner.py checks its files and reuses its folder with a changed config (refused);
  tests/run/test_concurrency.py compares a job run concurrently with it (same predictions as a run on its own).
* :func:`clean_resume_run`: the uninterrupted run that the kill / preemption tests compare with.
  tests/run/test_runner.py (SIGKILL, then ``run.py`` again) and tests/run/test_sweep.py (SIGTERM under
  ``scripts/slurm_sweep.py --exec``, then the requeue) both resume a 24-sample StreamingLLM run and compare the
  result with an uninterrupted run of the same configuration, byte for byte.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: The environment of every ``run.py`` these fixtures start.
ENV = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
#: A fast configuration: the embedded default model, short synthetic samples.
FAST = ["model=tiny", "task=tiny_niah", "task.lengths=[1024]", "run.progress=false"]
#: The default-style run: 3 datasets x 2 samples, snapkv at 64L (the defaults).
DEFAULT_STYLE = [*FAST, "task.num_samples=2"]
#: The configuration both resume tests interrupt: 24 samples of one 1K dataset, StreamingLLM, the tiny model.
RESUME_ARGS = [*FAST, "task.num_samples=24", "task.datasets=[niah_single_1k]", "method=streamingllm"]
#: Its run folder under a results root.
RESUME_FOLDER = Path("tiny/tiny_niah/streamingllm/64L")


def run_py(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "run.py", *args], cwd=REPO, capture_output=True, text=True, timeout=600, env=ENV
    )


@pytest.fixture(scope="session")
def default_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """(results root, completed process) of one ``python run.py`` with :data:`DEFAULT_STYLE` (its folder:
    ``<root>/tiny/tiny_niah/snapkv/64L``).  Tests read it and may add runs of other configurations beside it; none
    changes its folder."""
    root = tmp_path_factory.mktemp("default_run") / "runs"
    return root, run_py(*DEFAULT_STYLE, f"run.output_root={root}")


@pytest.fixture(scope="session")
def clean_resume_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The results root of one uninterrupted ``python run.py`` of :data:`RESUME_ARGS` (its folder:
    ``<root>/`` :data:`RESUME_FOLDER`)."""
    root = tmp_path_factory.mktemp("clean_resume_run")
    result = run_py(*RESUME_ARGS, f"run.output_root={root}")
    assert result.returncode == 0, result.stderr[-3000:]
    return root
