"""A run folder's lock cannot be stolen (issue #42, item 2): removing or replacing the lock file while a run holds
the folder lets no second writer in; a folder replaced under a run stops that run before its next write; an
identical concurrent run is refused before the model loads."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvbench.errors import KVBenchError
from kvbench.storage.folder import check_not_locked, run_folder_lock
from kvbench.storage.writers import PredictionLog, atomic_write_json
from tests.faults.conftest import REPO, RUN, assert_one_line_error, run_job_status

IN_USE = "in use by another kvbench process"


@pytest.mark.parametrize("damage", ["remove", "replace"])
def test_lock_file_removed_or_replaced_while_held_lets_no_second_writer_in(tmp_path: Path, damage: str) -> None:
    folder = tmp_path / "run"
    with run_folder_lock(folder, wait_s=0) as lock:
        lock.unlink()
        if damage == "replace":
            lock.write_text("pid 999999 on nowhere, since then\n")
        with pytest.raises(KVBenchError, match=IN_USE):
            check_not_locked(folder)  # the cheap probe before any heavy work
        with pytest.raises(KVBenchError, match=IN_USE), run_folder_lock(folder, wait_s=0):
            pass
        PredictionLog(folder / "d" / "predictions.jsonl").append({"id": "a", "prediction": "x"})  # still ours
    with run_folder_lock(folder, wait_s=0):  # released on exit
        pass


def test_identical_run_is_refused_before_the_model_loads(tmp_path: Path, capsys, monkeypatch) -> None:
    """Another process holds the folder (its lock file even removed): the second run exits 2 before loading."""
    import kvbench.run.runner

    root = tmp_path / "runs"
    folder = root / RUN
    script = (
        "import sys, time; from pathlib import Path; from kvbench.storage.folder import run_folder_lock\n"
        "with run_folder_lock(Path(sys.argv[1])) as lock:\n"
        "    lock.unlink(); print('locked', flush=True); time.sleep(60)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", script, str(folder)], cwd=REPO, stdout=subprocess.PIPE, text=True)

    def no_loading(*args, **kwargs):
        raise AssertionError("the model loaded")

    monkeypatch.setattr(kvbench.run.runner, "load_model", no_loading)
    try:
        assert holder.stdout.readline().strip() == "locked"
        code, err = run_job_status(root, capsys)
        assert_one_line_error(code, err, str(folder), IN_USE)
        # Past the cheap probe (as if the holder started just after it): the claim still refuses, still unloaded.
        monkeypatch.setattr("kvbench.app.validation.check_not_locked", lambda folder: None)
        code, err = run_job_status(root, capsys)
        assert_one_line_error(code, err, str(folder), IN_USE)
    finally:
        holder.kill()
        holder.wait()
    assert sorted(p.name for p in folder.iterdir()) == []  # the holder made the folder; nobody wrote in it


def test_folder_replaced_under_a_run_stops_it_before_its_next_write(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    log = PredictionLog(folder / "d" / "predictions.jsonl")
    with run_folder_lock(folder, wait_s=0):
        log.append({"id": "a", "prediction": "x"})
        shutil.move(folder, tmp_path / "moved")
        folder.mkdir()  # a second process could lock this new folder now
        with pytest.raises(KVBenchError, match=r"removed or replaced while this run held .* rerun the same command"):
            log.append({"id": "b", "prediction": "y"})
        with pytest.raises(KVBenchError, match="removed or replaced"):
            atomic_write_json(folder / "d" / "metrics.json", {})
    assert not (folder / "d").exists()


def test_without_directory_locks_the_lock_file_is_the_lock_and_is_checked(tmp_path: Path, monkeypatch) -> None:
    """NFS: ``flock`` on a directory fails (EBADF); the lock file is the lock, and a run whose lock file was
    removed or replaced stops before its next write (docs/results.md, "Locks")."""
    real_flock = fcntl.flock

    def nfs_flock(fd, operation):
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(errno.EBADF, "Bad file descriptor")
        return real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", nfs_flock)
    folder = tmp_path / "run"
    log = PredictionLog(folder / "d" / "predictions.jsonl")
    with run_folder_lock(folder, wait_s=0) as lock:
        log.append({"id": "a", "prediction": "x"})
        with pytest.raises(KVBenchError, match=IN_USE), run_folder_lock(folder, wait_s=0):
            pass
        lock.unlink()
        with pytest.raises(KVBenchError, match="removed or replaced"):
            log.append({"id": "b", "prediction": "y"})
    assert [json.loads(line)["id"] for line in log.path.read_text().splitlines()] == ["a"]
