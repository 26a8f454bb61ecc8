"""The wrappers over any scorer on SnapKV's presets (issues #41 item 3, #54 item 2): ``method=snapkv_kvpress`` plus a
kvpress wrapper knob is kvpress's composed press with no other knob -- ``allocation=ada_kvpress``
``AdaKVPress(SnapKVPress())``, ``selection=chunkkv`` ``ChunkKVPress``, ``selection=block`` ``BlockPress``,
``selection=chunk`` ``ChunkPress``, ``rescale=critical`` ``CriticalKVPress``, ``decode_interval`` the decoding
presses -- checked against kvpress 0.5.5's
recordings by ``tests/parity/test_kvpress_claims.py``; here: each in a results folder of its own, the presets without
wrappers keeping their hash, a wrapped one's hash new, and the compositions kvbench does not reproduce refused."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import kvbench
from kvbench.app.cli import main
from kvbench.app.validation import validate
from kvbench.errors import KVBenchError
from kvbench.eviction.base import UniformHeadAllocator, build_method
from kvbench.eviction.wrappers import WRAPPER_DEFAULTS
from kvbench.methods.snapkv import SnapKV
from kvbench.storage.writers import KNOBS_GAINED_WITH_WRAPPERS, WRAPPER_KNOBS_OFF, config_hash, scale_free_row_reduce
from tests.methods.helpers import method_from_yaml


def test_presets_without_wrappers_are_unchanged_and_wrappers_name_their_folder() -> None:
    plain = method_from_yaml("snapkv_kvpress")
    assert isinstance(plain.head_allocator, UniformHeadAllocator) and plain.decode_policy is None
    assert plain.settings == {"gqa_reduce": "after_pool", "row_reduce": "mean"}  # kvpress's SnapKVPress averages
    assert isinstance(plain.scorer, SnapKV) and plain.scorer.row_reduce == "mean"
    base = kvbench.compose_config(method="snapkv_kvpress", budget="64L")
    # The window's mean is its sum over 64 rows (a power of two): the same top-k, so the hash of before the knob
    off = ["method.params.allocation=uniform", "method.params.selection=topk", "method.params.row_reduce=sum"]
    same = kvbench.compose_config(method="snapkv_kvpress", budget="64L", overrides=off)
    ada = kvbench.compose_config(method="snapkv_kvpress", budget="64L", overrides=["method.params.allocation=ada"])
    chunk = kvbench.compose_config(method="snapkv", budget="64L", overrides=["method.params.selection=chunkkv"])
    names = [cfg.method.name for cfg in (base, same, ada, chunk)]
    assert names == ["snapkv_kvpress", "snapkv_kvpress", "snapkv_kvpress+ada", "snapkv+chunkkv"]
    assert config_hash(base) == config_hash(same) != config_hash(ada)
    assert validate(ada)[0].settings == {"gqa_reduce": "after_pool", "row_reduce": "mean", "allocation": "ada"}
    # the storage layer's copy of the knobs that were off before SnapKV had them
    assert WRAPPER_KNOBS_OFF == WRAPPER_DEFAULTS and KNOBS_GAINED_WITH_WRAPPERS == {"row_reduce": "sum"}


def test_a_wrapped_kvpress_preset_whose_predictions_changed_has_a_new_hash() -> None:
    """ChunkKV pads the window ``max + 1`` on the mean's scale, not the sum's: ``snapkv_kvpress+chunkkv`` keeps other
    tokens than before issue #54 (when the preset summed), so its hash is not the old spelling's."""
    chunk = ["method.params.selection=chunkkv"]
    new = kvbench.compose_config(method="snapkv_kvpress", budget="64L", overrides=chunk)
    old = kvbench.compose_config(
        method="snapkv_kvpress", budget="64L", overrides=[*chunk, "method.params.row_reduce=sum"]
    )
    assert config_hash(new) != config_hash(old)
    # the plain preset's mean ranks as the sum only for a window of a power of two (a window of 48 rounds otherwise)
    knobs = {"row_reduce": "mean", **WRAPPER_DEFAULTS}
    assert scale_free_row_reduce({"window": 64, "params": knobs})
    assert not scale_free_row_reduce({"window": 48, "params": knobs})
    assert not scale_free_row_reduce({"window": 64, "params": {**knobs, "selection": "chunkkv"}})
    assert scale_free_row_reduce({"window": 64, "params": {**knobs, "allocation": "ada_kvpress"}})  # ranks only


def test_wrappers_that_do_not_compose_and_families_with_allocators_are_refused() -> None:
    node = {"name": "s", "family": "snapkv", "params": {"selection": "chunkkv", "allocation": "ada_kvpress"}}
    with pytest.raises(ValueError, match="valid with it: allocation=uniform"):
        build_method(node)
    with pytest.raises(ValueError, match=r"DecodingPress over AdaKVPress.*does not reproduce it"):
        method_from_yaml("snapkv_kvpress", decode_interval=4, allocation="ada_kvpress")
    with pytest.raises(KVBenchError, match=r"method=cake: method.params.allocation=.ada. is not valid; valid: p2a"):
        validate(kvbench.compose_config(method="cake", budget="64L", overrides=["method.params.allocation=ada"]))
    with pytest.raises(KVBenchError, match=r"params.layers is not a parameter.*its parameters are: .*kernel_size"):
        validate(kvbench.compose_config(method="pyramidkv", budget="64L", overrides=["method.params.layers=pyramid"]))
    with pytest.raises(KVBenchError, match="a sweep over presets"):
        kvbench.compose_config(method="snapkv,snapkv_kvpress", budget="64L", overrides=["method.params.layers=pyramid"])


def run_py(monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    """``python run.py <args>`` in this process (:func:`kvbench.app.cli.main`, command-line preparation included); its
    exit status."""
    monkeypatch.setattr(sys, "argv", ["run.py", *args])
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.delenv("KVBENCH_DEBUG", raising=False)
    try:
        main()
    except SystemExit as exited:
        return int(exited.code or 0)
    return 0


def test_cli_runs_a_wrapped_preset_in_its_own_folder_and_refuses_a_conflicting_wrapper(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "runs"
    wrapped = ["method=snapkv_kvpress", "method.params.allocation=ada_kvpress", "budget=64L", "task.num_samples=1"]
    fast = ["task.lengths=[1024]", "task.datasets=[niah_single_1k]", "run.progress=false"]
    assert run_py(monkeypatch, *wrapped, *fast, f"run.output_root={root}") == 0
    folder = root / "tiny" / "tiny_niah" / "snapkv_kvpress+ada_kvpress" / "64L"
    meta = json.loads((folder / "run_meta.json").read_text())
    assert meta["end_time"] is not None and not (root / "tiny" / "tiny_niah" / "snapkv_kvpress").exists()
    assert (folder / "niah_single_1k" / "predictions.jsonl").read_text().count("\n") == 1
    capsys.readouterr()
    assert run_py(monkeypatch, "method=cake", "method.params.allocation=ada", f"run.output_root={root}") == 2
    stderr = capsys.readouterr().err
    assert "method.params.allocation='ada' is not valid; valid: p2a, uniform, pyramid, random" in stderr
    assert "Traceback" not in stderr
    refused = ["method=snapkv_kvpress", "method.params.decode_interval=4", "method.params.allocation=ada_kvpress"]
    assert run_py(monkeypatch, *refused, *fast[:1]) == 2
    stderr = capsys.readouterr().err
    assert "DecodingPress over AdaKVPress" in stderr and "does not reproduce it" in stderr and "Traceback" not in stderr
