"""``scripts/estimate_duo_pattern.py`` and ``scripts/estimate_headkv_scores.py``: per-model head files in the
released formats, estimated offline on the embedded tiny model's ``tiny_niah`` probes and read back by the methods."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from kvbench.methods.duo_attention import load_duo_pattern
from kvbench.methods.headkv import load_head_scores

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
TINY = str(Path(__file__).resolve().parents[2] / "models" / "tiny-niah")


def load_script(name: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))  # the scripts import their shared head_probes.py
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_headkv_scores_find_the_tiny_models_retrieval_head(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny model was trained with layer 1's query head 0 reading the answer's positions (scripts/train_tiny.py):
    the reference's scoring rule gives it the largest score; the file loads as HeadKV's released format."""
    out = tmp_path / "scores.json"
    script = load_script("estimate_headkv_scores", monkeypatch)
    args = ["--model", TINY, "--tiny-niah", "2", "--length", "256", "--answer-tokens", "2", "--out", str(out)]
    assert script.main(args) == 0
    table = json.loads(out.read_text())
    assert list(table) == [f"{layer}-{head}" for layer in range(3) for head in range(4)]
    assert all(len(values) == 2 for values in table.values())
    means, _ = load_head_scores(str(out))
    assert int(means.argmax()) == 4  # "1-0"


def test_duo_pattern_is_in_the_released_format(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "pattern"
    script = load_script("estimate_duo_pattern", monkeypatch)
    args = ["--model", TINY, "--tiny-niah", "2", "--length", "256", "--sink-size", "4", "--recent-size", "32"]
    assert script.main([*args, "--out", str(out)]) == 0
    pattern = load_duo_pattern(str(out))
    assert pattern.gates.shape == (3, 2) and pattern.gates.max() == 1.0 and pattern.gates.min() >= 0
    assert (pattern.sink_size, pattern.recent_size) == (4, 32)
    assert "proxy" in json.loads((out / "config.json").read_text())["estimator"]
    assert script.main([*args, "--last-rows", "0", "--out", str(out)]) == 2  # bad input: exit 2, nothing written
