"""Bad input fails fast, clean and without a trace in results/ (README "Bad input").

Every case asserts the exit status (2), that the message names the bad value (and the valid choices or the fix),
that there is no traceback, and that the results tree is byte-for-byte what it was (a hash of every path, mode and
content under it, which already holds a finished run).  Most cases run in-process exactly as ``run.py`` runs a job
(:func:`kvbench.cli.run_job`, Hydra's errors through :func:`kvbench.cli.reporting_hydra_errors`); a few run
``run.py`` itself, to check the wiring and that the cheap checks fail before torch is imported.

Cost: about 15 s on 2 cores (8 subprocesses that stop before torch, ~1 s each; the in-process cases need no model
weights except the three runs of the tiny model at the end).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from kvbench.cli import reporting_hydra_errors, run_job
from kvbench.config import register_configs

REPO = Path(__file__).resolve().parent.parent
CONF = REPO / "conf"
FIXTURES = REPO / "tasks" / "longbench" / "fixtures"
#: A run of the default configuration that already finished (what must never change).
EXISTING = Path("tiny") / "tiny_niah" / "snapkv" / "64L"
#: LongBench on one dataset with a builtin model: data errors surface without loading any weights.
LONGBENCH = ["model=tiny-random-llama", "task=longbench", "task.datasets=[qasper]"]


def tree_hash(root: Path) -> str:
    """Hash of every path under ``root`` with its mode and (for files) its bytes."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        digest.update(f"{path.relative_to(root)} {path.stat().st_mode:o}\n".encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A results root that holds a finished run in the default configuration's folder."""
    folder = tmp_path / "runs" / EXISTING
    (folder / "niah_single_2k").mkdir(parents=True)
    (folder / "config.yaml").write_text("seed: 0\n")
    (folder / "run_meta.json").write_text(json.dumps({"config_hash": "0123456789abcdef", "status": "complete"}))
    (folder / "niah_single_2k" / "predictions.jsonl").write_text('{"id": "a", "prediction": "x"}\n')
    (folder / "niah_single_2k" / "metrics.json").write_text('{"score": 100.0}\n')
    return tmp_path / "runs"


def run_in_process(overrides: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Compose and run ``overrides`` as run.py does; the exit status and what went to stderr."""
    register_configs()
    capsys.readouterr()
    with (
        initialize_config_dir(config_dir=str(CONF), version_base="1.3"),
        pytest.raises(SystemExit) as exited,
        reporting_hydra_errors(overrides),
    ):
        run_job(compose("config", overrides=overrides))
    return int(exited.value.code), capsys.readouterr().err


def assert_clean_failure(code: int, stderr: str, expected: list[str]) -> None:
    assert code == 2, stderr[-2000:]
    for fragment in expected:
        assert fragment in stderr, (fragment, stderr[-2000:])
    assert "Traceback" not in stderr
    assert stderr.startswith("error: ") and stderr.count("\n") == 1, "one paragraph"


CONFIG_CASES = [
    # unknown presets (Hydra) and misspelt keys, with or without '+'
    (["method=nonexistent"], ["unknown method 'nonexistent'", "snapkv", "streamingllm", "full"]),
    (["model=nope"], ["unknown model 'nope'", "llama3.1-8b-instruct", "tiny"]),
    (["task=nope"], ["unknown task 'nope'", "tiny_niah", "longbench"]),
    (["budget=12x"], ["unknown budget '12x'", "128L", "2048L", "full"]),
    (["+experiment=cake_t0"], ["unknown experiment 'cake_t0'", "cake_t1"]),
    (["method.windw=3"], ["method.windw is not a kvbench setting", "Did you mean method.window?"]),
    (["+method.windw=8"], ["method.windw is not a kvbench setting", "Did you mean method.window?", "without '+'"]),
    (["+task.lenghts=[1024]"], ["task.lenghts is not a kvbench setting", "task.lengths"]),
    (["+foo=1"], ["foo is not a kvbench setting", "model, method, budget, task"]),
    (["method.window=abc"], ["method.window='abc'", "Integer"]),
    (["task.lengths=[1"], ["cannot parse the override 'task.lengths=[1'", "key=value"]),
    # budgets: bad form, zero, negative, more than the context
    (["budget.spec=12x"], ["'12x'", "accepted forms", "<n>L"]),
    (["budget.spec=0L"], ["'0L' must be positive", "accepted forms"]),
    (["budget.spec=-5L"], ["'-5L'", "accepted forms"]),
    (["budget.spec=1.5x"], ["'1.5x'", "(0, 1]"]),
    # method knobs and family parameters
    (["method.window=0"], ["method.window=0", ">= 1"]),
    (["method.kernel_size=6"], ["method.kernel_size=6", "odd", "method.kernel_size=7"]),
    (["method.pooling=median"], ["method.pooling='median'", "max, avg"]),
    (["method.gqa_agg=median"], ["method.gqa_agg='median'", "mean, max, sum"]),
    (["method.gqa_reduce=never"], ["method.gqa_reduce='never'", "before_pool, after_pool, or null"]),
    (["method.pool_padding=none"], ["method.pool_padding='none'", "include, exclude"]),
    (["+method.params.nope=1"], ["nope", "valid keys"]),
    (["method=cake", "method.params.allocation=fair"], ["allocation='fair'", "p2a"]),
    (["method.family=snapkvv"], ["snapkvv", "valid families", "pyramidkv"]),
    # task values
    (["task.question_mode=both"], ["task.question_mode='both'", "aware, agnostic"]),
    (["task.num_samples=0"], ["task.num_samples=0", ">= 1"]),
    (["task.kind=nope"], ["task.kind='nope'", "tiny_niah"]),
    (["run.tag=a/b"], ["run.tag='a/b'", "folder name"]),
    (["model.dtype=fp8"], ["model.dtype='fp8'", "bfloat16, float16, float32"]),
    (["wandb.mode=maybe"], ["wandb.mode='maybe'", "online, offline, disabled"]),
    # the model
    (["model.path=/nonexistent"], ["model.path='/nonexistent': no such folder", "hub id", "builtin:"]),
    (["model.path=models/missing"], ["model.path='models/missing': no such folder"]),
    (["model.path=builtin:tiny-random-gpt"], ["tiny-random-gpt", "builtin:tiny-random-llama"]),
    (["model=llama3.1-8b-instruct"], ["meta-llama/Llama-3.1-8B-Instruct", "hf download", "model.path="]),
    # data that cannot be found, or a task that cannot be built
    ([*LONGBENCH, "task.data_dir=/nonexistent"], ["task.data_dir='/nonexistent' does not exist", "fixtures"]),
    ([*LONGBENCH, "task.data_dir=fixtures", "task.datasets=[qasperr]"], ["qasperr", "valid datasets", "qasper"]),
    (["task.lengths=[128]", "run.tag=short"], ["128 tokens is too short for niah_multikey", "use a length >="]),
]


@pytest.mark.parametrize(("overrides", "expected"), CONFIG_CASES, ids=lambda case: " ".join(case))
def test_bad_config_fails_clean(root: Path, capsys, monkeypatch, overrides: list[str], expected: list[str]) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    before = tree_hash(root)
    code, stderr = run_in_process([*overrides, f"run.output_root={root}"], capsys)
    assert_clean_failure(code, stderr, expected)
    assert tree_hash(root) == before


def longbench_dir(tmp_path: Path, qasper_lines: list[str] | None) -> Path:
    """A LongBench data folder with the shipped hotpotqa fixture and a ``qasper.jsonl`` of the given lines
    (``None``: no qasper file at all)."""
    folder = tmp_path / "longbench_data"
    folder.mkdir()
    (folder / "hotpotqa.jsonl").write_bytes((FIXTURES / "hotpotqa.jsonl").read_bytes())
    if qasper_lines is not None:
        (folder / "qasper.jsonl").write_text("".join(line + "\n" for line in qasper_lines))
    return folder


GOOD_LINE = (FIXTURES / "qasper.jsonl").read_text().splitlines()[0]


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ([GOOD_LINE, '{"input": "q", "context": '], ["qasper.jsonl:2", "invalid JSON", "column"]),
        ([GOOD_LINE, json.dumps({"input": "q", "context": "c", "answers": []})], ["qasper.jsonl:2", "'answers'"]),
        (None, ["qasper.jsonl not found", "prepare_data.py"]),
        ([], ["dataset 'qasper' has no samples"]),
    ],
    ids=["corrupt line", "invalid line", "missing file", "empty file"],
)
def test_bad_data_fails_before_the_model_loads_and_writes_nothing(
    root: Path, tmp_path: Path, capsys, monkeypatch, lines: list[str] | None, expected: list[str]
) -> None:
    """Every line of every selected dataset is checked (the bad line comes after a good one and in the second
    dataset), before the model's weights load."""
    import kvbench.runner

    def no_weights(*args, **kwargs):
        raise AssertionError("the model's weights were loaded before the data was checked")

    monkeypatch.setattr(kvbench.runner, "load_model", no_weights)
    data_dir = longbench_dir(tmp_path, lines)
    before = tree_hash(root)
    overrides = [*LONGBENCH, "task.datasets=[hotpotqa,qasper]", f"task.data_dir={data_dir}", f"run.output_root={root}"]
    code, stderr = run_in_process(overrides, capsys)
    assert_clean_failure(code, stderr, expected)
    assert tree_hash(root) == before


def test_empty_context_is_refused() -> None:
    from kvbench.errors import KVBenchError
    from kvbench.tasks.base import Sample
    from kvbench.validation import check_samples

    good = Sample(id="a", context="some text", question="q?", answers=["x"])
    check_samples("ds", [good], "here")
    with pytest.raises(KVBenchError, match=r"dataset 'ds', sample 'b' \(#1\): the context string is empty"):
        check_samples("ds", [good, Sample(id="b", context=" \n", question="q?", answers=["x"])], "here")
    with pytest.raises(KVBenchError, match="two samples with id 'a'"):
        check_samples("ds", [good, good], "here")


def test_local_model_folder_must_hold_a_model(root: Path, tmp_path: Path, capsys) -> None:
    (tmp_path / "not_a_model").mkdir()
    before = tree_hash(root)
    code, stderr = run_in_process([f"model.path={tmp_path / 'not_a_model'}", f"run.output_root={root}"], capsys)
    assert_clean_failure(code, stderr, ["not_a_model", "no config.json"])
    assert tree_hash(root) == before


def test_missing_optional_package_then_the_suggested_command_runs(root: Path, capsys, monkeypatch) -> None:
    """The issue's headline: LongBench without `datasets` fails cleanly, and the fix it names then runs."""
    import kvbench.validation

    monkeypatch.setattr(kvbench.validation, "package_available", lambda name: name != "datasets")
    # hotpotqa: 32 new tokens at most, the fewest in LongBench (the run stays short).
    command = ["method=cake", "budget=128L", "task=longbench", "task.datasets=[hotpotqa]", f"run.output_root={root}"]
    before = tree_hash(root)
    code, stderr = run_in_process(command, capsys)
    assert_clean_failure(code, stderr, ["'datasets'", "pip install kvbench[data]", "task.data_dir=fixtures"])
    assert tree_hash(root) == before
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        run_job(compose("config", overrides=[*command, "task.data_dir=fixtures", "task.num_samples=1"]))
    assert (root / "tiny" / "longbench" / "cake" / "128L" / "hotpotqa" / "metrics.json").exists()


def test_debug_shows_the_traceback(capsys, monkeypatch, root: Path) -> None:
    monkeypatch.setenv("KVBENCH_DEBUG", "1")
    code, stderr = run_in_process(["method.window=0", f"run.output_root={root}"], capsys)
    assert code == 2 and "Traceback" in stderr and "error: method.window=0" in stderr


# ---------------------------------------------------------------------------------------------------- run.py
def run_py(*args: str, importtime: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("KVBENCH_DEBUG", None)
    flags = ["-X", "importtime"] if importtime else []
    return subprocess.run(
        [sys.executable, *flags, "run.py", *args], cwd=REPO, capture_output=True, text=True, timeout=120, env=env
    )


def imported(stderr: str, module: str) -> bool:
    """Whether ``python -X importtime`` output shows ``module`` being imported."""
    lines = [line for line in stderr.splitlines() if line.startswith("import time:")]
    return any(line.split("|")[-1].strip() == module for line in lines)


def message(stderr: str) -> str:
    """stderr without the ``-X importtime`` lines."""
    return "".join(line + "\n" for line in stderr.splitlines() if not line.startswith("import time:"))


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["method=nonexistent"], ["unknown method 'nonexistent'", "snapkv"]),
        (["method.windw=3"], ["method.windw is not a kvbench setting"]),
        (["+method.windw=8"], ["method.windw is not a kvbench setting"]),
        (["method.window=abc"], ["method.window='abc'"]),
        (["task.lengths=[1"], ["cannot parse the override 'task.lengths=[1'"]),
        (["budget.spec=0L"], ["'0L' must be positive"]),
        (["method.kernel_size=6"], ["method.kernel_size=6"]),
        (["model.path=models/missing"], ["no such folder"]),
    ],
)
def test_run_py_fails_with_status_2_before_importing_torch(root: Path, args: list[str], expected: list[str]) -> None:
    before = tree_hash(root)
    result = run_py(*args, f"run.output_root={root}")
    assert_clean_failure(result.returncode, message(result.stderr), expected)
    assert not imported(result.stderr, "torch"), "a cheap check ran after torch was imported"
    assert result.stdout == ""
    assert tree_hash(root) == before


# ---------------------------------------------------------------------------------------------------- folders
def tiny_cfg(root: Path, *overrides: str):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(
            "config",
            overrides=[
                "task.lengths=[1024]",
                "task.num_samples=1",
                "task.datasets=[niah_single_1k]",
                f"run.output_root={root}",
                "run.progress=false",
                "run.print_table=false",
                *overrides,
            ],
        )


def test_run_failing_before_its_first_prediction_leaves_no_folder(root: Path, monkeypatch, capsys) -> None:
    """A failure after the folder was claimed (here: generation raising) removes what the run wrote, so the next
    command -- with another config for the same folder -- runs instead of being refused."""
    import kvbench.runner
    from kvbench.runner import Runner

    real_generate = kvbench.runner.generate

    def broken_generate(*args, **kwargs):
        raise RuntimeError("out of memory (simulated)")

    before = tree_hash(root)
    monkeypatch.setattr(kvbench.runner, "generate", broken_generate)
    with pytest.raises(RuntimeError, match="simulated"):
        Runner(tiny_cfg(root, "method=streamingllm")).run()
    assert tree_hash(root) == before
    assert not (root / "tiny" / "tiny_niah" / "streamingllm").exists()
    monkeypatch.setattr(kvbench.runner, "generate", real_generate)
    Runner(tiny_cfg(root, "method=streamingllm", "method.window=8")).run()
    assert (root / "tiny" / "tiny_niah" / "streamingllm" / "64L" / "niah_single_1k" / "metrics.json").exists()


def test_folder_of_a_killed_run_without_predictions_is_replaced_with_a_note(root: Path, capsys) -> None:
    """What a run killed before its first prediction leaves (config, meta, an empty log) does not block a run
    with another config; the sweep planner counts that job as new."""
    from kvbench.runner import Runner, config_hash
    from kvbench.sweep import Job, classify

    folder = root / "tiny" / "tiny_niah" / "h2o" / "64L"
    (folder / "niah_single_1k").mkdir(parents=True)
    (folder / "config.yaml").write_text("stale: true\n")
    (folder / "run_meta.json").write_text(json.dumps({"config_hash": "ffffffffffffffff", "status": "running"}))
    (folder / "niah_single_1k" / "predictions.jsonl").write_text("")
    cfg = tiny_cfg(root, "method=h2o")
    job = Job([])
    classify(job, cfg)
    assert job.state == "new"
    capsys.readouterr()
    Runner(cfg).run()
    assert capsys.readouterr().err.count("stopped before writing any prediction; this run replaces it") == 1
    meta = json.loads((folder / "run_meta.json").read_text())
    assert meta["config_hash"] == config_hash(cfg) and meta["status"] == "complete"


# ---------------------------------------------------------------------------------------------------- lock
def test_lock_falls_back_to_an_exclusive_file_where_flock_is_unsupported(tmp_path: Path, monkeypatch) -> None:
    import fcntl

    from kvbench.errors import KVBenchError
    from kvbench.run_folder import EXCL_LOCK_FILE, run_folder_lock

    def no_flock(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    folder = tmp_path / "run"
    with run_folder_lock(folder, wait_s=0) as path:
        assert path.name == EXCL_LOCK_FILE and f"pid {os.getpid()}" in path.read_text()
    assert not (folder / EXCL_LOCK_FILE).exists(), "released on exit"

    # A live holder on this host (pid 1 never ends) blocks, named with the file to remove if it is gone.
    (folder / EXCL_LOCK_FILE).write_text(f"pid 1 on {os.uname().nodename}, since 2025-01-01T00:00:00+00:00\n")
    busy = r"in use by another kvbench process \(pid 1 on .*remove .*excl"
    with pytest.raises(KVBenchError, match=busy), run_folder_lock(folder, wait_s=0):
        pass
    # A holder that has ended (a pid that does not exist) is replaced.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (folder / EXCL_LOCK_FILE).write_text(f"pid {dead.stdout.strip()} on {os.uname().nodename}, since x\n")
    with run_folder_lock(folder, wait_s=0) as path:
        assert f"pid {os.getpid()}" in path.read_text()


def test_busy_lock_names_its_holder_even_before_it_wrote_itself(tmp_path: Path, monkeypatch) -> None:
    from kvbench.errors import KVBenchError
    from kvbench.run_folder import LOCK_FILE, run_folder_lock

    folder = tmp_path / "run"
    script = (
        "import sys, time; from pathlib import Path; from kvbench.run_folder import run_folder_lock\n"
        "with run_folder_lock(Path(sys.argv[1])):\n    print('locked', flush=True); time.sleep(60)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", script, str(folder)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(KVBenchError, match=rf"\(pid {holder.pid} on "), run_folder_lock(folder, wait_s=0):
            pass
        (folder / LOCK_FILE).write_text("")  # as if the holder had locked but not yet written its line
        unwritten = "has just started and not yet recorded its pid"
        with pytest.raises(KVBenchError, match=unwritten), run_folder_lock(folder, wait_s=0):
            pass
    finally:
        holder.kill()
        holder.wait()


# ---------------------------------------------------------------------------------------------------- files
@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_result_files_get_the_same_mode_under_the_umask(tmp_path: Path, umask: int) -> None:
    from kvbench.results import PredictionLog, atomic_write_json

    previous = os.umask(umask)
    try:
        atomic_write_json(tmp_path / "metrics.json", {"score": 1.0})
        PredictionLog(tmp_path / "predictions.jsonl").append({"id": "a"})
    finally:
        os.umask(previous)
    modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
    assert modes == {"metrics.json": 0o666 & ~umask, "predictions.jsonl": 0o666 & ~umask}


def test_torch_free_dtype_names_agree_with_the_loader() -> None:
    from kvbench import config
    from kvbench.models import DTYPES

    assert tuple(DTYPES) == config.DTYPE_NAMES


def test_method_families_build_without_importing_transformers() -> None:
    """A bad family or family parameter is reported once the method modules load (torch), before transformers
    (the runner's import), so it comes in about a second and a half, not five (README, bad input)."""
    code = (
        "import sys\n"
        "from kvbench.methods.base import method_families\n"
        "assert 'snapkv' in method_families() and 'cake' in method_families()\n"
        "print(sorted(m for m in sys.modules if m == 'transformers' or m.startswith('transformers.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"
