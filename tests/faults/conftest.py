"""Shared pieces of the fault-injection suite: a finished tiny run to damage, and a way to run a job as run.py does.

One finished run (tiny model, one 1K NIAH dataset, 2 samples) is made once per session; each test damages a copy
of it, so a damage never leaks into another test.  The ``undamaged`` copy is what every repair must reproduce byte
for byte (``predictions.jsonl``; ``metrics.json`` less its timings, which are wall-clock seconds).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from kvbench.app.cli import reporting_hydra_errors, run_job
from kvbench.app.overrides import prepare_overrides
from kvbench.config import register_configs

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
#: The run folder under a results root, and its one dataset.
RUN = Path("tiny") / "tiny_niah" / "snapkv" / "64L"
DATASET = "niah_single_1k"
BASE = ["task.lengths=[1024]", "task.num_samples=2", f"task.datasets=[{DATASET}]", "run.progress=false"]


def compose_job(root: Path, *overrides: str):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        # As run.py does (kvbench.app.cli.main): budget specs and numbers given to a group read as names.
        overrides = prepare_overrides([*BASE, f"run.output_root={root}", "run.print_table=false", *overrides])
        return compose("config", overrides=overrides)


def run_job_status(root: Path, capsys: pytest.CaptureFixture[str], *overrides: str) -> tuple[int, str]:
    """Run one job in-process exactly as run.py does; its exit status (0 when it returned) and its stderr."""
    capsys.readouterr()
    code = 0
    register_configs()
    try:
        with reporting_hydra_errors(list(overrides)):
            run_job(compose_job(root, *overrides))
    except SystemExit as exited:
        code = int(exited.code or 0)
    return code, capsys.readouterr().err


def assert_one_line_error(code: int, stderr: str, *expected: str) -> None:
    """Exit 2, no traceback, and one ``error:`` line naming everything in ``expected``."""
    assert code == 2, stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-2000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr[-2000:]
    for text in expected:
        assert text in errors[0], errors[0]


def comparable_metrics(path: Path) -> dict:
    """``metrics.json`` without its timings (wall-clock seconds differ between any two runs)."""
    payload = json.loads(path.read_text())
    payload.pop("timing", None)
    return payload


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results root holding one finished run (made once per session; never damaged: copy it)."""
    from kvbench.app.validation import validate_run
    from kvbench.run.runner import Runner

    root = tmp_path_factory.mktemp("finished") / "runs"
    Runner(validate_run(compose_job(root))).run()
    return root


@pytest.fixture
def damaged_root(finished_run: Path, tmp_path: Path) -> Path:
    """A private copy of :func:`finished_run` for one test to damage."""
    root = tmp_path / "runs"
    shutil.copytree(finished_run, root)
    return root
