"""The wrappers over any scorer on SnapKV's presets (issue #41 item 3): ``method=snapkv_kvpress`` with
``method.params.allocation=ada_kvpress`` is kvpress's ``AdaKVPress(SnapKVPress())`` (leaderboard ``adakv_snapkv``),
``selection=chunkkv`` its ``ChunkKVPress(SnapKVPress())`` (``chunkkv``), ``rescale=critical row_reduce=mean`` its
``CriticalKVPress(SnapKVPress())`` (``criti_snapkv``), checked against the recorded kvpress 0.5.5 selections; each
in a results folder of its own, the presets without wrappers keeping their hash."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import kvbench
from kvbench.cli import main
from kvbench.errors import KVBenchError
from kvbench.methods.base import UniformHeadAllocator, build_method
from kvbench.methods.kvpress_ada import KvpressAdaAllocator
from kvbench.methods.snapkv import SnapKV
from kvbench.methods.wrappers import WRAPPER_DEFAULTS
from kvbench.storage.writers import KNOBS_GAINED_WITH_WRAPPERS, WRAPPER_KNOBS_OFF, config_hash
from kvbench.validation import validate
from tests.methods.helpers import method_from_yaml
from tests.methods.test_chunkkv import CHUNK, valid_chunk_choice
from tests.methods.test_criticalkv import tied_in, with_output_projection
from tests.methods.test_kvpress_ada import tied_layer_topk
from tests.methods.wrapper_replay import replay_kept, window_observation


def test_adakv_over_snapkv_preset_keeps_kvpress_tokens() -> None:
    method = method_from_yaml("snapkv_kvpress", window=16, allocation="ada_kvpress")
    assert isinstance(method.head_allocator, KvpressAdaAllocator) and isinstance(method.scorer, SnapKV)
    tally = replay_kept(method, "AdaKVPress_SnapKVPress", window_observation(16), valid=tied_layer_topk)
    assert tally.cases == 16 and tally.differ == 0 and tally.same > 0, tally


def test_chunkkv_over_snapkv_preset_keeps_kvpress_chunks() -> None:
    method = method_from_yaml("snapkv_kvpress", window=16, selection="chunkkv", selection_length=CHUNK)
    tally = replay_kept(method, "ChunkKVPress_SnapKVPress", window_observation(16), valid=valid_chunk_choice)
    assert tally.cases == 16 and tally.differ == 0 and tally.same > 0, tally


def test_criticalkv_over_snapkv_preset_keeps_kvpress_tokens() -> None:
    """kvpress's SnapKVPress averages the window rows; CriticalKV's rescaling is not scale-free, so
    ``row_reduce=mean`` is kvpress's ``CriticalKVPress(SnapKVPress())``."""
    method = method_from_yaml("snapkv_kvpress", window=16, rescale="critical", row_reduce="mean")
    observation = with_output_projection(window_observation(16))
    tally = replay_kept(method, "CriticalKVPress_SnapKVPress", observation, tied_in("CriticalKVPress"))
    assert tally.cases == 16 and tally.differ == 0 and tally.same > tally.tied_valid, tally


def test_presets_without_wrappers_are_unchanged_and_wrappers_name_their_folder() -> None:
    plain = method_from_yaml("snapkv_kvpress")
    assert isinstance(plain.head_allocator, UniformHeadAllocator) and plain.decode_policy is None
    assert plain.settings == {"gqa_reduce": "after_pool"}
    assert isinstance(plain.scorer, SnapKV) and plain.scorer.row_reduce == "sum"
    base = kvbench.compose_config(method="snapkv_kvpress", budget="64L")
    off = ["method.params.allocation=uniform", "method.params.selection=topk", "method.params.row_reduce=sum"]
    same = kvbench.compose_config(method="snapkv_kvpress", budget="64L", overrides=off)
    ada = kvbench.compose_config(method="snapkv_kvpress", budget="64L", overrides=["method.params.allocation=ada"])
    chunk = kvbench.compose_config(method="snapkv", budget="64L", overrides=["method.params.selection=chunkkv"])
    names = [cfg.method.name for cfg in (base, same, ada, chunk)]
    assert names == ["snapkv_kvpress", "snapkv_kvpress", "snapkv_kvpress+ada", "snapkv+chunkkv"]
    assert config_hash(base) == config_hash(same) != config_hash(ada)
    assert validate(ada)[0].settings == {"gqa_reduce": "after_pool", "allocation": "ada"}
    # the storage layer's copy of the knobs that were off before SnapKV had them
    assert WRAPPER_KNOBS_OFF == WRAPPER_DEFAULTS and KNOBS_GAINED_WITH_WRAPPERS == {"row_reduce": "sum"}


def test_wrappers_that_do_not_compose_and_families_with_allocators_are_refused() -> None:
    node = {"name": "s", "family": "snapkv", "params": {"selection": "chunkkv", "allocation": "ada_kvpress"}}
    with pytest.raises(ValueError, match="valid with it: allocation=uniform"):
        build_method(node)
    with pytest.raises(KVBenchError, match=r"method=cake: method.params.allocation=.ada. is not valid; valid: p2a"):
        validate(kvbench.compose_config(method="cake", budget="64L", overrides=["method.params.allocation=ada"]))
    with pytest.raises(KVBenchError, match=r"params.layers is not a parameter.*its parameters are: .*kernel_size"):
        kvbench.compose_config(method="pyramidkv", budget="64L", overrides=["method.params.layers=pyramid"])
    with pytest.raises(KVBenchError, match="a sweep over presets"):
        kvbench.compose_config(method="snapkv,snapkv_kvpress", budget="64L", overrides=["method.params.layers=pyramid"])


def run_py(monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    """``python run.py <args>`` in this process (:func:`kvbench.cli.main`, command-line preparation included); its
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
