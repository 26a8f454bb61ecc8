"""Many jobs, one results tree: concurrent runs never clobber or interleave each other's files, and two processes
for the same run folder are serialised by its lock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kvbench.models.tiny import DEFAULT_MODEL_DIR

REPO = Path(__file__).resolve().parents[2]
FAST = ["model=tiny", "task=tiny_niah", "task.lengths=[1024]", "run.progress=false"]
#: Layers of the embedded default model (models/tiny-niah), which the per-layer cache records list.
TINY_LAYERS = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())["num_hidden_layers"]
ENV = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
DATASETS = ["niah_multikey_1k", "niah_multivalue_1k", "niah_single_1k"]
# Four different jobs: methods x budgets.
JOBS = [("streamingllm", "64L"), ("snapkv", "64L"), ("streamingllm", "128L"), ("snapkv", "128L")]


def start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "run.py", *args],
        cwd=REPO,
        env=env or ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def check_complete_run(folder: Path, method: str, budget: str, n_samples: int) -> None:
    """Every file of the run parses, belongs to this run, and is complete; no temporary files remain."""
    config = yaml.safe_load((folder / "config.yaml").read_text())
    assert config["method"]["name"] == method and config["budget"]["name"] == budget
    meta = json.loads((folder / "run_meta.json").read_text())
    assert meta["method"] == method and meta["budget"] == budget
    assert meta["status"] == "complete" and sorted(meta["datasets"]) == DATASETS
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == DATASETS
    assert not [p for p in folder.rglob("*.tmp")], "a temporary file was left behind"
    for name in DATASETS:
        raw = (folder / name / "predictions.jsonl").read_bytes()
        assert raw.endswith(b"\n")
        rows = [json.loads(line) for line in raw.splitlines()]
        assert len(rows) == n_samples and len({r["id"] for r in rows}) == n_samples
        budget_tokens = int(budget.rstrip("L"))
        assert all(r["cache"]["requested_per_layer"] == [budget_tokens] * TINY_LAYERS for r in rows)
        metrics = json.loads((folder / name / "metrics.json").read_text())
        assert (metrics["method"], metrics["budget"], metrics["dataset"]) == (method, budget, name)
        assert metrics["n_samples"] == n_samples and metrics["config_hash"] == meta["config_hash"]
        timings = [json.loads(line) for line in (folder / name / "timings.jsonl").read_text().splitlines()]
        assert sorted(t["id"] for t in timings) == sorted(r["id"] for r in rows)


@pytest.mark.slow
def test_concurrent_runs_of_different_jobs_into_one_tree(
    tmp_path: Path, default_run: tuple[Path, subprocess.CompletedProcess[str]]
) -> None:
    root = tmp_path / "runs"
    n_samples = 2  # as the default-style run (tests/run/conftest.py) the snapkv 64L job is compared with
    processes = [
        start(
            [*FAST, f"method={method}", f"budget={budget}", f"task.num_samples={n_samples}", f"run.output_root={root}"]
        )
        for method, budget in JOBS
    ]
    for process in processes:
        _, stderr = process.communicate(timeout=900)
        assert process.returncode == 0, stderr[-3000:]
    runs = sorted(p.parent for p in root.rglob("run_meta.json"))
    assert len(runs) == len(JOBS)
    for method, budget in JOBS:
        check_complete_run(root / "tiny" / "tiny_niah" / method / budget, method, budget, n_samples)

    # Same results as a run on its own (nothing leaked between the concurrent jobs): the session's default-style run
    # is that configuration (snapkv 64L, 2 samples) run alone.
    alone, single = default_run
    assert single.returncode == 0, single.stderr[-2000:]
    method, budget = JOBS[1]
    for dataset in DATASETS:
        relative = Path("tiny/tiny_niah") / method / budget / dataset / "predictions.jsonl"
        assert (root / relative).read_bytes() == (alone / relative).read_bytes()


def test_second_process_on_the_same_run_folder_fails_clearly_and_writes_nothing(tmp_path: Path) -> None:
    from kvbench.storage.folder import run_folder_lock

    root = tmp_path / "runs"
    folder = root / "tiny" / "tiny_niah" / "snapkv" / "64L"
    args = [*FAST, "task.num_samples=1", "task.datasets=[niah_single_1k]", f"run.output_root={root}"]
    with run_folder_lock(folder):
        held = folder / ".kvbench.lock"
        assert f"pid {os.getpid()}" in held.read_text()
        blocked = subprocess.run(
            [sys.executable, "run.py", *args], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600
        )
    assert blocked.returncode == 2
    assert "is in use by another kvbench process" in blocked.stderr and f"pid {os.getpid()}" in blocked.stderr
    assert "Traceback" not in blocked.stderr
    assert sorted(p.name for p in folder.iterdir()) == [".kvbench.lock"], "the blocked run wrote results"


@pytest.mark.slow
def test_second_process_waits_for_the_lock_when_asked(tmp_path: Path) -> None:
    from kvbench.storage.folder import run_folder_lock

    root = tmp_path / "runs"
    folder = root / "tiny" / "tiny_niah" / "snapkv" / "64L"
    args = [*FAST, "task.num_samples=1", "task.datasets=[niah_single_1k]", f"run.output_root={root}"]
    samples = tmp_path / "samples"  # run.sample_cache=auto: <run.output_root>/../samples
    with run_folder_lock(folder):
        process = start(args, env={**ENV, "KVBENCH_LOCK_WAIT": "300"})
        # The run stores its generated samples, then claims its folder (Runner.run: the data is loaded and checked
        # before the folder's lock is taken): once the samples are on disk it is at the lock, retrying it every
        # second at most; a few retries later it must still be waiting.
        deadline = time.time() + 300
        while time.time() < deadline and process.poll() is None and not list(samples.rglob("*.jsonl")):
            time.sleep(0.05)
        assert list(samples.rglob("*.jsonl")), "the second run stored no samples (did it reach its folder's lock?)"
        time.sleep(3)
        assert process.poll() is None, "the second run should be waiting for the lock"
        assert not (folder / "run_meta.json").exists()
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr[-2000:]
    assert json.loads((folder / "run_meta.json").read_text())["status"] == "complete"
