"""The "Smaller" list of issue #55: each case ends with one clear message (exit 2 for a user error, 130/143 for a
stop signal) and no traceback, and a stopped run resumes to the same predictions."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest

import kvbench.run.runner as runner
import kvbench.storage.writers as writers
from tests.faults.conftest import DATASET, RUN, run_job_status


def test_sigterm_during_the_model_load_ends_with_a_message(tmp_path: Path, capsys, monkeypatch) -> None:
    real = runner.load_model

    def load_model(*args, **kwargs):
        signal.raise_signal(signal.SIGTERM)  # SLURM's time limit, while the weights load
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "load_model", load_model)
    code, stderr = run_job_status(tmp_path / "runs", capsys)
    assert code == 143 and "interrupted (received signal 15)" in stderr and "rerun the same command" in stderr
    assert "Traceback" not in stderr
    assert not (tmp_path / "runs" / RUN).exists()  # nothing written yet: no trace left


def test_sigint_records_interrupted_and_the_rerun_resumes_byte_for_byte(
    finished_run: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    real = writers.PredictionLog.append
    calls = []

    def append(self, row):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # Ctrl-C between two samples
        return real(self, row)

    monkeypatch.setattr(writers.PredictionLog, "append", append)
    root = tmp_path / "runs"
    code, stderr = run_job_status(root, capsys)
    assert code == 130 and "Ctrl-C" in stderr and "Traceback" not in stderr
    assert json.loads((root / RUN / "run_meta.json").read_text())["status"] == "interrupted"
    monkeypatch.setattr(writers.PredictionLog, "append", real)
    code, stderr = run_job_status(root, capsys)
    assert code == 0, stderr[-2000:]
    predictions = RUN / DATASET / "predictions.jsonl"
    assert (root / predictions).read_bytes() == (finished_run / predictions).read_bytes()


def _samples() -> list:
    from kvbench.sample import Sample

    return [Sample(id=f"s{i}", context=f"context {i}", question="q?", answers=["a"]) for i in range(2)]


def test_a_newer_sample_cache_file_is_never_rewritten_in_the_old_format(tmp_path: Path, caplog) -> None:
    from kvbench.storage.sample_cache import FORMAT_VERSION, SampleCache, cached_samples

    cache = SampleCache(tmp_path)
    path = cache.path("ruler", "niah", {"k": 1})
    path.parent.mkdir(parents=True)
    newer = json.dumps({"kvbench_sample_cache": FORMAT_VERSION + 1, "key": {"k": 1}, "layout": "future"}) + "\n"
    path.write_text(newer)
    with caplog.at_level("WARNING", logger="kvbench.storage.sample_cache"):
        samples = cached_samples(cache, "ruler", "niah", lambda: {"k": 1}, 2, lambda n: _samples()[:n])
    assert [s.id for s in samples] == ["s0", "s1"] and path.read_text() == newer
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "written by a newer kvbench" in warning and "run.sample_cache=" in warning


def test_a_read_only_sample_cache_names_the_fix_and_leaves_no_tmp(tmp_path: Path, caplog, monkeypatch) -> None:
    import errno

    from kvbench.storage.sample_cache import SampleCache, cached_samples

    cache = SampleCache(tmp_path)
    real_open = Path.open

    def refusing_open(self, mode="r", *args, **kwargs):
        if "w" in mode and self.name.endswith(".tmp"):
            handle = real_open(self, mode, *args, **kwargs)  # created, then the write fails: a full disk
            handle.close()
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(self, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", refusing_open)
    with caplog.at_level("WARNING", logger="kvbench.storage.sample_cache"):
        samples = cached_samples(cache, "ruler", "niah", lambda: {"k": 1}, 2, lambda n: _samples()[:n])
    assert len(samples) == 2
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]  # no .tmp left, nothing half-written
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "No space left on device" in warning and "run.sample_cache=<a writable folder>" in warning


def test_a_budget_spec_with_a_bad_number_is_named_not_a_hydra_group(tmp_path: Path, capsys, monkeypatch) -> None:
    from kvbench.app.cli import main
    from tests.faults.conftest import assert_one_line_error

    for value in ("0/layer",):
        monkeypatch.setattr("sys.argv", ["kvbench", f"budget={value}", f"run.output_root={tmp_path}"])
        try:
            main()
        except SystemExit as exited:
            code = int(exited.code or 0)
        stderr = capsys.readouterr().err
        assert_one_line_error(code, stderr, f"unknown budget '{value}'", "must be positive", "budget=<spec>")
        assert "unknown budget/" not in stderr  # Hydra read the spec's "/" as a sub-group


def test_a_multirun_flag_after_the_overrides_runs_the_sweep(tmp_path: Path, capsys, monkeypatch) -> None:
    from kvbench.app.cli import main
    from tests.faults.conftest import BASE

    monkeypatch.chdir(tmp_path)
    overrides = [*BASE, "run.print_table=false", f"run.output_root={tmp_path / 'runs'}", "budget=96L"]
    monkeypatch.setattr("sys.argv", ["kvbench", *overrides, f"hydra.sweep.dir={tmp_path / 'sweep'}", "-m"])
    main()
    assert "unrecognized arguments" not in capsys.readouterr().err
    assert (tmp_path / "runs" / RUN.parent / "96L" / DATASET / "metrics.json").is_file()


@pytest.fixture(scope="module")
def tiny_model():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kvbench.models.tiny import DEFAULT_MODEL_DIR

    return AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_DIR), AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR)


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("swapped", "the model and the tokenizer are swapped"),
        ("no model", "model=NoneType is not a loaded transformers model"),
        ("overrides string", "overrides='run.tag=x' must be a list of key=value strings, e.g. overrides=['run.tag=x']"),
        ("encoder-decoder", "is an encoder-decoder model (t5)"),
    ],
)
def test_evaluate_refuses_wrong_arguments_with_one_kvbench_error(tiny_model, case: str, expected: str) -> None:
    from transformers import T5Config, T5ForConditionalGeneration

    import kvbench
    from kvbench.errors import KVBenchError

    model, tokenizer = tiny_model
    args, kwargs = {
        "swapped": ((tokenizer, model), {}),
        "no model": ((None, tokenizer), {}),
        "overrides string": ((model, tokenizer), {"overrides": "run.tag=x"}),
        "encoder-decoder": (
            (T5ForConditionalGeneration(T5Config(d_model=8, d_ff=8, d_kv=4, num_layers=1, num_heads=2)), tokenizer),
            {},
        ),
    }[case]
    with pytest.raises(KVBenchError, match=re.escape(expected)):
        kvbench.evaluate(*args, **kwargs)


def test_a_nested_press_is_refused_naming_the_nesting(tiny_model) -> None:
    import kvbench
    from kvbench.inference.press import PressUsageError

    model, _ = tiny_model
    outer, inner = kvbench.press(model, "snapkv", "64L"), kvbench.press(model, "streamingllm", "64L")
    with outer, pytest.raises(PressUsageError, match="already active on this model: presses cannot be nested"):
        inner.__enter__()
    with kvbench.press(model, "streamingllm", "64L"):  # the first one left: a press may start again
        pass


def test_a_missing_lm_eval_include_path_is_named(tmp_path: Path) -> None:
    from kvbench.errors import KVBenchError
    from kvbench.lmeval.tasks import task_manager

    missing = tmp_path / "no_such_tasks"
    with pytest.raises(KVBenchError, match=rf"task\.options\.include_path: {re.escape(str(missing))} does not exist"):
        task_manager([str(missing)])


def test_tables_script_runs_from_another_folder(finished_run: Path, tmp_path: Path, monkeypatch) -> None:
    import importlib.util

    from kvbench.reporting.paper_refs import TABLES

    script = Path(__file__).resolve().parents[2] / "scripts" / "tables.py"
    spec = importlib.util.spec_from_file_location("tables_cli", script)
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    monkeypatch.chdir(tmp_path)  # no results/paper here: the default is kvbench's shipped one
    table = sorted(TABLES)[0]
    args = ["--runs", str(finished_run), "--out", str(tmp_path / "t"), "--no-plots", "--tables", table]
    assert cli.main(args) == 0
    assert (tmp_path / "t" / f"{table}.md").is_file()
