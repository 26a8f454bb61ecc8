"""A sweep is checked whole before its first job, and can keep going past failures (issue #42, item 4); a budget
that cannot mean what was asked is named after what ran, warned about once, and keeps its own folder (item 5)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvbench.app.cli import check_sweep
from kvbench.app.validation import check_config
from kvbench.errors import KVBenchError
from kvbench.run.records import warn_if_not_as_asked
from kvbench.storage.paths import run_folder
from tests.faults.conftest import BASE, REPO, compose_job, run_job_status


def test_sweep_with_bad_values_lists_every_bad_job_and_runs_none(tmp_path: Path, capsys) -> None:
    args = ["-m", "method=snapkv,h2o", "budget.spec=64L,0L,128L", f"run.output_root={tmp_path / 'runs'}", *BASE]
    with pytest.raises(SystemExit) as exited:
        check_sweep(args, continue_on_error=False)
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    assert "Traceback" not in err and "error: 2 of 6 jobs of this sweep are invalid, so none ran" in err
    bad = [line for line in err.splitlines() if line.startswith("  job ")]
    assert [line.split(" (")[0].strip() for line in bad] == ["job 1", "job 4"]
    assert all("budget.spec=0L" in line and "must be positive" in line for line in bad)
    assert not (tmp_path / "runs").exists()
    check_sweep(args, continue_on_error=True)  # listed as a warning, the sweep goes on
    assert "warning: 2 of 6 jobs" in capsys.readouterr().err
    with pytest.raises(KVBenchError, match="applies to sweeps only"):
        check_sweep([*BASE], continue_on_error=True)  # the switch is for sweeps only (main reports it: exit 2)


def test_continue_on_error_runs_the_rest_and_records_each_failure(tmp_path: Path) -> None:
    """End to end through run.py, with ``run.output_root='~/res'`` (item 3 too): the root is expanded under $HOME (no
    folder named ``~``), Hydra's logs and the failure record go beside it, and nothing lands in the current folder."""
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    env = {**os.environ, "HOME": str(home), "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    args = ["-m", "--continue-on-error", "method=streamingllm", "budget.spec=0L,64L", *BASE]
    args += ["task.num_samples=1", "run.print_table=false", "run.output_root='~/res'"]
    command = [sys.executable, str(REPO / "run.py"), *args]
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert "job 0 failed (exit 2)" in result.stderr and "1 job(s) of this sweep failed" in result.stderr
    assert (home / "res" / "tiny" / "tiny_niah" / "streamingllm" / "64L" / "summary.json").exists()  # job 1 ran
    failed = [json.loads(line) for line in (home / "logs" / "hydra" / "multirun" / "failed_jobs.jsonl").open()]
    assert [(row["job"], row["exit_status"]) for row in failed] == [(0, 2)]
    assert "budget.spec=0L" in failed[0]["overrides"]
    assert list(cwd.iterdir()) == []


@pytest.mark.parametrize(
    ("overrides", "name"),
    [
        (["budget.spec=999999L"], "999999L"),
        (["budget.spec=128/layer"], "128perlayer"),
        (["budget=ratio0.2", "budget.spec=0.3x"], "ratio0.3"),
        (["budget=128perlayer"], "128perlayer"),
        (["budget.name=mine", "budget.spec=96L"], "mine"),
    ],
)
def test_a_budget_is_named_after_its_spec_never_the_preset_it_replaced(
    tmp_path: Path, overrides: list[str], name: str
) -> None:
    cfg = compose_job(tmp_path, *overrides)
    check_config(cfg)
    assert cfg.budget.name == name and run_folder(cfg).name == name


def test_budget_above_the_context_runs_in_its_own_folder_with_one_warning(tmp_path: Path, capsys, caplog) -> None:
    root = tmp_path / "runs"
    with caplog.at_level(logging.WARNING):
        code, err = run_job_status(root, capsys, "budget.spec=999999L")
    assert code == 0, err[-2000:]
    assert caplog.text.count("is at or above the context") == 1
    folder = root / "tiny" / "tiny_niah" / "snapkv" / "999999L" / "niah_single_1k"
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["budget"] == "999999L" and metrics["cache"]["samples_evicted"] == 0
    for line in (folder / "predictions.jsonl").read_text().splitlines():
        cache = json.loads(line)["cache"]
        assert cache["requested_per_layer"] == [cache["context_tokens"]] * len(cache["requested_per_layer"])
    assert not (root / "tiny" / "tiny_niah" / "snapkv" / "64L").exists()


def test_window_wider_than_the_budget_is_warned_once(tmp_path: Path, caplog) -> None:
    cfg = compose_job(tmp_path, "method.window=100", "budget=64L", "model.name=window-test")
    cache = {"requested_per_layer": [64, 64], "evicted": True, "context_tokens": 1000}
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            warn_if_not_as_asked(cache, cfg)
    assert caplog.text.count("method.params.window=100 is wider than the per-layer budget (64 tokens") == 1
