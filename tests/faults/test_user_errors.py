"""No traceback for a user error on any surface, disk full and permission denied included (issue #42, items 6-7):
one ``error:`` line naming the file or value and the fix, exit 2; a run stopped by one resumes to byte-identical
results; a bug still prints its traceback and asks for a report (exit 1)."""

from __future__ import annotations

import errno
import re
import shutil
import sys
from pathlib import Path

import pytest

import kvbench.storage.writers as writers
from kvbench.errors import KVBenchError
from kvbench.models.tiny import DEFAULT_MODEL_DIR
from tests.faults.conftest import DATASET, RUN, assert_one_line_error, comparable_metrics, run_job_status


def fail_on_call(monkeypatch, owner, name: str, call: int, err: OSError, partial: bool = False) -> None:
    """Make ``owner.name`` raise ``err`` on its ``call``-th call (``partial``: after writing half a row, as a full
    disk does to an append)."""
    real = getattr(owner, name)
    calls = []

    def failing(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            if partial:
                with open(self.path, "a", encoding="utf-8") as handle:
                    handle.write('{"id": "half a ro')
            raise err
        return real(self, *args, **kwargs)

    monkeypatch.setattr(owner, name, failing)


@pytest.mark.parametrize(
    ("where", "err"),
    [
        ("append", OSError(errno.ENOSPC, "No space left on device")),
        ("metrics", OSError(errno.ENOSPC, "No space left on device")),
        ("metrics", PermissionError(errno.EACCES, "Permission denied")),
    ],
)
def test_disk_full_or_permission_denied_stops_cleanly_and_resumes_byte_for_byte(
    finished_run: Path, tmp_path: Path, capsys, monkeypatch, where: str, err: OSError
) -> None:
    root = tmp_path / "runs"
    predictions = root / RUN / DATASET / "predictions.jsonl"
    err.filename = str(predictions if where == "append" else predictions.with_name("metrics.json"))
    if where == "append":
        fail_on_call(monkeypatch, writers.PredictionLog, "append", 2, err, partial=True)
    else:
        real_replace = writers.os.replace

        def refuse_metrics(src, dst):
            if str(dst).endswith("metrics.json"):
                raise err
            return real_replace(src, dst)

        monkeypatch.setattr(writers.os, "replace", refuse_metrics)
    code, stderr = run_job_status(root, capsys)
    fix = "writable" if isinstance(err, PermissionError) else "rerun the same command"
    assert_one_line_error(code, stderr, err.filename, fix)
    assert not list(predictions.parent.glob(".*.tmp"))
    monkeypatch.undo()
    code, stderr = run_job_status(root, capsys)
    assert code == 0, stderr[-2000:]
    clean = finished_run / RUN / DATASET
    assert predictions.read_bytes() == (clean / "predictions.jsonl").read_bytes()
    assert comparable_metrics(predictions.with_name("metrics.json")) == comparable_metrics(clean / "metrics.json")


def test_a_bug_keeps_its_traceback_and_asks_for_a_report(tmp_path: Path, capsys, monkeypatch) -> None:
    fail_on_call(monkeypatch, writers.PredictionLog, "append", 1, FileNotFoundError(errno.ENOENT, "internal"))
    code, stderr = run_job_status(tmp_path / "runs", capsys)
    assert code == 1 and "Traceback" in stderr and "please report it" in stderr


@pytest.fixture(scope="module")
def broken_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    for name in ("truncated", "config_only", "bad_tokenizer", "bad_config"):
        shutil.copytree(DEFAULT_MODEL_DIR, root / name)
    weights = (root / "truncated" / "model.safetensors").read_bytes()
    (root / "truncated" / "model.safetensors").write_bytes(weights[: len(weights) // 3])
    for path in (root / "config_only").iterdir():
        if path.name != "config.json":
            path.unlink()
    (root / "bad_tokenizer" / "tokenizer.json").write_text("garbage{")
    (root / "bad_config" / "config.json").write_text("[]")
    return root


@pytest.mark.parametrize(
    ("model", "names"),
    [
        ("truncated", ["truncated/model.safetensors", "truncated or damaged", "Download the model again"]),
        ("config_only", ["config_only holds config.json but no weights", "model.safetensors"]),
        ("bad_tokenizer", ["bad_tokenizer/tokenizer.json cannot be read as JSON"]),
        ("bad_config", ["bad_config/config.json is not a JSON object"]),
    ],
)
def test_a_damaged_model_folder_is_named_before_loading(
    broken_models: Path, tmp_path: Path, capsys, model: str, names: list[str]
) -> None:
    code, stderr = run_job_status(tmp_path / "runs", capsys, f"model.path={broken_models / model}")
    assert_one_line_error(code, stderr, *names)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("override", ["method=1", "budget=0", "task=2.5"])
def test_a_number_as_a_preset_is_one_line_on_the_cli_and_one_error_in_the_api(
    tmp_path: Path, capsys, override: str
) -> None:
    code, stderr = run_job_status(tmp_path / "runs", capsys, override)
    group, value = override.split("=")
    # A number is read as a name (kvbench.app.overrides.prepare_overrides): an unknown preset, with the valid ones.
    assert_one_line_error(code, stderr, f"unknown {group} '{value}'", "valid:")
    from kvbench.api import compose_config

    with pytest.raises(KVBenchError, match=f"unknown {group} '{re.escape(value)}'.*valid:"):
        compose_config(overrides=[override])


@pytest.mark.parametrize("command", ["report", "wandb-report"])
def test_report_out_in_the_way_is_one_line(finished_run: Path, tmp_path: Path, capsys, monkeypatch, command) -> None:
    from kvbench.app.cli import main

    in_the_way = tmp_path / "a_file"
    in_the_way.write_text("x")
    out = in_the_way if command == "report" else tmp_path
    extra = ["--entity", "e", "--project", "p", "--dry-run"] if command == "wandb-report" else []
    monkeypatch.setattr(sys, "argv", ["kvbench", command, str(finished_run), "--out", str(out), *extra])
    with pytest.raises(SystemExit) as exited:
        main()
    stderr = capsys.readouterr().err
    assert_one_line_error(exited.value.code, stderr, f"--out {out}")


def test_api_turns_a_full_disk_into_one_kvbench_error(tiny_llama, tmp_path: Path, monkeypatch) -> None:
    from kvbench.api import evaluate

    full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "predictions.jsonl"))
    fail_on_call(monkeypatch, writers.PredictionLog, "append", 1, full)
    model, tokenizer = tiny_llama
    with pytest.raises(KVBenchError, match=r"predictions.jsonl: no space left on the device .* rerun"):
        evaluate(
            model, tokenizer, "streamingllm", "64L", limit=1, output_dir=tmp_path, progress=False,
            overrides=["task.lengths=[1024]", f"task.datasets=[{DATASET}]"],
        )  # fmt: skip


def test_lmeval_bridge_names_a_damaged_model_folder(broken_models: Path, capsys, monkeypatch) -> None:
    pytest.importorskip("lm_eval")
    import lm_eval.__main__

    from kvbench.lmeval.__main__ import main as bridge_main

    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", lambda: pytest.fail("lm-eval ran"))
    model_args = f"pretrained={broken_models / 'truncated'}"
    argv = ["kvbench.lmeval", "run", "--model", "kvbench", "--model_args", model_args, "--tasks", "arc_easy"]
    monkeypatch.setattr(sys, "argv", argv)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        bridge_main()
    assert_one_line_error(exited.value.code, capsys.readouterr().err, "truncated/model.safetensors", "truncated")
