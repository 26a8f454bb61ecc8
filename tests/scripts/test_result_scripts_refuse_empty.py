"""The scripts that build tables, grids and aggregates from run folders (issue #48): given a runs folder that does not
exist or holds no run, each exits with status 2 and one line naming the folder, and writes nothing -- committed
tables (``results/smollm2_grid/grid.{md,csv}``) and earlier outputs are never replaced by empty ones.

In-process through each script's ``main`` (no interpreter start), except the issue's own command line, run once as
a process to check the exit status a shell sees.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def script(name: str) -> ModuleType:
    """``scripts/<name>.py`` as a module (the scripts folder is not a package)."""
    spec = importlib.util.spec_from_file_location(f"script_{name}", REPO / "scripts" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the script is executed
    spec.loader.exec_module(module)
    return module


def folder_snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_tables_on_a_missing_runs_folder_exits_2_in_one_line() -> None:
    """The issue's command, as a shell runs it: ``scripts/tables.py --runs /no/such/path`` exits 2."""
    done = subprocess.run(
        [sys.executable, "scripts/tables.py", "--runs", "/no/such/path", "--out", "/no/such/out", "--no-plots"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().count("\n") == 0 and "/no/such/path is not a folder" in done.stderr
    assert "Traceback" not in done.stderr and not Path("/no/such/out").exists()


@pytest.mark.parametrize("extra", [[], ["--pdf"]], ids=["make-tables", "make-tables-pdf"])
def test_tables_on_an_empty_runs_folder_keep_the_tables_there(
    tmp_path: Path, extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    runs, out, plots = tmp_path / "runs", tmp_path / "tables", tmp_path / "plots"
    runs.mkdir()
    out.mkdir()
    (out / "cake_t1.md").write_text("an earlier table\n")
    argv = ["--runs", str(runs), "--out", str(out), "--plots", str(plots), *extra]
    assert script("tables").main(argv) == 2
    err = capsys.readouterr().err
    assert f"no runs under {runs}" in err and err.strip().count("\n") == 0
    assert folder_snapshot(out) == {"cake_t1.md": b"an earlier table\n"} and not plots.exists()


@pytest.mark.parametrize("missing", [False, True], ids=["empty-folder", "no-folder"])
def test_aggregate_refuses_no_runs_and_keeps_its_csv(
    tmp_path: Path, missing: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    if not missing:
        (runs / "tiny" / "tiny_niah").mkdir(parents=True)  # folders, but no metrics.json
    out = tmp_path / "tables" / "runs.csv"
    out.parent.mkdir()
    out.write_text("model,score\ntiny,100\n")
    assert script("aggregate").main(["--runs", str(runs), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(runs) in err and err.startswith("error: no runs") and err.strip().count("\n") == 0
    assert folder_snapshot(out.parent) == {"runs.csv": b"model,score\ntiny,100\n"}


def test_smollm2_grid_table_without_runs_leaves_the_committed_grid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python scripts/smollm2_grid.py table`` on a fresh clone (the committed grid.md / grid.csv, no run folders):
    exit 2, both files byte for byte as committed."""
    out = tmp_path / "smollm2_grid"
    shutil.copytree(REPO / "results" / "smollm2_grid", out, ignore=shutil.ignore_patterns("runs", "samples"))
    before = folder_snapshot(out)
    assert {"grid.md", "grid.csv"} <= set(before) and len(before["grid.csv"]) > 1000
    assert script("smollm2_grid").main(["table", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no finished run" in err and "left as they are" in err and err.strip().count("\n") == 0
    assert folder_snapshot(out) == before


def test_smollm2_grid_reasoning_phase_plans_full_and_two_methods_greedy_and_sampled() -> None:
    """Phase 7 (long reasoning, opt-in): GSM8K's fixtures with the full cache, SnapKV and H2O, greedy and sampled."""
    grid = script("smollm2_grid")
    planned = {(cell.name, method, budget) for _, cell, method, budget, _ in grid.planned_runs([7])}
    assert planned == {
        (f"gsm8k_{decoding}", method, budget)
        for decoding in ("greedy", "sampled")
        for method, budget in (("full", "full"), ("snapkv", "64L"), ("h2o", "64L"))
    }
    assert all(run[0] == 7 for run in grid.planned_runs([7])) and not any(r[0] == 7 for r in grid.planned_runs([1, 2]))


def test_smollm2_grid_prefill_phase_plans_issue_43s_families_on_ruler_2k_at_256l(tmp_path: Path) -> None:
    """Phase 8 (opt-in): the full cache and every prefill family of issue #43 at 256L question-aware on RULER 2K;
    Q-Filters read the filters the run computes under its output folder."""
    grid = script("smollm2_grid")
    planned = [(cell.name, method, budget, mode) for _, cell, method, budget, mode in grid.planned_runs([8])]
    assert planned == [("ruler2k", "full", "full", "aware")] + [
        ("ruler2k", method, "256L", "aware") for method in grid.PREFILL_METHODS
    ]
    assert {"qfilter", "expected_attention", "snapkv_kvpress"} <= set(grid.PREFILL_METHODS)
    assert grid.method_overrides("qfilter", tmp_path) == (f"method.params.filters={tmp_path / grid.QFILTER_FILE}",)
    assert grid.method_overrides("knorm", tmp_path) == ()
    assert not any(run[0] == 8 for run in grid.planned_runs([1, 2, 3, 4, 5, 6, 7]))
