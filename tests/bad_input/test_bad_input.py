"""Bad input fails fast, clean and without a trace in results/ (README "Bad input").

Every case asserts the exit status (2), that the message names the bad value (and the valid choices or the fix),
that there is no traceback, and that the results tree is byte-for-byte what it was (a hash of every path, mode and
content under it, which already holds a finished run).  Most cases run in-process exactly as ``run.py`` runs a job
(:func:`kvbench.app.cli.run_job`, Hydra's errors through :func:`kvbench.app.cli.reporting_hydra_errors`); a few run
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
from omegaconf import OmegaConf

from kvbench.app.cli import reporting_hydra_errors, run_job
from kvbench.app.validation import validate_run
from kvbench.config import register_configs

REPO = Path(__file__).resolve().parents[2]
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
    (["method.windw=3"], ["method.windw is not a kvbench setting", "Did you mean method.params.window?"]),
    (
        ["+method.windw=8"],
        ["method.windw is not a kvbench setting", "Did you mean method.params.window?", "without '+'"],
    ),
    (["+task.lenghts=[1024]"], ["task.lenghts is not a kvbench setting", "task.lengths"]),
    (["+foo=1"], ["foo is not a kvbench setting", "model, method, budget, task"]),
    (["method.params.window=abc"], ["method.params.window='abc'", "an integer"]),
    (["task.lengths=[1"], ["cannot parse the override 'task.lengths=[1'", "key=value"]),
    # budgets: bad form, zero, negative, more than the context
    (["budget.spec=12x"], ["'12x'", "accepted forms", "<n>L"]),
    (["budget.spec=0L"], ["'0L' must be positive", "accepted forms"]),
    (["budget.spec=-5L"], ["'-5L'", "accepted forms"]),
    (["budget.spec=1.5x"], ["'1.5x'", "(0, 1]"]),
    # method knobs and family parameters
    (["method.params.window=0"], ["method.params.window=0", "[1, inf)"]),
    (["method.params.kernel_size=6"], ["method.params.kernel_size=6", "odd"]),
    (["method.params.pooling=median"], ["method.params.pooling='median'", "max, avg"]),
    (["++method.params.gqa_agg=median"], ["method.params.gqa_agg='median'", "mean, max, sum"]),
    (["method.params.gqa_reduce=never"], ["method.params.gqa_reduce='never'", "before_pool, after_pool"]),
    (["method.params.pool_padding=none"], ["method.params.pool_padding='none'", "include, exclude"]),
    # issue #41: a scorer knob is the family's field; one the method does not declare lists the method's own
    (["method.kernel_size=7"], ["method.kernel_size is not a kvbench setting", "Did you mean method.params.kernel_s"]),
    (["+method.params.nope=1"], ["method.params.nope is not a parameter", "are: kernel_size, pooling"]),
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
    # issue #29: values that used to pass validation, or be hidden by the existing run in the default folder
    (["run.prefill_chunk=-3"], ["run.prefill_chunk=-3", "integer >= 0", "null = automatic"]),
    (["run.decode_batch=0"], ["run.decode_batch=0", "integer >= 1", "auto"]),
    (["run.decode_batch=fast"], ["run.decode_batch='fast'", "integer >= 1", "auto"]),
    (["task.datasets=[nope]"], ["task.datasets=['nope']", "valid datasets: niah_single_2k", "niah_multivalue_2k"]),
    (["task.datasets=[niah_single_1k]"], ["['niah_single_1k']", "valid datasets: niah_single_2k"]),
    (["task.datasets=[]"], ["task.datasets=[] selects no dataset", "niah_single_2k", "null"]),
    (["task=ruler", "task.datasets=[niah_singel_1]"], ["niah_singel_1", "valid datasets", "niah_single_1"]),
    (["method=pyramidkv", "method.bta=3"], ["method.bta is not a kvbench", "method=pyramidkv", "beta, schedule"]),
    (["method=pyramidkv", "method.params.bta=3"], ["method.params.bta", "are: kernel_size, pooling", "beta?"]),
    (
        ["method=snapkv", "++method.params.decode_eviction=true"],
        ["decode_eviction=True is not used by the snapkv family"],
    ),
    (["budget=-5L"], ["unknown budget '-5L'", "128L", "budget=<spec>", "<n>/layer"]),
    (["budget=0L"], ["unknown budget '0L'", "'0L' must be positive", "budget=<spec>"]),
    (["budget=1.5x"], ["unknown budget '1.5x'", "(0, 1]", "budget=<spec>"]),
    (["method=dms", "budget=64L"], ["budget '64L' means nothing to method 'dms'", "'<t>thr'", "-3.0thr"]),
    (["run.threads=0"], ["run.threads=0", ">= 1"]),
    (["model.max_input_length=1"], ["model.max_input_length=1", ">= 2"]),
    (["task.depths=[150]"], ["task.depths contains 150", "[0, 100]"]),
    (["task.length=0"], ["task.length=0", ">= 1"]),
    (["++method.params.sink_tokens=-1"], ["method.params.sink_tokens=-1", "[0, inf)"]),
    (["method.params.score_dtype=half"], ["method.params.score_dtype='half'", "model, float32"]),
    (["method.params.gqa_granularity=layer"], ["method.params.gqa_granularity='layer'", "kv_head, query_head"]),
    (["run.tag=' x'"], ["run.tag=' x'", "folder name"]),
]


def no_weights(*args, **kwargs):
    raise AssertionError("the model's weights were loaded before the bad input was reported")


def test_a_threshold_budget_for_a_sized_method_fails_clean(root: Path, capsys, monkeypatch) -> None:
    """``budget=-3.0thr`` (registered as ``thr-3.0`` by the command line's override preparation) on KNorm."""
    import kvbench.run.runner
    from kvbench.app.overrides import prepare_overrides

    monkeypatch.setattr(kvbench.run.runner, "load_model", no_weights)
    overrides = prepare_overrides(["method=knorm", "budget=-3.0thr", f"run.output_root={root}"])
    code, stderr = run_in_process(overrides, capsys)
    assert_clean_failure(code, stderr, ["is a score threshold", "only threshold methods", "64L"])


@pytest.mark.parametrize(("overrides", "expected"), CONFIG_CASES, ids=lambda case: " ".join(case))
def test_bad_config_fails_clean(root: Path, capsys, monkeypatch, overrides: list[str], expected: list[str]) -> None:
    """Each bad value is reported (never hidden by the finished run of another config in the default folder),
    before the model's weights load, leaving results/ as it was."""
    import kvbench.run.runner

    monkeypatch.setattr(kvbench.run.runner, "load_model", no_weights)
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
        ([GOOD_LINE, '{"input": "q", "context": "a\tb"}'], ["qasper.jsonl:2", "invalid control character (a raw tab"]),
    ],
    ids=["corrupt line", "invalid line", "missing file", "empty file", "raw tab"],
)
def test_bad_data_fails_before_the_model_loads_and_writes_nothing(
    root: Path, tmp_path: Path, capsys, monkeypatch, lines: list[str] | None, expected: list[str]
) -> None:
    """Every line of every selected dataset is checked (the bad line comes after a good one and in the second
    dataset), before the model's weights load."""
    import kvbench.run.runner

    def no_weights(*args, **kwargs):
        raise AssertionError("the model's weights were loaded before the data was checked")

    monkeypatch.setattr(kvbench.run.runner, "load_model", no_weights)
    data_dir = longbench_dir(tmp_path, lines)
    before = tree_hash(root)
    overrides = [*LONGBENCH, "task.datasets=[hotpotqa,qasper]", f"task.data_dir={data_dir}", f"run.output_root={root}"]
    code, stderr = run_in_process(overrides, capsys)
    assert_clean_failure(code, stderr, expected)
    assert " at at " not in stderr
    assert tree_hash(root) == before


def test_empty_context_is_refused() -> None:
    from kvbench.errors import KVBenchError
    from kvbench.tasks.base import Sample, check_samples

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
    import kvbench.app.validation

    monkeypatch.setattr(kvbench.app.validation, "package_available", lambda name: name != "datasets")
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
    code, stderr = run_in_process(["method.params.window=0", f"run.output_root={root}"], capsys)
    assert code == 2 and "Traceback" in stderr and "error: method=snapkv: method.params.window=0" in stderr


# ---------------------------------------------------------------------------------------------------- run.py
def run_py(*args: str, importtime: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **(env or {})}
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
        (["method.params.window=abc"], ["method.params.window='abc'"]),
        (["task.lengths=[1"], ["cannot parse the override 'task.lengths=[1'"]),
        (["budget.spec=0L"], ["'0L' must be positive"]),
        (["method.kernel_size=6"], ["method.kernel_size is not a kvbench setting", "method.params.kernel_size"]),
        (["model.path=models/missing"], ["no such folder"]),
        (["run.prefill_chunk=-3"], ["run.prefill_chunk=-3", "integer >= 0"]),
        (["task.datasets=[nope]"], ["task.datasets=['nope']", "valid datasets"]),
        (["KVBENCH_LOCK_WAIT=abc"], ["KVBENCH_LOCK_WAIT='abc' is not a number of seconds", "KVBENCH_LOCK_WAIT=600"]),
    ],
)
def test_run_py_fails_with_status_2_before_importing_torch(root: Path, args: list[str], expected: list[str]) -> None:
    """Every setting, environment variable and dataset name is checked before torch is imported (issue #29)."""
    before = tree_hash(root)
    env = dict(arg.split("=", 1) for arg in args if arg.startswith("KVBENCH_"))
    args = [arg for arg in args if arg not in {f"{k}={v}" for k, v in env.items()}]
    result = run_py(*args, f"run.output_root={root}", env=env)
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
    import kvbench.run.generation
    from kvbench.run.runner import Runner

    real_generate = kvbench.run.generation.generate

    def broken_generate(*args, **kwargs):
        raise RuntimeError("out of memory (simulated)")

    before = tree_hash(root)
    monkeypatch.setattr(kvbench.run.generation, "generate", broken_generate)
    with pytest.raises(RuntimeError, match="simulated"):
        Runner(validate_run(tiny_cfg(root, "method=streamingllm"))).run()
    assert tree_hash(root) == before
    assert not (root / "tiny" / "tiny_niah" / "streamingllm").exists()
    monkeypatch.setattr(kvbench.run.generation, "generate", real_generate)
    Runner(validate_run(tiny_cfg(root, "method=streamingllm", "method.params.window=8"))).run()
    assert (root / "tiny" / "tiny_niah" / "streamingllm" / "64L" / "niah_single_1k" / "metrics.json").exists()


def test_folder_of_a_killed_run_without_predictions_is_replaced_with_a_note(root: Path, capsys) -> None:
    """What a run killed before its first prediction leaves (config, meta, an empty log) does not block a run
    with another config; the sweep planner counts that job as new."""
    from kvbench.app.sweep import Job, classify
    from kvbench.run.runner import Runner, config_hash

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
    Runner(validate_run(cfg)).run()
    assert capsys.readouterr().err.count("stopped before writing any prediction; this run replaces it") == 1
    meta = json.loads((folder / "run_meta.json").read_text())
    assert meta["config_hash"] == config_hash(cfg) and meta["status"] == "complete"


# ---------------------------------------------------------------------------------------------------- lock
def test_lock_falls_back_to_an_exclusive_file_where_flock_is_unsupported(tmp_path: Path, monkeypatch) -> None:
    import fcntl

    from kvbench.errors import KVBenchError
    from kvbench.storage.folder import EXCL_LOCK_FILE, run_folder_lock

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
    from kvbench.storage.folder import LOCK_FILE, run_folder_lock

    folder = tmp_path / "run"
    script = (
        "import sys, time; from pathlib import Path; from kvbench.storage.folder import run_folder_lock\n"
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
    from kvbench.storage.writers import PredictionLog, atomic_write_json

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
    from kvbench.models.loading import DTYPES

    assert tuple(DTYPES) == config.DTYPE_NAMES


def test_method_families_build_without_importing_transformers() -> None:
    """A bad family or family parameter is reported once the method modules load (torch), before transformers
    (the runner's import), so it comes in about a second and a half, not five (docs/results.md, bad input)."""
    code = (
        "import sys\n"
        "from kvbench.eviction.base import method_families\n"
        "assert 'snapkv' in method_families() and 'cake' in method_families()\n"
        "print(sorted(m for m in sys.modules if m == 'transformers' or m.startswith('transformers.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------------------- issue #29
def test_output_root_where_no_folder_can_be_made_fails_before_any_work(capsys, monkeypatch) -> None:
    """``/proc`` passes ``os.access`` for root but refuses new folders: the root is probed by making one."""
    import kvbench.run.runner

    monkeypatch.setattr(kvbench.run.runner, "load_model", no_weights)
    code, stderr = run_in_process(["run.output_root=/proc/kvbench-test/runs"], capsys)
    assert_clean_failure(code, stderr, ["run.output_root='/proc/kvbench-test/runs'", "cannot create a folder in /proc"])


def test_lock_retry_loop_is_bounded(tmp_path: Path) -> None:
    """A folder that vanishes after every mkdir (what /proc does for root) ends in a clear error, not a spin at
    100 % CPU (the hang of issue #29); the subprocess's timeout bounds the test."""
    script = (
        "import pathlib, sys\n"
        "from kvbench.errors import KVBenchError\n"
        "from kvbench.storage.folder import run_folder_lock\n"
        "def vanishing(self, *args, **kwargs):\n"
        "    raise FileNotFoundError(2, 'No such file or directory')\n"
        "pathlib.Path.mkdir = vanishing\n"
        "try:\n"
        "    with run_folder_lock(pathlib.Path(sys.argv[1]), wait_s=0):\n"
        "        print('locked')\n"
        "except KVBenchError as err:\n"
        "    print('error:', err)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "run")], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.startswith("error: cannot create the run folder"), out.stdout + out.stderr
    assert "run.output_root=" in out.stdout


def test_busy_run_folder_is_reported_before_data_or_model(root: Path, capsys, monkeypatch) -> None:
    """A second copy of a run learns that its folder is locked before preparing data or loading the model."""
    import kvbench.run.runner
    from kvbench.storage.folder import run_folder_lock

    def no_data(*args, **kwargs):
        raise AssertionError("the tokenizer was loaded although the run folder is busy")

    monkeypatch.setattr(kvbench.run.runner, "load_tokenizer", no_data)
    monkeypatch.setattr(kvbench.run.runner, "load_model", no_weights)
    monkeypatch.delenv("KVBENCH_LOCK_WAIT", raising=False)
    folder = root / "tiny" / "tiny_niah" / "streamingllm" / "64L"
    with run_folder_lock(folder, wait_s=0):
        before = tree_hash(root)
        code, stderr = run_in_process(["method=streamingllm", f"run.output_root={root}"], capsys)
        assert tree_hash(root) == before
    assert_clean_failure(code, stderr, [f"{folder} is in use by another kvbench process (pid {os.getpid()} on"])


def test_bad_lock_wait_is_reported_before_the_model(root: Path, capsys, monkeypatch) -> None:
    import kvbench.run.runner

    monkeypatch.setattr(kvbench.run.runner, "load_model", no_weights)
    for value in ("abc", "-1", "nan"):
        monkeypatch.setenv("KVBENCH_LOCK_WAIT", value)
        code, stderr = run_in_process([f"run.output_root={root}"], capsys)
        assert_clean_failure(code, stderr, [f"KVBENCH_LOCK_WAIT={value!r} is not a number of seconds >= 0"])


def test_num_samples_is_the_extent_of_a_run(tmp_path: Path, capsys) -> None:
    """More samples continue the same folder keeping the first predictions byte for byte; fewer report on the
    first N without deleting or rewriting anything; the config hash does not depend on the count."""
    from kvbench.app.sweep import Job, classify
    from kvbench.run.runner import Runner
    from kvbench.storage.writers import config_hash

    root = tmp_path / "runs"
    shared = ["task.lengths=[1024]", "task.datasets=[niah_single_1k]", "run.print_table=true"]
    folder = root / "tiny" / "tiny_niah" / "snapkv" / "64L"
    dataset = folder / "niah_single_1k"
    Runner(validate_run(tiny_cfg(root, *shared, "task.num_samples=2"))).run()
    first = (dataset / "predictions.jsonl").read_bytes()
    assert len(first.splitlines()) == 2
    capsys.readouterr()

    fewer = tiny_cfg(root, *shared, "task.num_samples=1")
    assert config_hash(fewer) == config_hash(tiny_cfg(root, *shared, "task.num_samples=2"))
    job = Job([])
    classify(job, fewer)
    assert job.state == "complete"  # the folder covers one sample: nothing to run
    kept = [
        "config.yaml",
        "summary.json",
        *(f"niah_single_1k/{name}" for name in ("predictions.jsonl", "metrics.json")),
    ]
    before = {name: (folder / name).read_bytes() for name in kept}
    (result,) = Runner(validate_run(fewer)).run()
    assert (result.n_samples, result.first_of) == (1, 2)
    assert "(first 1 of 2)" in capsys.readouterr().out
    assert {name: (folder / name).read_bytes() for name in kept} == before  # nothing deleted or rewritten

    more = tiny_cfg(root, *shared, "task.num_samples=3")
    job = Job([])
    classify(job, more)
    assert job.state == "partial"
    (result,) = Runner(validate_run(more)).run()
    grown = (dataset / "predictions.jsonl").read_bytes()
    assert grown.startswith(first) and len(grown.splitlines()) == 3
    metrics = json.loads((dataset / "metrics.json").read_text())
    assert metrics["n_samples"] == 3 == result.n_samples and metrics["num_samples_requested"] == 3
    assert json.loads((folder / "summary.json").read_text())["datasets"][0]["n_samples"] == 3


def test_tiny_niah_sample_i_does_not_depend_on_the_count() -> None:
    from kvbench.tasks.tiny_niah import DEPTH_GRID_POINTS, spread_depth

    depths = [spread_depth(index) for index in range(DEPTH_GRID_POINTS + 27)]
    assert depths[:DEPTH_GRID_POINTS] == [round(100 * i / 9, 2) for i in range(10)]  # the default run's samples
    assert len(set(depths)) == len(depths) and all(0 <= depth <= 100 for depth in depths)
    assert depths[DEPTH_GRID_POINTS : DEPTH_GRID_POINTS + 9] == [round(100 * (2 * i + 1) / 18, 2) for i in range(9)]


@pytest.mark.parametrize(
    ("overrides", "demo"),
    [
        ([], True),
        (["task.num_samples=2"], True),
        (["task.num_samples=2", "run.progress=false", "seed=1"], True),
        (["method=full"], False),
        (["task.num_samples=2", "budget=128L"], False),
        (["run.tag=mine"], False),
    ],
)
def test_kvbench_and_run_py_keep_the_embedded_default_for_extent_overrides(overrides: list[str], demo: bool) -> None:
    """``kvbench task.num_samples=2`` and ``python run.py task.num_samples=2`` (one function, kvbench.app.cli.main) run
    the embedded default's comparison on 2 samples; choosing a preset or a tag runs that one configuration."""
    from kvbench.app.cli import demo_overrides

    assert demo_overrides(overrides) is demo


# ---------------------------------------------------------------------------------------------------- API
@pytest.fixture(scope="module")
def tiny_model() -> tuple[object, object]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kvbench.resources import models_dir

    path = models_dir() / "tiny-niah"
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


API_CASES = [
    (
        {"overrides": ["method.windw=3"]},
        ["method.windw is not a kvbench setting", "Did you mean method.params.window?"],
    ),
    ({"overrides": ["methd.window=3"]}, ["methd is not a kvbench setting", "Did you mean method?"]),
    ({"overrides": ["run.tagg=x"]}, ["run.tagg", "Did you mean run.tag?"]),
    ({"overrides": ["method.params.window=abc"]}, ["method.params.window='abc'", "an integer"]),
    ({"overrides": ["method.params.window=0"]}, ["method.params.window=0", "[1, inf)"]),
    ({"overrides": ["method.params.nope=1"]}, ["method.params.nope is not a parameter", "are: kernel_size"]),
    ({"overrides": ["run.prefill_chunk=-3"]}, ["run.prefill_chunk=-3", ">= 0"]),
    ({"overrides": ["run.decode_batch=-2"]}, ["run.decode_batch=-2", "integer >= 1", "auto"]),
    ({"limit": -1}, ["limit=-1", ">= 1", "None for all"]),
    ({"limit": 0}, ["limit=0"]),
    ({"question_mode": "both"}, ["question_mode='both'", "aware, agnostic"]),
    ({"method": "snapkvv"}, ["unknown method 'snapkvv'", "Did you mean method=snapkv?"]),
    ({"budget": "12x"}, ["'12x'", "accepted forms"]),
    ({"task": "nope"}, ["unknown task 'nope'", "tiny_niah"]),
    ({"task": "tiny_niah", "overrides": ["task.datasets=[nope]"]}, ["task.datasets=['nope']", "valid datasets"]),
    ({"model_config": "nope"}, ["unknown model 'nope'", "tiny"]),
]


@pytest.mark.parametrize(("kwargs", "expected"), API_CASES, ids=lambda case: str(case))
def test_api_bad_input_is_one_kvbench_error(tiny_model, tmp_path: Path, monkeypatch, kwargs, expected) -> None:
    """kvbench.evaluate names the caller's own argument (``limit=-1``, not ``task.num_samples``) and gives the
    CLI's "did you mean"; nothing is written and no sample is generated."""
    import kvbench
    import kvbench.run.runner
    from kvbench.errors import KVBenchError

    def no_data(*args, **kwargs):
        raise AssertionError("samples were prepared before the bad input was reported")

    monkeypatch.setattr(kvbench.run.runner.Runner, "load_data", no_data)
    model, tokenizer = tiny_model
    with pytest.raises(KVBenchError) as raised:
        kvbench.evaluate(model, tokenizer, **{"budget": "64L", **kwargs}, output_dir=tmp_path, progress=False)
    for fragment in expected:
        assert fragment in str(raised.value), (fragment, str(raised.value))
    assert not any(tmp_path.iterdir())


def test_press_explains_that_beams_are_why_a_prompt_became_a_batch(tiny_model) -> None:
    import torch

    import kvbench
    from kvbench.errors import KVBenchError

    model, tokenizer = tiny_model
    inputs = tokenizer("alpha beta gamma : delta", return_tensors="pt")
    with pytest.raises(KVBenchError) as raised, torch.no_grad(), kvbench.press(model, "snapkv", "64L"):
        model.generate(**inputs, max_new_tokens=2, num_beams=2, do_sample=False)
    message = str(raised.value)
    assert "2 copies of one prompt" in message and "num_beams=2" in message and "num_beams=1" in message
    assert isinstance(raised.value, ValueError)  # still a ValueError for callers that caught that


# ---------------------------------------------------------------------------------------------------- kvbench list
@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["nope"], ["unknown list target 'nope'", "methods, tasks, models, budgets"]),
        (["method"], ["did you mean 'methods'?"]),
        ([], ["missing list target", "methods, tasks"]),
        (["methods", "tasks"], ["one target at a time, got 2"]),
    ],
)
def test_kvbench_list_bad_target(capsys, argv: list[str], expected: list[str]) -> None:
    from kvbench.app.listing import main as list_main

    capsys.readouterr()
    code = list_main(argv)
    assert_clean_failure(code, capsys.readouterr().err, expected)


def test_kvbench_list_methods_resolves_interpolations() -> None:
    """What an interpolated parameter is in a default run, and what it follows -- never ``${oc.select:...}``."""
    from kvbench.app.listing import value_text

    params = OmegaConf.load(CONF / "method" / "cake.yaml").params
    shown = value_text(OmegaConf.to_container(params, resolve=False)["model"])
    assert shown == "tiny (follows model.name; null where no model.name exists)"
    assert value_text("${oc.select:run.tag,adakv_late}") == "null (follows run.tag; adakv_late where no run.tag exists)"
    assert value_text("${oc.select:model.name,null}") == "tiny (follows model.name; null where no model.name exists)"


# ---------------------------------------------------------------------------------------------------- lm-eval bridge
BRIDGE_CASES = [
    ("method=nope", ["unknown method 'nope' (there is no conf/method/nope.yaml)", "snapkv"]),
    ("method=snapkvv", ["Did you mean method=snapkv?"]),
    ("budget=abcL", ["budget='abcL'", "accepted forms", "128L"]),
    ("budget=-5L", ["budget='-5L'", "accepted forms"]),
    ("question_mode=bogus", ["question_mode='bogus'", "aware, agnostic"]),
    ("pretrained=nope", ["pretrained='nope'", "not in the local Hugging Face cache", "kvbench model preset", "tiny"]),
    ("pretrained=builtin:tiny-random-gpt", ["tiny-random-gpt", "builtin:tiny-random-llama"]),
    ("dtype=fp8", ["dtype='fp8'", "bfloat16, float16, float32"]),
    ("max_length=-1", ["max_length=-1", ">= 2"]),
    ("prefill_chunk=-3", ["prefill_chunk=-3", ">= 0"]),
    ("decode_batch=0", ["decode_batch=0", "integer >= 1", "auto"]),
    ("foo=1", ["unknown --model_args key(s) ['foo']", "pretrained, method, budget"]),
    ("method=snapkv,method.windw=3", ["method.windw is not a kvbench setting", "Did you mean method.params.window?"]),
    ("method=snapkv,method.params.window=0", ["method.params.window=0", "[1, inf)"]),
    ("method=cake,method.params.allocation=fair", ["allocation='fair'", "p2a"]),
    ("method=snapkv,method.params.nope=1", ["method.params.nope is not a parameter", "are: kernel_size"]),
]


@pytest.mark.parametrize(("model_args", "expected"), BRIDGE_CASES, ids=[case[0] for case in BRIDGE_CASES])
def test_lmeval_bridge_checks_model_args_before_lm_eval_runs(capsys, monkeypatch, model_args, expected) -> None:
    """``python -m kvbench.lmeval run --model kvbench --model_args ...``: a bad value exits 2 with run.py's message
    before lm-eval loads a task (here a task that does not exist: the bad value is still what is reported) or the
    model."""
    pytest.importorskip("lm_eval")
    import lm_eval.__main__

    from kvbench.lmeval.__main__ import main as bridge_main

    def no_lm_eval() -> None:
        raise AssertionError("lm-eval ran before --model_args were checked")

    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", no_lm_eval)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = ["kvbench.lmeval", "run", "--model", "kvbench", "--model_args", model_args, "--tasks", "no_such_task"]
    monkeypatch.setattr(sys, "argv", argv)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        bridge_main()
    assert_clean_failure(int(exited.value.code), capsys.readouterr().err, expected)


def test_num_samples_stays_in_the_identity_of_a_method_that_calibrates_on_a_share_of_them(tmp_path: Path) -> None:
    """XKV's sampled mode calibrates on the first ceil(ratio x N) samples: sample i depends on N, so N is part of its
    run's identity (another count is refused, naming it), while it is not for the others."""
    from kvbench.storage.writers import config_hash

    def hashes(*overrides: str) -> set[str]:
        return {config_hash(tiny_cfg(tmp_path, *overrides, f"task.num_samples={n}")) for n in (2, 4)}

    assert len(hashes("method=snapkv")) == 1
    assert len(hashes("method=xkv_sampled")) == 2
