"""The one-call GPU validation (scripts/gpu_validate.py, issue #26) runs on CPU before a GPU ever sees it: every phase
completes on the tiny model with the Triton interpreter, its rows say what ran, it writes at most 8 files, and a
SIGINT stops it cleanly with the rows written so far kept.  The carried tokenizer files (scripts/gpu_wheels.py) are
what kvbench reads.  About 25 s on 2 shared cores (two short runs of the script)."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_validate.py"
#: The quick dry run: the 4-layer test model, one context, one family, one fast test in the background.
DRY_RUN = ["--small", "--device", "cpu", "--small-arch", "tiny", "--methods", "snapkv", "--contexts", "128"]


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("KVBENCH_CACHE_BACKEND", None)
    return env


def test_dry_run_completes_every_phase_and_records_what_ran(tmp_path: Path) -> None:
    quick_test = "tests/kernels/test_kernels.py::test_auto_uses_torch_without_cuda"
    command = [sys.executable, str(SCRIPT), *DRY_RUN, "--skip", "llama", "--pytest", quick_test, "--out", str(tmp_path)]
    done = subprocess.run(command, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) <= 8, files
    phases = {row["phase"]: row for row in _rows(tmp_path / "phases.csv")}
    assert [phases[p]["status"] for p in ("env", "kernels", "parity", "e2e", "decode", "batch")] == ["ok"] * 6
    assert "exit 0" in phases["tests"]["detail"]  # the background pytest ran and passed
    assert "1 passed" in (tmp_path / "pytest.log").read_text()

    env = json.loads((tmp_path / "env.json").read_text())
    assert env["attention_capability"]["varlen_paged_kv"] in (True, False)
    assert env["copy_bandwidth_gbps"] > 0

    kernels = _rows(tmp_path / "kernels.csv")
    names = {"paged_decode_attention", "window_stats", "causal_column_sums", "paged_append", "copy_rows"}
    assert {row["kernel"] for row in kernels} == names
    assert all(row["status"] == "ok" and row["ok"] == "True" and row["finite"] == "True" for row in kernels), kernels

    parity = _rows(tmp_path / "parity.csv")
    assert [(row["backend"], row["page_size"]) for row in parity] == [("torch", ""), ("paged", "16"), ("paged", "256")]
    for row in parity[1:]:
        assert row["ok"] == "True" and float(row["argmax_agree"]) == 1.0, row
        calls = json.loads(row["attention_calls"])
        assert calls["dense_prefill"] > 0 and calls["torch_gather"] > 0  # the CPU path, planned as such
        assert json.loads(row["fallbacks"]) == {}

    e2e = _rows(tmp_path / "e2e.csv")
    assert {row["task"] for row in e2e} == {"ruler", "longbench"}
    for row in e2e:
        assert (row["status"], row["finite"], row["allocation_exact"], row["evicted"]) == ("ok", "True", "True", "True")
        assert json.loads(row["attention_calls"])["torch_gather"] > 0  # the dry run goes through the paged cache

    bench = {row["method"]: row for row in _rows(tmp_path / "bench.csv")}
    assert set(bench) == {"full", "snapkv", "ada_snapkv", "cake"}
    for row in bench.values():
        assert row["status"] == "ok" and row["finite"] == "True" and row["backend"] == "paged", row
        assert float(row["decode_ms_per_token"]) > 0 and float(row["decode_bandwidth_fraction"]) > 0
        assert float(row["prefill_vs_full"]) > 0
    assert float(bench["full"]["prefill_vs_full"]) == 1.0

    # The batch phase: batch 1 against batches 4 and 2 (--small) through the runner's functions, per method.
    batch = _rows(tmp_path / "batch.csv")
    assert batch[0]["decode_batch"] == "warm-up" and batch[0]["status"] == "ok"
    measured = {(row["method"], row["decode_batch"]): row for row in batch[1:]}
    assert set(measured) == {(method, size) for method in ("snapkv", "full", "h2o") for size in ("1", "4", "2")}
    for row in measured.values():
        assert row["status"] == "ok" and row["finite"] == "True", row
        samples, new_tokens = int(row["samples"]), int(row["max_new_tokens"])
        assert int(row["decode_tokens"]) == samples * (new_tokens - 1)  # no stop token: every sample decodes them all
        assert float(row["decode_tok_s"]) > 0 and float(row["speedup_vs_1"]) > 0
        # CPU float32: batched decoding gives batch 1's tokens (tests/inference/test_batch_decode.py), so every sample
        # compares identical here.
        assert (
            json.loads(row["identical"]) == [True] * samples and json.loads(row["first_diff_step"]) == [None] * samples
        )
        assert float(row["identical_tokens_fraction"]) == float(row["identical_text_fraction"]) == 1.0
        assert float(row["max_abs_logit_diff"]) <= 1e-5 < float(row["logit_scale"])  # the tolerance of that test
    assert measured[("snapkv", "1")]["budget"] == "64L" and measured[("full", "1")]["budget"] == "full"
    assert json.loads(measured[("snapkv", "4")]["attention_calls"])["torch_gather"] > 0  # through the paged cache
    assert {row["decode_path"] for (_, size), row in measured.items() if size != "1"} == {"pooled"}  # issue #46


def test_batch_comparison_finds_the_first_differing_step() -> None:
    """The batch phase's comparison of batch-N outputs with batch 1's: identical flags, first differing step
    (0 = the first new token; a shorter output differs where it ends), fractions, the speed-up, and the largest logit
    difference over the steps fed the same tokens only (after a differing token the inputs differ)."""
    import torch

    spec = importlib.util.spec_from_file_location("gpu_validate", SCRIPT)
    assert spec and spec.loader
    gpu_validate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_validate)

    def output(tokens: list[int], text: str, decode_s: float) -> SimpleNamespace:
        return SimpleNamespace(token_ids=tokens, text=text, decode_s=decode_s, prefill_s=0.5)

    reference = [output([1, 2, 3], "a", 2.0), output([4, 5, 6], "b", 2.0), output([7, 8, 9], "c", 2.0)]
    ref_logits = [torch.full((2, 5), 4.0), torch.zeros(2, 5), torch.zeros(2, 5)]
    batch_1 = gpu_validate.batch_row(reference, ref_logits, None)
    assert batch_1["decode_tok_s"] == 6 / 6.0 and batch_1["speedup_vs_1"] == 1.0
    assert batch_1["max_abs_logit_diff"] == 0.0 and batch_1["logit_scale"] == 4.0
    batched = [output([1, 2, 3], "a", 0.5), output([4, 0, 6], "b", 0.5), output([7, 8], "c", 0.5)]
    # Sample 1's token 1 differs: only its call 0 (fed token 0, chose token 1) compares; its call 1's 9.0 does not.
    logits = [torch.full((2, 5), 4.5), torch.tensor([[0.25] * 5, [9.0] * 5]), torch.zeros(1, 5)]
    row = gpu_validate.batch_row(batched, logits, (reference, batch_1["decode_tok_s"], ref_logits))
    assert row["identical"] == [True, False, False] and row["first_diff_step"] == [None, 1, 2]
    assert row["identical_tokens_fraction"] == 1 / 3 and row["identical_text_fraction"] == 1.0
    assert row["decode_tokens"] == 5 and row["speedup_vs_1"] == round((5 / 1.5) / 1.0, 3)
    assert row["max_abs_logit_diff"] == 0.5
    assert gpu_validate.batch_row(batched, None, (reference, 1.0, ref_logits))["max_abs_logit_diff"] == ""


def test_sigint_stops_cleanly_and_keeps_the_rows(tmp_path: Path) -> None:
    command = [sys.executable, str(SCRIPT), *DRY_RUN, "--skip", "tests", "--out", str(tmp_path)]
    process = subprocess.Popen(command, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    phases_csv, deadline = tmp_path / "phases.csv", time.monotonic() + 120

    def env_phase_done() -> bool:
        return phases_csv.exists() and len(phases_csv.read_text().splitlines()) >= 2

    while time.monotonic() < deadline and process.poll() is None and not env_phase_done():
        time.sleep(0.05)  # the signal lands in the second phase
    assert process.poll() is None, process.stdout.read().decode()[-3000:]  # type: ignore[union-attr]
    process.send_signal(signal.SIGINT)
    output = process.communicate(timeout=60)[0].decode()
    assert process.returncode == 128 + signal.SIGINT, output[-3000:]
    phases = _rows(phases_csv)
    assert phases[0]["phase"] == "env" and phases[0]["status"] == "ok", "the rows written before the signal are kept"
    assert any(row["status"] == "stopped" and "SIGINT" in row["detail"] for row in phases), phases
    assert json.loads((tmp_path / "env.json").read_text())["torch"]
    assert _rows(tmp_path / "kernels.csv") == [] or _rows(tmp_path / "kernels.csv")[-1]["status"] in ("ok", "stopped")


def test_readme_gpu_command_fits_one_device_call() -> None:
    """The documented GPU command (docs/performance.md): one call of at most 2,000 characters, running
    scripts/gpu_session.sh."""
    text = (REPO / "docs" / "performance.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- gpu-command -->\s*```bash\n(.*?)```", text, flags=re.DOTALL)
    assert match, "docs/performance.md lost its <!-- gpu-command --> block"
    command = match.group(1).strip()
    assert len(command) <= 2000 and "scripts/gpu_session.sh" in command
    assert "--out" not in command or "$OUT" in command


def test_carried_tokenizer_files_are_what_kvbench_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """make gpu-wheels copies the Llama-3 and Mistral v3 vocabularies; KVBENCH_TOKENIZER_FILES points at them."""
    spec = importlib.util.spec_from_file_location("gpu_wheels", REPO / "scripts" / "gpu_wheels.py")
    assert spec and spec.loader
    gpu_wheels = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_wheels)
    from kvbench.models.tokenizers import FAMILIES, TOKENIZER_FILES_ENV

    installed = {name: FAMILIES[name].path() for name in gpu_wheels.TOKENIZER_FAMILIES}
    copied = gpu_wheels.copy_tokenizer_files(tmp_path)
    monkeypatch.setenv(TOKENIZER_FILES_ENV, str(tmp_path))
    for name, path in installed.items():
        carried = FAMILIES[name].path()
        assert carried.is_relative_to(tmp_path) and carried in copied
        assert carried.read_bytes() == path.read_bytes()
    monkeypatch.setenv(TOKENIZER_FILES_ENV, str(tmp_path / "missing"))
    assert FAMILIES["llama3"].path() == installed["llama3"]  # a folder without the file: the installed package
