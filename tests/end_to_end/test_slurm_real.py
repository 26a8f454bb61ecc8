"""Sweeps on a real SLURM: a single-node cluster (slurmctld + slurmd + munge) on localhost, started by
slurm/ci/cluster.sh (which apt-installs Debian's slurm-wlm and munge when missing; needs root).

Skipped unless KVBENCH_SLURM_TEST=1 (``make test-slurm`` sets it).  Checks:

* an array of embedded-default jobs submitted with ``scripts/slurm_sweep.py --submit`` (slurm/array.sbatch) completes,
  every job's results folder is whole, W&B logged offline, and resubmission is idempotent;
* a job requeued mid-dataset (preemption: ``scontrol requeue``) and a job warned of its time limit (the
  ``--signal=B:USR1`` warning, sent with ``scancel --signal=USR1 --batch``; the script requeues itself) both resume
  and end with predictions byte-identical to an uninterrupted job's;
* ``python run.py -m hydra/launcher=slurm`` submits one array through hydra-submitit-launcher.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "slurm" / "ci" / "cluster.sh"

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(
        os.environ.get("KVBENCH_SLURM_TEST") != "1",
        reason="real SLURM test: set KVBENCH_SLURM_TEST=1 (make test-slurm)",
    ),
]

# The embedded default (model=tiny task=tiny_niah), shortened.
DEFAULT = ["model=tiny", "task=tiny_niah", "task.lengths=[1024]", "run.progress=false"]
DATASETS = ["niah_multikey_1k", "niah_multivalue_1k", "niah_single_1k"]
SBATCH = ["--cpus-per-task=1", "--time=00:10:00"]


@pytest.fixture(scope="module")
def slurm_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Install (if needed) and start the one-node cluster; yield the environment its clients need."""
    state = tmp_path_factory.mktemp("slurm")
    env = {
        **os.environ,
        "KVBENCH_SLURM_DIR": str(state),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "offline",
        # Only ever this test cluster, never a cluster configured on the machine.
        "SLURM_CONF": str(state / "slurm.conf"),
    }
    install = subprocess.run([str(CLUSTER), "install"], env=env, capture_output=True, text=True, timeout=900)
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-2000:]
    started = False
    try:
        start = subprocess.run([str(CLUSTER), "start"], env=env, capture_output=True, text=True, timeout=120)
        assert start.returncode == 0, start.stdout[-2000:] + start.stderr[-2000:]
        started = True
        yield env
    finally:
        if started:
            subprocess.run(["scancel", "--user", os.environ.get("USER", "root")], env=env, capture_output=True)
        subprocess.run([str(CLUSTER), "stop"], env=env, capture_output=True, text=True, timeout=120)


def squeue(env: dict[str, str], job: str) -> dict[str, str]:
    """``{task id: state}`` of an array job's tasks still known to squeue."""
    out = subprocess.run(
        ["squeue", "-h", "-r", "-j", job, "-o", "%i %T"], env=env, capture_output=True, text=True, check=False
    ).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def wait_until_done(env: dict[str, str], job: str, timeout: float = 900) -> None:
    deadline = time.time() + timeout
    while squeue(env, job):
        assert time.time() < deadline, f"array {job} still queued: {squeue(env, job)}"
        time.sleep(2)


def wait_for_rows(path: Path, n: int, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not (path.exists() and len(path.read_bytes().splitlines()) >= n):
        assert time.time() < deadline, f"{path} never reached {n} rows"
        time.sleep(0.2)


def release_when_requeued(env: dict[str, str], task: str, timeout: float = 180) -> None:
    """A requeued job waits (BeginTime) before it may start again; let it start now."""
    deadline = time.time() + timeout
    while squeue(env, task.split("_")[0]).get(task) != "PENDING":
        assert time.time() < deadline, f"{task} was not requeued: {squeue(env, task.split('_')[0])}"
        time.sleep(0.5)
    subprocess.run(["scontrol", "update", f"jobid={task}", "StartTime=now"], env=env, check=True)


def submit_sweep(env: dict[str, str], tmp: Path, name: str, overrides: list[str]) -> tuple[str, Path]:
    """``scripts/slurm_sweep.py --submit``; returns the array job id and the manifest."""
    manifest = tmp / f"{name}.txt"
    (tmp / "logs").mkdir(exist_ok=True)
    result = subprocess.run(
        [
            sys.executable,
            "scripts/slurm_sweep.py",
            "--name",
            name,
            *overrides,
            "-o",
            str(manifest),
            "--submit",
            "--",
            *SBATCH,
            f"--output={tmp}/logs/%x-%A_%a.out",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip(), manifest


def job_log(tmp: Path, job: str, task: int) -> str:
    return (tmp / "logs" / f"kvbench-{job}_{task}.out").read_text(errors="replace")


def test_array_of_default_jobs_completes_and_resubmission_is_idempotent(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    root = tmp_path / "runs"
    grid = [*DEFAULT, "task.num_samples=2", "method=snapkv,streamingllm", "budget=64L,128L", f"run.output_root={root}"]
    started = time.time()
    job, manifest = submit_sweep(slurm_env, tmp_path, "slurm_ci", grid)
    assert len(manifest.read_text().splitlines()) == 4
    wait_until_done(slurm_env, job)
    print(f"4-job array finished in {time.time() - started:.0f} s")

    for task, line in enumerate(manifest.read_text().splitlines()):
        overrides = dict(item.split("=", 1) for item in shlex.split(line))
        method, budget = overrides["method"], overrides["budget"]
        folder = root / "tiny" / "tiny_niah" / method / budget
        log = job_log(tmp_path, job, task)
        assert "[kvbench] exit status 0" in log, log[-3000:]
        meta = json.loads((folder / "run_meta.json").read_text())
        assert meta["status"] == "complete" and sorted(meta["datasets"]) == DATASETS
        assert meta["slurm_job"] == f"{job}_{task}"
        for name in DATASETS:
            rows = [json.loads(r) for r in (folder / name / "predictions.jsonl").read_text().splitlines()]
            assert len(rows) == 2 and len({r["id"] for r in rows}) == 2
            metrics = json.loads((folder / name / "metrics.json").read_text())
            assert (metrics["method"], metrics["budget"], metrics["n_samples"]) == (method, budget, 2)
            assert metrics["config_hash"] == meta["config_hash"]
        assert list((folder / "wandb").glob("offline-run-*")), "W&B did not log offline on the node"

    files = {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and "wandb" not in p.parts}
    # Regenerating the manifest finds nothing to do and submits nothing.
    again = subprocess.run(
        [sys.executable, "scripts/slurm_sweep.py", "--name", "slurm_ci", *grid, "--submit", "--", *SBATCH],
        cwd=REPO,
        env=slurm_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0 and "nothing to run" in again.stderr, again.stderr
    assert again.stdout.strip() == ""
    # Resubmitting the old manifest as it was: every task sees its run complete and exits without touching it.
    resubmit = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--array=0-3",
            *SBATCH,
            f"--output={tmp_path}/logs/%x-%A_%a.out",
            str(REPO / "slurm" / "array.sbatch"),
            str(manifest),
        ],
        cwd=REPO,
        env=slurm_env,
        capture_output=True,
        text=True,
        check=True,
    )
    second = resubmit.stdout.strip().split(";")[0]
    wait_until_done(slurm_env, second)
    for task in range(4):
        log = job_log(tmp_path, second, task)
        assert "already complete; nothing to do" in log and "[kvbench] exit status 0" in log, log[-2000:]
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and "wandb" not in p.parts} == files


def test_preempted_and_time_limited_jobs_resume_with_nothing_lost_or_duplicated(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    root = tmp_path / "runs"
    n = 40
    grid = [
        *DEFAULT,
        f"task.num_samples={n}",
        "task.datasets=[niah_single_1k]",
        "method=snapkv",
        "budget=64L",
        "run.tag=preempted,timelimit,clean",
        f"run.output_root={root}",
    ]
    job, _ = submit_sweep(slurm_env, tmp_path, "slurm_requeue", grid)
    base = root / "tiny" / "tiny_niah" / "snapkv"
    rows = {tag: base / f"64L~{tag}" / "niah_single_1k" / "predictions.jsonl" for tag in ("preempted", "timelimit")}

    wait_for_rows(rows["preempted"], 3)
    subprocess.run(["scontrol", "requeue", f"{job}_0"], env=slurm_env, check=True)  # as a preemption would
    wait_for_rows(rows["timelimit"], 3)
    # The time-limit warning (#SBATCH --signal=B:USR1@120), sent now: the script stops the runner and requeues.
    subprocess.run(["scancel", "--signal=USR1", "--batch", f"{job}_1"], env=slurm_env, check=True)
    release_when_requeued(slurm_env, f"{job}_0")
    release_when_requeued(slurm_env, f"{job}_1")
    wait_until_done(slurm_env, job)

    preempted_log, timelimit_log = job_log(tmp_path, job, 0), job_log(tmp_path, job, 1)
    assert "SIGTERM: stopping" in preempted_log and "(restart 1)" in preempted_log, preempted_log[-3000:]
    assert "time limit near" in timelimit_log and "[kvbench] requeued" in timelimit_log, timelimit_log[-3000:]
    assert "(restart 1)" in timelimit_log
    for log in (preempted_log, timelimit_log):
        # First attempt stopped cleanly mid-dataset (143), second attempt finished (0); nothing else ran.
        assert re.findall(r"\[kvbench\] exit status (\d+)", log) == ["143", "0"], log[-3000:]

    # Byte for byte but each row's config_hash (each tag is its own configuration: issue #55's row stamp).
    clean = re.sub(
        rb', "config_hash": "[0-9a-f]+"',
        b"",
        (base / "64L~clean" / "niah_single_1k" / "predictions.jsonl").read_bytes(),
    )
    assert len(clean.splitlines()) == n
    for tag, path in rows.items():
        unstamped = re.sub(rb', "config_hash": "[0-9a-f]+"', b"", path.read_bytes())
        assert unstamped == clean, f"{tag}: predictions differ from the uninterrupted job's"
        metrics = json.loads((path.parent / "metrics.json").read_text())
        assert metrics["n_samples"] == n
        meta = json.loads((path.parent.parent / "run_meta.json").read_text())
        assert meta["status"] == "complete"


def test_submitit_launcher_submits_one_array(slurm_env: dict[str, str], tmp_path: Path) -> None:
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    root = tmp_path / "runs"
    submitit = tmp_path / "submitit"
    result = subprocess.run(
        [
            sys.executable,
            "run.py",
            "-m",
            "hydra/launcher=slurm",
            *DEFAULT,
            "task.num_samples=2",
            "task.datasets=[niah_single_1k]",
            "method=snapkv,streamingllm",
            "budget=64L",
            f"run.output_root={root}",
            f"hydra.sweep.dir={tmp_path / 'hydra'}",
            f"hydra.launcher.submitit_folder={submitit}/%j",
            "hydra.launcher.gpus_per_node=0",
            "hydra.launcher.cpus_per_task=1",
            "hydra.launcher.mem_gb=1",
            "hydra.launcher.timeout_min=10",
        ],
        cwd=REPO,
        env=slurm_env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for method in ("snapkv", "streamingllm"):
        metrics = json.loads(
            (root / "tiny" / "tiny_niah" / method / "64L" / "niah_single_1k" / "metrics.json").read_text()
        )
        assert metrics["n_samples"] == 2
    tasks = sorted(p.name for p in submitit.iterdir() if re.fullmatch(r"\d+_\d+", p.name))
    assert len(tasks) == 2 and len({t.split("_")[0] for t in tasks}) == 1, f"not one array: {tasks}"
    assert not [p for p in root.rglob("*") if "submitit" in p.name], "submitit files inside results/"
