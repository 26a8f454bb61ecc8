"""Cleanup touches only what this run created (issue #55 item 4): a run folder moved or replaced mid-run ends with
one message and nothing deleted -- neither the replacement's files nor the moved folder's."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import kvbench.storage.writers as writers
from tests.faults.conftest import DATASET, RUN, assert_one_line_error, run_job_status


def move_on_first_append(monkeypatch, action) -> None:
    """Run ``action()`` just before the run's first prediction row is appended."""
    real = writers.PredictionLog.append
    calls = []

    def append(self, row):
        if not calls:
            calls.append(1)
            action()
        return real(self, row)

    monkeypatch.setattr(writers.PredictionLog, "append", append)


@pytest.mark.parametrize("how", ["moved", "replaced"])
def test_a_folder_moved_or_replaced_mid_run_ends_clearly_and_nothing_is_deleted(
    tmp_path: Path, capsys, monkeypatch, how: str
) -> None:
    root = tmp_path / "runs"
    folder, elsewhere = root / RUN, root / RUN.parent / "moved"

    def move() -> None:
        shutil.move(folder, elsewhere)
        if how == "replaced":  # another folder in its place, holding a config and an empty dataset folder
            (folder / DATASET).mkdir(parents=True)
            (folder / "config.yaml").write_text("not this run's\n")

    move_on_first_append(monkeypatch, move)
    code, stderr = run_job_status(root, capsys)
    said = "was replaced by another folder" if how == "replaced" else "is gone (moved or removed)"
    assert_one_line_error(code, stderr, str(folder), said, "nothing was deleted", "rerun the same command")
    assert (elsewhere / "config.yaml").is_file() and (elsewhere / "run_meta.json").is_file()  # the moved one: intact
    if how == "replaced":
        assert (folder / "config.yaml").read_text() == "not this run's\n" and (folder / DATASET).is_dir()
    else:
        assert not folder.exists()  # nothing recreated at the old place
