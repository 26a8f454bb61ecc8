"""Sweep manifests (scripts/slurm_sweep.py): grid expansion, clear reports for missing presets, skip-if-complete,
idempotent regeneration, and a SIGTERM-stopped (preempted) job that resumes with nothing lost or duplicated."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvbench.app import sweep
from tests.run.conftest import RESUME_ARGS, RESUME_FOLDER

REPO = Path(__file__).resolve().parents[2]
FAST = ["model=tiny", "task=tiny_niah", "task.lengths=[1024]", "run.progress=false"]
ENV = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def sweep_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "scripts/slurm_sweep.py", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=env or ENV,
    )


@pytest.fixture
def conf_copy(tmp_path: Path) -> Path:
    """A copy of conf/ with a test experiment whose grid names one method preset that does not exist."""
    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf)
    (conf / "experiment" / "sweep_test.yaml").write_text(
        "# @package _global_\n"
        "run:\n  experiment: sweep_test\n"
        "hydra:\n  sweeper:\n    params:\n"
        "      model: tiny\n"
        "      task: tiny_niah\n"
        "      method: streamingllm,no_such_method,snapkv\n"
        "      budget: 64L,128L\n"
    )
    return conf


def test_expand_grid_cli_sweeps_win_and_fixed_overrides_are_kept() -> None:
    params = {"model": "a,b", "method": "x,y,z", "budget": "64L"}
    jobs = sweep.expand_grid(params, ["method=y", "budget=64L,128L", "task.num_samples=2"])
    assert jobs[0] == ["model=a", "method=y", "budget=64L", "task.num_samples=2"]
    assert len(jobs) == 2 * 1 * 2
    assert {tuple(j) for j in jobs} == {
        (f"model={m}", "method=y", f"budget={b}", "task.num_samples=2") for m in "ab" for b in ("64L", "128L")
    }


def test_expand_grid_range_and_glob_over_a_config_group() -> None:
    jobs = sweep.expand_grid({}, ["seed=range(0,3)", "budget=glob(ratio0.?,exclude=ratio0.8)"])
    budgets = sorted({j[1] for j in jobs})
    assert budgets == ["budget=ratio0.1", "budget=ratio0.2", "budget=ratio0.4", "budget=ratio0.5", "budget=ratio0.6"]
    assert sorted({j[0] for j in jobs}) == ["seed=0", "seed=1", "seed=2"]
    assert len(jobs) == 15


def test_plan_reports_missing_presets_clearly_and_keeps_the_rest(conf_copy: Path, tmp_path: Path) -> None:
    jobs = sweep.plan("sweep_test", [f"run.output_root={tmp_path / 'runs'}"], conf_dir=conf_copy)
    assert len(jobs) == 6
    invalid = [j for j in jobs if j.state == "invalid"]
    assert len(invalid) == 2
    assert all("method=no_such_method" in j.line for j in invalid)
    assert {j.reason for j in invalid} == {
        "method preset 'no_such_method' does not exist (no conf/method/no_such_method.yaml)"
    }
    assert [j.state for j in jobs if j.state != "invalid"] == ["new"] * 4
    text = sweep.manifest_text(jobs)
    lines = text.splitlines()
    assert len(lines) == 4 and "no_such_method" not in text
    assert all(shlex.split(line)[0] == "+experiment=sweep_test" for line in lines)
    report = sweep.summary(jobs)
    assert "6 jobs: 4 new, 0 partial, 0 complete, 2 invalid" in report
    assert "no_such_method" in report


def test_plan_gives_two_configs_of_one_run_folder_a_folder_each(tmp_path: Path) -> None:
    # method.window changes the config but not the folder name: the second job takes the variant folder
    # 64L@<hash> (as the runner does when the two start side by side); the same job twice is still refused.
    jobs = sweep.plan(None, [*FAST, "budget=64L", "method.window=8,16", f"run.output_root={tmp_path}"], name="dup")
    assert [j.state for j in jobs] == ["new", "new"]
    assert jobs[0].folder is not None and jobs[1].folder is not None
    assert jobs[0].folder.name == "64L"
    assert jobs[1].folder.name == "64L@" + jobs[1].details["config_hash"][:8]
    twice = sweep.plan(None, [*FAST, "budget=64L", "method.window=8,8", f"run.output_root={tmp_path}"], name="dup")
    assert [j.state for j in twice] == ["new", "invalid"]
    assert "the same run as job 0" in (twice[1].reason or "")


def test_unknown_experiment_is_a_clear_error() -> None:
    result = sweep_cli("no_such_experiment")
    assert result.returncode == 2
    assert "no experiment 'no_such_experiment'" in result.stderr and "cake_t1" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_manifest_skips_complete_jobs_and_resubmission_is_idempotent(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    manifest = tmp_path / "manifest.txt"
    grid = [
        "--name",
        "t",
        *FAST,
        "task.num_samples=1",
        "task.datasets=[niah_single_1k]",
        "method=streamingllm,snapkv",
        f"run.output_root={root}",
    ]
    first = sweep_cli(*grid, "-o", str(manifest))
    assert first.returncode == 0, first.stderr
    assert "2 jobs: 2 new" in first.stderr
    lines = manifest.read_text().splitlines()
    assert len(lines) == 2 and "method=streamingllm" in lines[0] and "method=snapkv" in lines[1]
    assert f"--array=0-1%16 {REPO}/slurm/array.sbatch {manifest} 0" in first.stdout

    # Job 1 runs (as array task 1 would), then the regenerated manifest holds only job 0.
    run = sweep_cli("--exec", str(manifest), env={**ENV, "SLURM_ARRAY_TASK_ID": "1"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert "kvbench job: python run.py" in run.stdout and "method=snapkv" in run.stdout
    meta = json.loads((root / "tiny/tiny_niah/snapkv/64L/run_meta.json").read_text())
    assert meta["status"] == "complete" and meta["datasets"] == ["niah_single_1k"]
    second = sweep_cli(*grid, "-o", str(tmp_path / "manifest2.txt"))
    assert "2 jobs: 1 new, 0 partial, 1 complete, 0 invalid" in second.stderr
    assert (tmp_path / "manifest2.txt").read_text().splitlines() == [lines[0]]

    # Re-running an already complete line (a resubmitted old array) does nothing and changes nothing.
    folder = root / "tiny/tiny_niah/snapkv/64L"
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    again = sweep_cli("--exec", str(manifest), "--index", "1")
    assert again.returncode == 0 and "already complete" in again.stdout
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before

    status = sweep_cli(*grid, "--status")
    assert status.returncode == 0 and not (REPO / "logs" / "sweeps" / "t").exists()
    assert "complete " in status.stdout and "new " in status.stdout

    out_of_range = sweep_cli("--exec", str(manifest), "--index", "5")
    assert out_of_range.returncode == 2 and "index 5 is out of range" in out_of_range.stderr


@pytest.mark.slow
def test_sigterm_mid_dataset_then_requeue_loses_and_duplicates_nothing(tmp_path: Path, clean_resume_run: Path) -> None:
    """A job preempted (SIGTERM) mid-dataset exits cleanly (143, status interrupted, only whole rows); the
    requeued job resumes and ends with predictions identical to an uninterrupted run's (tests/run/conftest.py's,
    shared with the SIGKILL test of test_runner.py)."""
    args = RESUME_ARGS
    clean_root, root = clean_resume_run, tmp_path / "preempted"
    manifest = tmp_path / "manifest.txt"
    manifest.write_text(shlex.join([*args, f"run.output_root={root}"]) + "\n")
    relative = RESUME_FOLDER
    target = root / relative / "niah_single_1k" / "predictions.jsonl"

    process = subprocess.Popen(
        [sys.executable, "scripts/slurm_sweep.py", "--exec", str(manifest)],
        cwd=REPO,
        env={**ENV, "SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_JOB_ID": "77", "SLURM_JOB_ID": "78"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 300
    while time.time() < deadline:
        if target.exists() and len(target.read_bytes().splitlines()) >= 3:
            break
        time.sleep(0.01)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr[-2000:]
    assert "interrupted" in stderr and "Traceback" not in stderr
    partial = target.read_bytes()
    assert partial.endswith(b"\n"), "a torn row was left behind"
    rows = [json.loads(line) for line in partial.splitlines()]
    assert 3 <= len(rows) < 24, "the job should have been stopped mid-dataset"
    assert len({row["id"] for row in rows}) == len(rows)
    assert not (target.parent / "metrics.json").exists()
    meta = json.loads((root / relative / "run_meta.json").read_text())
    assert meta["status"] == "interrupted" and meta["completed_datasets"] == []
    assert meta["slurm_job"] == "77_0"

    jobs = sweep.plan(None, [*args, f"run.output_root={root}"], name="x")
    assert [j.state for j in jobs] == ["partial"]

    requeued = sweep_cli("--exec", str(manifest), env={**ENV, "SLURM_ARRAY_TASK_ID": "0"})
    assert requeued.returncode == 0, requeued.stderr[-2000:]
    assert target.read_bytes() == (clean_root / relative / "niah_single_1k" / "predictions.jsonl").read_bytes()
    assert target.read_bytes().startswith(partial)
    clean_metrics = json.loads((clean_root / relative / "niah_single_1k" / "metrics.json").read_text())
    metrics = json.loads((target.parent / "metrics.json").read_text())
    assert metrics["score"] == clean_metrics["score"] and metrics["n_samples"] == 24
    assert json.loads((root / relative / "run_meta.json").read_text())["status"] == "complete"
    assert [j.state for j in sweep.plan(None, [*args, f"run.output_root={root}"], name="x")] == ["complete"]


def test_sigterm_during_a_write_is_deferred_until_the_write_is_done() -> None:
    from kvbench.errors import Interrupted
    from kvbench.storage.termination import TERMINATION, graceful_termination

    written = []
    with graceful_termination():
        with pytest.raises(Interrupted), TERMINATION.critical():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # the handler runs here: deferred, not raised
            written.append("row")
        assert written == ["row"]
    # Outside a critical section the signal interrupts at once.
    with graceful_termination(), pytest.raises(Interrupted):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_sbatch_commands_split_large_manifests(tmp_path: Path) -> None:
    commands = sweep.sbatch_commands(tmp_path / "m.txt", 2500, 32, 1000, ["--partition=gpu"])
    assert [c[2] for c in commands] == ["--array=0-999%32", "--array=0-999%32", "--array=0-499%32"]
    assert [c[-1] for c in commands] == ["0", "1000", "2000"]
    assert all(c[3] == "--partition=gpu" and c[4].endswith("slurm/array.sbatch") for c in commands)
    assert sweep.sbatch_commands(tmp_path / "m.txt", 3, 0, 1000)[0][2] == "--array=0-2"


def test_array_tasks_get_their_own_hydra_log_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    assert sweep.hydra_log_override(["model=tiny"]) == []
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "41")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    assert sweep.hydra_log_override(["model=tiny"]) == ["hydra.run.dir=logs/hydra/slurm/41_3"]
    assert sweep.hydra_log_override(["hydra.run.dir=/x"]) == []
