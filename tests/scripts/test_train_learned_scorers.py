"""``scripts/train_kvzap.py``, ``train_fastkvzip.py`` and ``train_restorekv.py`` on the embedded model with a few
texts: they write checkpoints in the published formats that ``method=kvzap`` / ``fastkvzip`` / ``restorekv`` read,
marked as kvbench's own (the shipped checkpoints are committed: CI never trains them; this only checks the scripts)."""

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


def test_train_restorekv_writes_a_peft_adapter_and_restore_embeddings(tmp_path: Path) -> None:
    """A LoRA adapter (q/k/v/o_proj of every layer) and 8 restore embeddings that ``method=restorekv`` reads, the
    held-out distillation loss recorded; with it the tiny model keeps ``T H - n L H`` prompt tokens plus the restore
    tokens."""
    from kvbench.eviction.restore_weights import load_restore

    script = load_script("train_restorekv")
    argv = ["--model", "tiny", "--out", str(tmp_path), "--texts", "3", "--tokens", "80", "--epochs", "1"]
    assert script.main(argv) == 0
    weights = load_restore.__wrapped__(str(tmp_path))
    assert weights.embeddings.shape == (8, 128) and len(weights.lora) == 3 * 4 and weights.scaling == 2.0
    assert "NOT the authors'" in weights.provenance["training"]["by"]
    training = json.loads((tmp_path / "kvbench_training.json").read_text())
    assert training["held_out_kl_trained"] >= 0 and training["texts"] == 3
    model, tokenizer = tiny_niah("float32")
    method = build_method({"name": "restorekv", "family": "restorekv", "params": {"checkpoint": str(tmp_path)}})
    with torch.no_grad():
        state = prefill(model, list(range(4, 124)), method=method, budget=parse_budget("16L"), tokenizer=tokenizer)
    record = state.session.finish()
    assert record.learned_weights["path"] == str(tmp_path)
    kept = [sum(heads) for heads in record.achieved_per_head]  # KVzip's global choice: layers differ
    assert sum(kept) == 16 * 3 * 2 and min(kept) >= 8 * 2  # 16L, the 8 restore tokens per head within it
