"""``scripts/compute_expected_attention_stats.py``: Expected Attention's query statistics from a model's own queries on
local text, usable by ``method=expected_attention method.params.stats=<file>``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from safetensors.torch import load_file

from kvbench.budget import parse_budget
from kvbench.eviction.base import build_method
from kvbench.inference.generate import generate
from kvbench.inference.queries import prerope, record_queries

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "compute_expected_attention_stats.py"


def load_script():
    spec = importlib.util.spec_from_file_location("compute_expected_attention_stats", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_statistics_are_the_mean_and_covariance_of_the_samples_queries(tiny_llama, tmp_path: Path) -> None:
    """Two samples of 60 characters, sinks dropped: the file's mean and (unbiased) covariance are those of the
    concatenated pre-RoPE queries, and the method runs with them."""
    model, tokenizer = tiny_llama
    text = tmp_path / "calibration.txt"
    text.write_text("abcdefghij" * 12)
    out = tmp_path / "stats.safetensors"
    script = load_script()
    script.load = lambda name: (model, tokenizer)  # the fixture's model instead of loading one by name
    args = ["--model", "fixture", "--text", str(text), "--out", str(out), "--num-samples", "2", "--sample-chars", "60"]
    assert script.main(args) == 0
    stats = load_file(out)
    assert stats["query_mean"].shape == (4, 4, 16) and stats["query_cov"].shape == (4, 4, 16, 16)
    ids = tokenizer("abcdefghij" * 6, return_tensors="pt").input_ids
    layer0 = prerope(model, record_queries(model, ids)[0])[:, 4:]  # both samples are this text
    both = torch.cat([layer0, layer0], dim=1)
    torch.testing.assert_close(stats["query_mean"][0], both.mean(1), atol=1e-5, rtol=1e-5)
    centred = both - both.mean(1, keepdim=True)
    expected_cov = centred.transpose(1, 2) @ centred / (both.shape[1] - 1)
    torch.testing.assert_close(stats["query_cov"][0], expected_cov, atol=1e-5, rtol=1e-5)
    method = build_method({"name": "ea", "family": "expected_attention", "params": {"stats": str(out)}})
    prompt = tokenizer("Some context to compress, then a question. " * 6).input_ids
    result = generate(model, tokenizer, prompt[:200], prompt[200:], method=method, budget=parse_budget("32L"),
                      question_mode="agnostic", max_new_tokens=3, stop_token_ids=set())  # fmt: skip
    assert set(result.record.achieved_per_layer) == {32}


def test_a_bad_sample_size_is_exit_2(tmp_path: Path, capsys) -> None:
    text = tmp_path / "t.txt"
    text.write_text("x")
    args = ["--model", "x", "--text", str(text), "--out", str(tmp_path / "o"), "--sample-chars", "0"]
    code = load_script().main(args)
    assert code == 2 and "--sample-chars 0" in capsys.readouterr().err
