"""The runner end to end: results files, resume after a kill, config-hash guard (bad input: test_bad_input.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvbench.models.tiny import DEFAULT_MODEL_DIR
from tests.run.conftest import DEFAULT_STYLE, RESUME_ARGS, RESUME_FOLDER

REPO = Path(__file__).resolve().parents[2]
# A fast configuration: random tiny model, short synthetic samples.
FAST = ["model=tiny", "task=tiny_niah", "task.lengths=[1024]", "run.progress=false"]
#: Layers of the embedded default model (models/tiny-niah), which the per-layer cache records list.
TINY_CONFIG = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())
TINY_LAYERS = TINY_CONFIG["num_hidden_layers"]


def run_cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "run.py", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env
    )


def test_default_style_run_writes_all_result_files(default_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    root, result = default_run
    assert result.returncode == 0, result.stderr[-3000:]
    folder = root / "tiny" / "tiny_niah" / "snapkv" / "64L"
    assert (folder / "config.yaml").exists()
    meta = json.loads((folder / "run_meta.json").read_text())
    for key in ("git_commit", "torch_version", "transformers_version", "kvbench_version", "device", "start_time"):
        assert key in meta
    assert meta["end_time"] is not None
    datasets = sorted(p.name for p in folder.iterdir() if p.is_dir())
    assert datasets == ["niah_multikey_1k", "niah_multivalue_1k", "niah_single_1k"]
    for name in datasets:
        rows = [json.loads(line) for line in (folder / name / "predictions.jsonl").read_text().splitlines()]
        assert len(rows) == 2
        for row in rows:
            cache = row["cache"]
            assert cache["requested_per_layer"] == cache["achieved_per_layer"] == [64] * TINY_LAYERS
            # SnapKV's reference repeats KV per query head: one stored head per query head.
            assert all(heads == [64] * TINY_CONFIG["num_attention_heads"] for heads in cache["achieved_per_head"])
        metrics = json.loads((folder / name / "metrics.json").read_text())
        assert metrics["n_samples"] == 2 and metrics["cache"]["budget_exact"] is True
        assert metrics["scoring_errors"] == {"count": 0, "by_sample": {}}  # a scorer that raised would be counted
    assert "average" in result.stdout and "niah_single_1k" in result.stdout
    # summary.json: each dataset's score (as in metrics.json) inside its bootstrap interval, the average, provenance.
    summary = json.loads((folder / "summary.json").read_text())
    for row in summary["datasets"]:
        metrics = json.loads((folder / row["dataset"] / "metrics.json").read_text())
        low, high = row["ci95"]
        assert row["score"] == metrics["score"] and low <= row["score"] <= high
        assert row["n_samples"] == 2 and row["kept_fraction"] == metrics["cache"]["mean_kept_fraction"]
        assert f"[{low:.2f}, {high:.2f}]" in result.stdout  # the console table shows the interval
    mean = sum(row["score"] for row in summary["datasets"]) / 3
    assert summary["averages"]["mean"]["score"] == pytest.approx(mean)
    assert summary["run"]["git_commit"] == meta["git_commit"] and summary["run"]["status"] == "complete"
    assert summary["timing"]["n"] == 6 and summary["bootstrap"]["resamples"] == 1000
    # A second identical run does nothing new (idempotent), reports cached datasets and the same summary.
    again = run_cli(*DEFAULT_STYLE, f"run.output_root={root}")
    assert again.returncode == 0 and "(cached)" in again.stdout
    resummarised = json.loads((folder / "summary.json").read_text())
    assert [{**row, "cached": False} for row in resummarised["datasets"]] == summary["datasets"]
    assert resummarised["averages"] == summary["averages"]


def test_killed_run_resumes_to_the_same_predictions(tmp_path: Path, clean_resume_run: Path) -> None:
    """SIGKILL a run mid-dataset, start it again: predictions.jsonl equals an uninterrupted run's
    (tests/run/conftest.py's, shared with the SIGTERM test of test_sweep.py), byte for byte."""
    args = RESUME_ARGS
    clean_root, killed_root = clean_resume_run, tmp_path / "killed"
    relative = RESUME_FOLDER / "niah_single_1k" / "predictions.jsonl"
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "run.py", *args, f"run.output_root={killed_root}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    target = killed_root / relative
    deadline = time.time() + 240
    while time.time() < deadline:
        if target.exists() and len(target.read_bytes().splitlines()) >= 3:
            break
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    partial = target.read_bytes().splitlines()
    assert 3 <= len(partial) < 24, "the run should have been killed mid-dataset"
    assert not (target.parent / "metrics.json").exists()
    assert run_cli(*args, f"run.output_root={killed_root}").returncode == 0
    assert target.read_bytes() == (clean_root / relative).read_bytes()
    clean_metrics = json.loads((clean_root / relative.parent / "metrics.json").read_text())
    resumed_metrics = json.loads((target.parent / "metrics.json").read_text())
    assert clean_metrics["score"] == resumed_metrics["score"]


def test_torn_last_line_is_repaired(tmp_path: Path) -> None:
    from kvbench.storage.writers import PredictionLog

    log = PredictionLog(tmp_path / "p.jsonl")
    log.append({"id": "a", "prediction": "x"})
    with open(log.path, "a") as handle:
        handle.write('{"id": "b", "predic')
    assert [row["id"] for row in log.load()] == ["a"]
    log.append({"id": "b", "prediction": "y"})
    assert [row["id"] for row in log.load()] == ["a", "b"]


def test_changed_config_takes_a_folder_of_its_own_without_touching_results(
    default_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    """The default-style run's folder (:func:`default_run`), asked for again with another ``method.window``: the new
    config runs into the variant folder ``64L@<hash>`` beside it (with a note naming the difference), the first run's
    files untouched; with a ``run.tag`` the changed config runs into a folder of that name."""
    root, first = default_run
    assert first.returncode == 0, first.stderr[-3000:]
    folder = root / "tiny" / "tiny_niah" / "snapkv" / "64L"
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    one_sample = [*FAST, "task.num_samples=1", "task.datasets=[niah_single_1k]", f"run.output_root={root}"]
    variant = run_cli(*one_sample, "method.window=8")  # one sample is enough for a folder of its own
    assert variant.returncode == 0, variant.stderr[-3000:]
    assert "holds a run with other settings" in variant.stderr and "method.window: 32 -> 8" in variant.stderr
    assert [p.name for p in folder.parent.glob("64L@*/niah_single_1k/metrics.json")] == ["metrics.json"]
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before
    tagged = run_cli(*one_sample, "method.window=8", "run.tag=w8")
    assert tagged.returncode == 0, tagged.stderr[-3000:]
    assert (root / "tiny" / "tiny_niah" / "snapkv" / "64L~w8" / "niah_single_1k" / "metrics.json").exists()
