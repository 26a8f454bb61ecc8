"""``scripts/train_kvzap.py`` and ``scripts/train_fastkvzip.py`` on the embedded model with a few texts: they write
checkpoints in the published formats that ``method=kvzap`` / ``method=fastkvzip`` read, marked as kvbench's own (the
shipped checkpoints are committed: CI never trains them; this only checks the scripts)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import torch

from kvbench.budget import parse_budget
from kvbench.eviction.base import build_method
from kvbench.inference.prefill import prefill
from tests.methods.test_kvzap import tiny_niah

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(name: str):
    sys.path.insert(0, str(SCRIPTS))  # train_fastkvzip imports train_kvzap, as when run from the command line
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kept_with(family: str, checkpoint: Path, **params) -> list[int]:
    model, _ = tiny_niah("float32")
    method = build_method({"name": family, "family": family, "params": {"checkpoint": str(checkpoint), **params}})
    ids = torch.randint(4, 503, (120,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        state = prefill(model, ids, method=method, budget=parse_budget("16L"))
    record = state.session.finish()
    assert record.evicted and record.learned_weights["path"] == str(checkpoint)
    return [sum(heads) for heads in record.achieved_per_head]


def test_train_kvzap_writes_both_surrogates_in_the_published_format(tmp_path: Path) -> None:
    script = load_script("train_kvzap")
    argv = ["--model", "tiny", "--out", str(tmp_path), "--texts", "2", "--tokens", "60", "--hidden-dim", "4",
            "--epochs", "1"]  # fmt: skip
    assert script.main(argv) == 0
    for model_type in ("linear", "mlp"):
        config = json.loads((tmp_path / model_type / "config.json").read_text())
        assert (config["n_modules"], config["input_dim"], config["output_dim"]) == (3, 128, 2)
        assert config["hidden_dim"] == (None if model_type == "linear" else 4)
        assert "NOT NVIDIA" in config["kvbench_training"]["by"]
        assert sum(kept_with("kvzap", tmp_path / model_type, model_type=model_type)) == 16 * 3 * 2


def test_train_fastkvzip_writes_gates_in_the_published_format(tmp_path: Path) -> None:
    script = load_script("train_fastkvzip")
    argv = ["--model", "tiny", "--out", str(tmp_path), "--texts", "2", "--tokens", "60", "--steps", "2"]
    assert script.main(argv) == 0
    gates = tmp_path / "q2_dim16_sink16.pt"
    saved = torch.load(gates, weights_only=True)
    assert len(saved["module"]) == 3 and saved["module"][0]["k_base"].shape == (2, 1, 16, 16)
    assert "NOT the authors'" in saved["kvbench_training"]["by"]
    assert sum(kept_with("fastkvzip", gates)) == 16 * 3 * 2
