"""Results paths are expanded or refused explicitly, before any work (issue #42, item 3): an empty root, a ``~``
root, a file in the way of the root or of the run folder; Hydra's own logs never land in the current folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbench.errors import KVBenchError
from kvbench.storage.paths import expand_root, hydra_log_dir
from tests.faults.conftest import RUN, assert_one_line_error, run_job_status


def test_empty_root_is_refused_and_nothing_lands_in_the_current_folder(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    for empty in ("run.output_root=", "run.output_root=' '"):
        code, err = run_job_status(tmp_path, capsys, empty)
        assert_one_line_error(code, err, "run.output_root=")
    assert list(tmp_path.iterdir()) == []


def test_tilde_root_is_expanded_and_unknown_users_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert expand_root("~/x") == tmp_path / "home" / "x"
    with pytest.raises(KVBenchError, match="~nosuchuser is not a user"):
        expand_root("~nosuchuser/x")
    assert hydra_log_dir("") == hydra_log_dir("~nosuchuser/x") != "logs/hydra"


@pytest.mark.parametrize("in_the_way", ["root", "model", "run"])
def test_a_file_in_the_way_is_named_before_any_work(tmp_path: Path, capsys, in_the_way: str) -> None:
    root = tmp_path / "runs"
    blocker = {"root": root, "model": root / RUN.parts[0], "run": root / RUN}[in_the_way]
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a folder")
    code, err = run_job_status(root, capsys)
    assert_one_line_error(code, err, f"{blocker} is a file, not a folder", "Move that file away")
    assert blocker.read_text() == "not a folder"


# run.py end to end with a ~ root (results under $HOME, Hydra's logs beside them, nothing in the current folder):
# tests/faults/test_sweeps_and_budgets.py::test_continue_on_error_runs_the_rest_and_records_each_failure
