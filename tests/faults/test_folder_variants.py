"""Runs that differ never collide (issue #60, items 1 and 3): a config whose plain folder holds another config's
results takes the variant folder ``<budget>@<hash8>`` beside it, both resume, the tables show both; a command
refused before its run starts leaves no trace under ``results/``; a change under ``results/`` never marks the
recorded commit dirty."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvbench.reporting.aggregate import load_runs
from kvbench.storage import provenance
from kvbench.storage.folder import run_folder_lock
from kvbench.storage.paths import resolve_variant, run_folder, variant_folder
from kvbench.storage.writers import config_hash
from tests.faults.conftest import DATASET, RUN, compose_job, run_job_status

REPO = Path(__file__).resolve().parents[2]


#: What a rerun that computes nothing still rewrites (start and end times, the run's summary, the results root
#: recorded in ``config.yaml``: the run was copied from another root).
REWRITTEN = ("run_meta.json", "summary.json", "config.yaml")


def tree_bytes(folder: Path, rewritten_too: bool = True) -> dict[str, bytes]:
    """Every file under ``folder`` (the lock file aside) with its bytes; without :data:`REWRITTEN` unless
    ``rewritten_too``."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "lock" not in p.name and (rewritten_too or p.name not in REWRITTEN)
    }


def test_other_settings_take_a_variant_folder_and_both_runs_resume(damaged_root: Path, capsys) -> None:
    plain = damaged_root / RUN
    before = tree_bytes(plain)
    other = compose_job(damaged_root, "method.window=16")
    expected = variant_folder(plain, config_hash(other))
    assert run_folder(other) == expected and expected.name.startswith("64L@")
    code, err = run_job_status(damaged_root, capsys, "method.window=16")
    assert code == 0, err
    assert f"this run's results go to {expected.name}" in err and "method.window: 32 -> 16" in err
    assert (expected / DATASET / "predictions.jsonl").exists()
    assert tree_bytes(plain) == before  # the first run's files are untouched
    # Both commands again: each finds its own folder and computes nothing (its results stay byte for byte).
    results_before = {folder: tree_bytes(folder, rewritten_too=False) for folder in (plain, expected)}
    for overrides in ((), ("method.window=16",)):
        code, err = run_job_status(damaged_root, capsys, *overrides)
        assert code == 0 and "Traceback" not in err, err
    for folder in (plain, expected):
        after = tree_bytes(folder, rewritten_too=False)
        assert after == results_before[folder], [k for k in after if after[k] != results_before[folder].get(k)]
    assert run_folder(compose_job(damaged_root)) == plain
    # The tables show two runs, told apart by the variant's hash, not one run with a duplicate warning.
    runs = load_runs(damaged_root)
    assert sorted(str(tag) for tag in runs["tag"]) == sorted(["None", "@" + expected.name.split("@")[1]])


def test_a_live_run_of_another_config_sends_the_next_to_its_variant(tmp_path: Path) -> None:
    cfg = compose_job(tmp_path / "runs")
    plain = tmp_path / "runs" / RUN
    mine = config_hash(cfg)
    # Another process's run of another config holds the plain folder (it has written nothing yet): side by side,
    # the second job of a sweep takes its own folder instead of failing "in use".
    with run_folder_lock(plain, wait_s=0, config="0123456789abcdef"):
        assert resolve_variant(plain, cfg, mine) == variant_folder(plain, mine)
    # The same config held elsewhere is the same run: the plain folder (whose lock then says "in use").
    with run_folder_lock(plain, wait_s=0, config=mine):
        assert resolve_variant(plain, cfg, mine) == plain
    assert resolve_variant(plain, cfg, mine) == plain


def test_a_refused_command_leaves_nothing_under_results(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    for argv in (
        ["method=cake", "budget=128L", "task=longbench"],  # refused by the runner: LongBench's data is not here
        ["-m", "method=cake,snapkv", "budget=128L", "task=longbench"],  # the same, as a sweep's first job
    ):
        done = subprocess.run(
            [sys.executable, str(REPO / "run.py"), *argv], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert done.returncode == 2, done.stderr[-2000:]
        assert "Traceback" not in done.stderr
        assert list(tmp_path.iterdir()) == [], sorted(str(p) for p in tmp_path.rglob("*"))


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def small_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A git repository with a tracked source file and a tracked file under ``results/``, as the checkout."""
    repo = tmp_path / "checkout"
    (repo / "results").mkdir(parents=True)
    (repo / "kvbench.py").write_text("code\n")
    (repo / "results" / "grid.md").write_text("table\n")
    git(repo, "init", "-q")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    monkeypatch.setattr("kvbench.resources.checkout_dir", lambda: repo)
    return repo


def test_results_written_in_the_checkout_never_mark_the_commit_dirty(small_checkout: Path) -> None:
    head = git(small_checkout, "rev-parse", "HEAD").strip()
    assert provenance.git_commit() == head
    (small_checkout / "results" / "grid.md").write_text("a rewritten table\n")
    (small_checkout / "results" / "new.csv").write_text("x\n")
    assert provenance.git_commit() == head
    (small_checkout / "kvbench.py").write_text("changed code\n")
    assert provenance.git_commit() == head + "-dirty"
