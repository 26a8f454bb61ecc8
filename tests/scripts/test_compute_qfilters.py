"""``scripts/compute_qfilters.py``: Q-Filters from a model's own queries on local text, usable by ``method=qfilter``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from safetensors.torch import load_file

from kvbench.budget import parse_budget
from kvbench.eviction.base import build_method
from kvbench.inference.generate import generate
from kvbench.methods.qfilter import FILTERS_KEY

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "compute_qfilters.py"


def load_script():
    spec = importlib.util.spec_from_file_location("compute_qfilters", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_filters_of_a_model_are_unit_directions_the_method_reads(tiny_llama, tmp_path: Path) -> None:
    model, tokenizer = tiny_llama
    script = load_script()
    text = tmp_path / "calibration.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 8)
    out = tmp_path / "filters.safetensors"
    script.load = lambda name: (model, tokenizer)  # the fixture's model instead of loading one by name
    assert script.main(["--model", "fixture", "--text", str(text), "--out", str(out), "--max-tokens", "96"]) == 0
    filters = load_file(out)[FILTERS_KEY]
    assert filters.shape == (4, 2, 16)  # 4 layers, 2 KV heads, head_dim 16
    torch.testing.assert_close(filters.norm(dim=-1), torch.ones(4, 2))
    assert model.config._attn_implementation == "kvbench"  # the model is left as it was
    method = build_method({"name": "qfilter", "family": "qfilter", "params": {"filters": str(out)}})
    ids = tokenizer("Some context to compress, then a question. " * 6).input_ids
    result = generate(model, tokenizer, ids[:200], ids[200:], method=method, budget=parse_budget("32L"),
                      question_mode="agnostic", max_new_tokens=3, stop_token_ids=set())  # fmt: skip
    assert set(result.record.achieved_per_layer) == {32}


def test_a_missing_text_file_is_exit_2(tmp_path: Path, capsys) -> None:
    code = load_script().main(["--model", "x", "--text", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "o")])
    assert code == 2 and "nope.txt" in capsys.readouterr().err
