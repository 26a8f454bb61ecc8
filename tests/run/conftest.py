"""Shared pieces of the runner tests: the uninterrupted run that the kill / preemption tests compare with.

tests/run/test_runner.py (SIGKILL, then ``run.py`` again) and tests/run/test_sweep.py (SIGTERM under
``scripts/slurm_sweep.py --exec``, then the requeue) both resume a 24-sample StreamingLLM run and compare the result
with an uninterrupted run of the same configuration, byte for byte: :func:`clean_resume_run` makes that run once per
session (one ``python run.py``), instead of once per test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: The configuration both resume tests interrupt: 24 samples of one 1K dataset, StreamingLLM, the tiny model.
RESUME_ARGS = [
    "model=tiny",
    "task=tiny_niah",
    "task.lengths=[1024]",
    "run.progress=false",
    "task.num_samples=24",
    "task.datasets=[niah_single_1k]",
    "method=streamingllm",
]
#: Its run folder under a results root.
RESUME_FOLDER = Path("tiny/tiny_niah/streamingllm/64L")


@pytest.fixture(scope="session")
def clean_resume_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The results root of one uninterrupted ``python run.py`` of :data:`RESUME_ARGS` (its folder:
    ``<root>/`` :data:`RESUME_FOLDER`)."""
    root = tmp_path_factory.mktemp("clean_resume_run")
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "run.py", *RESUME_ARGS, f"run.output_root={root}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return root
