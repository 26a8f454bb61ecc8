"""What the views show is checked against the rows (issue #55 item 2): ``kvbench report``, ``scripts/tables.py`` and
the site read their scores through :func:`kvbench.reporting.aggregate.load_runs`, which shows n = the complete rows
on disk, leaves out (and flags) a score its rows do not give, flags incomplete and mixed-code runs wherever runs are
ranked, and lists incomplete runs (even one that finished no dataset) with the command that completes them in the
results folder they are in now."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kvbench.run.fingerprints as fingerprints
from kvbench.reporting.aggregate import incomplete_run_notes, load_runs
from kvbench.reporting.dashboard_data import leaderboards, load_dashboard_runs
from kvbench.views.run_views import read_run_extras
from tests.faults.conftest import DATASET, RUN, run_job_status


def test_n_is_the_complete_rows_on_disk_and_a_disagreeing_score_is_left_out(damaged_root: Path) -> None:
    predictions = damaged_root / RUN / DATASET / "predictions.jsonl"
    predictions.write_text(predictions.read_text().splitlines(keepends=True)[0])  # 1 of the 2 rows metrics counts
    with pytest.warns(UserWarning, match="holds 1 complete rows, metrics.json counts 2"):
        (row,) = load_runs(damaged_root).to_dict("records")
    assert row["n_samples"] == 1 and row["score"] != row["score"] and row["flags"] == "disagrees"
    assert read_run_extras(damaged_root / RUN, [DATASET])["datasets"][DATASET]["n_samples"] == 1  # the site's n


def test_an_interrupted_run_is_flagged_where_ranked_and_listed_with_its_command(damaged_root: Path) -> None:
    meta_path = damaged_root / RUN / "run_meta.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "status": "interrupted", "command": ["run.py", "run.output_root=/gone"]}))
    never = damaged_root / RUN.parent / "128L"  # interrupted before its first dataset finished: no metrics.json
    never.mkdir()
    (never / "run_meta.json").write_text(json.dumps({**meta, "status": "failed", "command": ["run.py", "budget=128L"]}))

    (board,) = leaderboards(load_dashboard_runs(damaged_root), paper=lambda scores: {})
    (row,) = board["rows"]
    assert "incomplete" in row["flags"]
    notes = incomplete_run_notes(damaged_root)
    assert len(notes) == 2 and all(f"run.output_root={damaged_root}" in note for note in notes)
    assert "/gone" not in "".join(notes) and "budget=128L" in notes[0] + notes[1]
    shown = read_run_extras(damaged_root / RUN, [DATASET])["provenance"]["rerun_command"]  # the site's
    assert shown.endswith(f"run.output_root={damaged_root}") and "/gone" not in shown


def test_a_dataset_resumed_by_other_kvbench_code_is_flagged_mixed_code(damaged_root: Path, capsys, monkeypatch):
    folder = damaged_root / RUN / DATASET
    (folder / "metrics.json").unlink()
    rows = (folder / "predictions.jsonl").read_text().splitlines(keepends=True)
    (folder / "predictions.jsonl").write_text(rows[0])
    monkeypatch.setattr(fingerprints, "kvbench_source_digest", lambda: "0123456789abcdef")  # kvbench edited meanwhile
    code, stderr = run_job_status(damaged_root, capsys)
    assert code == 0, stderr[-2000:]
    assert len(json.loads((folder / "metrics.json").read_text())["code"]["sources"]) == 2
    (row,) = load_runs(damaged_root).to_dict("records")
    assert row["flags"] == "mixed-code" and row["n_samples"] == 2


def test_kvbench_report_warns_lists_and_flags_in_one_line_each(damaged_root: Path, tmp_path: Path, capsys) -> None:
    from kvbench.app.dashboards import main

    predictions = damaged_root / RUN / DATASET / "predictions.jsonl"
    predictions.write_text(predictions.read_text().splitlines(keepends=True)[0])
    meta_path = damaged_root / RUN / "run_meta.json"
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "status": "interrupted"}))
    assert main(["report", str(damaged_root), "--out", str(tmp_path / "site")]) == 0
    stderr = capsys.readouterr().err
    assert "Traceback" not in stderr and "UserWarning" not in stderr
    assert any(line.startswith("warning: ") and "disagrees" in line for line in stderr.splitlines())
    assert any(line.startswith("note: run ") and "incomplete" in line for line in stderr.splitlines())


def test_a_paper_table_says_which_of_its_runs_are_flagged(tmp_path: Path) -> None:
    from kvbench.reporting.synthetic import write_synthetic_runs
    from kvbench.reporting.tables import build_all, write_tables

    root = tmp_path / "runs"
    write_synthetic_runs(root, ["cake_t1"], noise=0.5)
    folder = sorted(root.rglob("metrics.json"))[0].parent.parent  # one run: interrupted
    (folder / "run_meta.json").write_text(json.dumps({"status": "interrupted", "command": ["run.py"]}))
    write_tables(build_all(load_runs(root), tables=["cake_t1"]), tmp_path / "tables", ["md"])
    text = (tmp_path / "tables" / "cake_t1.md").read_text()
    (line,) = [line for line in text.splitlines() if line.startswith("**Flagged runs**")]
    assert "(incomplete)" in line and folder.parent.name in line  # the method
