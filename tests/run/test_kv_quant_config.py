"""The ``kv_quant`` axis in configs, folders and results (issue #59): ``none`` leaves every config hash and results
folder as they were; a quantized run gets its own hash and the folder leaf ``<budget>+<kv_quant>``; bad values fail
clean (exit 2, the bad value and the valid ones named, before the model loads); the results views name the variant
``<method>+<kv_quant>`` and the headline chart's memory frontier places it by its stored bytes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

import kvbench
from kvbench.reporting.aggregate import metrics_to_row
from kvbench.reporting.pivot import headline, memory_frontier
from kvbench.storage.paths import run_folder
from kvbench.storage.writers import config_hash, run_dir
from tests.bad_input.test_bad_input import assert_clean_failure, no_weights, run_in_process, tree_hash

CONFIGS = [("snapkv", "64L", "tiny_niah"), ("full", "full", "longbench"), ("cake", "128L", "ruler")]


@pytest.mark.parametrize(("method", "budget", "task"), CONFIGS)
def test_none_keeps_hashes_and_folders(method: str, budget: str, task: str) -> None:
    """The default (``kv_quant=none``) hashes and files as a config without the node (the layout before #59)."""
    cfg = kvbench.compose_config(method=method, budget=budget, task=task)
    assert cfg.kv_quant.scheme == "none"
    before = OmegaConf.create({k: v for k, v in OmegaConf.to_container(cfg).items() if k != "kv_quant"})
    assert config_hash(cfg) == config_hash(before)
    assert run_folder(cfg) == run_dir(cfg.run.output_root, cfg.model.name, task, cfg.method.name, cfg.budget.name, None)


def test_quantized_runs_get_their_own_hash_and_folder() -> None:
    plain = kvbench.compose_config(method="snapkv", budget="0.5x")
    kivi4 = kvbench.compose_config(method="snapkv", budget="0.5x", overrides=["kv_quant=kivi4"])
    kivi2 = kvbench.compose_config(method="snapkv", budget="0.5x", overrides=["kv_quant=kivi2"])
    tagged = kvbench.compose_config(method="snapkv", budget="0.5x", overrides=["kv_quant=kivi4", "run.tag=x"])
    assert len({config_hash(c) for c in (plain, kivi4, kivi2)}) == 3
    assert run_folder(plain).name == "ratio0.5"
    assert run_folder(kivi4).name == "ratio0.5+kivi4" and run_folder(tagged).name == "ratio0.5+kivi4~x"
    assert run_folder(kivi4).parent == run_folder(plain).parent


BAD = [
    (["kv_quant=nope"], ["kv_quant", "'nope'", "kivi4"]),
    (["kv_quant=kivi4", "kv_quant.nbits=3"], ["kv_quant.nbits=3", "2, 4, 8"]),
    (["kv_quant=quanto4", "kv_quant.nbits=8"], ["kv_quant.nbits=8", "2, 4"]),
    (["kv_quant=kivi4", "kv_quant.residual_length=100"], ["kv_quant.residual_length=100", "multiple of"]),
    (["kv_quant=hqq4", "kv_quant.axis_key=-1"], ["kv_quant.axis_key=-1", "0, 1"]),
    (["kv_quant=quanto4", "kv_quant.flush_rule=4.0"], ["kv_quant.flush_rule='4.0'", "5.23, 5.2"]),
    (["kv_quant.scheme=fp8"], ["kv_quant.scheme='fp8'", "none, kivi, quanto, hqq"]),
    (["kv_quant=kivi4", "kv_quant.name=a/b"], ["kv_quant.name='a/b'", "folder name"]),
    (["method=think", "kv_quant=kivi4"], ["kv_quant=kivi4 does not compose", "'think'", "kv_quant=none"]),
]


@pytest.mark.parametrize(("overrides", "expected"), BAD, ids=lambda case: " ".join(case))
def test_bad_kv_quant_fails_clean(tmp_path: Path, capsys, monkeypatch, overrides, expected) -> None:
    import kvbench.run.runner

    monkeypatch.setattr(kvbench.run.runner, "load_model", no_weights)
    root = tmp_path / "runs"
    root.mkdir()
    before = tree_hash(root)
    code, stderr = run_in_process([*overrides, f"run.output_root={root}"], capsys)
    assert_clean_failure(code, stderr, expected)
    assert tree_hash(root) == before


def test_views_name_the_variant_and_the_frontier_places_it_by_bytes() -> None:
    base = {"model": "m", "task": "t", "dataset": "d", "budget": "ratio0.5", "score": 1.0, "cache": {}}
    assert metrics_to_row({**base, "method": "snapkv"})["method"] == "snapkv"
    row = metrics_to_row({**base, "method": "snapkv", "kv_quant": "kivi4"})
    assert (row["method"], row["kv_quant"]) == ("snapkv+kivi4", "kivi4")

    def table(rows: dict[str, dict[str, tuple[float, float]]]) -> dict:
        cells = {
            method: {
                b: {"mean": y, "ci95": None, "small_n": False, "stored_fraction": x, "datasets": ["d"]}
                for b, (x, y) in by_budget.items()
            }
            for method, by_budget in rows.items()
        }
        budgets = sorted({b for by_budget in rows.values() for b in by_budget})
        return {
            "model": "m",
            "task": "t",
            "question_mode": "aware",
            "budgets": [{"budget": b} for b in budgets],
            "full": {"mean": 80.0, "ci95": None},
            "rows": [{"method": m, "label": m, "colour": "#000", "tag": "", "cells": c} for m, c in cells.items()],
        }

    rows = {
        "snapkv": {"ratio0.25": (0.25, 60.0), "ratio0.5": (0.5, 75.0)},
        "snapkv+kivi4": {"ratio0.25": (0.08, 58.0), "ratio0.5": (0.15, 74.0)},
        "full+kivi2": {"full": (0.18, 70.0)},
    }
    [chart] = headline([table(rows)])
    assert {s["method"] for s in chart["series"]} == set(rows)
    frontier = [(p["label"], p["x"]) for p in chart["frontier"]["aware"]]
    # full+kivi2 (0.18 stored, 70) is beaten by snapkv+kivi4 at 0.15 (74): off the frontier
    assert frontier == [("snapkv+kivi4", 0.08), ("snapkv+kivi4", 0.15), ("snapkv", 0.5), ("full cache", 1.0)]
    assert memory_frontier(chart["series"], "agnostic") == []


def test_group_size_the_model_cannot_take_fails_before_any_file(tmp_path: Path, capsys) -> None:
    """KIVI's value groups must divide the head dim (the tiny model's is 32): refused once the model's shape is known,
    before the run writes anything."""
    root = tmp_path / "runs"
    overrides = [
        "kv_quant=kivi4",
        "kv_quant.group_size=64",
        "kv_quant.residual_length=128",
        "task.num_samples=1",
        "run.progress=false",
        f"run.output_root={root}",
    ]
    code, stderr = run_in_process(overrides, capsys)
    stderr = stderr[stderr.index("error: ") :]  # after the progress bars of the data preparation and model loading
    assert_clean_failure(code, stderr, ["kv_quant.group_size=64", "head dim 32"])
    assert not any(path.is_file() for path in root.rglob("*")) if root.exists() else True


def test_wandb_names_the_variant() -> None:
    """W&B's run name and report panels name a quantized run as the views do; an unquantized run as before."""
    from kvbench.run.wandb_logging import panel_fields, run_name

    plain = kvbench.compose_config(method="snapkv", budget="0.5x")
    kivi4 = kvbench.compose_config(method="snapkv", budget="0.5x", overrides=["kv_quant=kivi4"])
    assert (
        run_name(plain) == "tiny-snapkv-ratio0.5-tiny_niah"
        and run_name(kivi4) == "tiny-snapkv-ratio0.5+kivi4-tiny_niah"
    )
    assert (panel_fields(plain, {})["method"], panel_fields(plain, {})["kv_quant"]) == ("snapkv", "none")
    panel = panel_fields(kivi4, {"stored_fraction": 0.3})
    assert (panel["method"], panel["kv_quant"], panel["stored_fraction"]) == ("snapkv+kivi4", "kivi4", 0.3)
    assert panel["group"] == "snapkv+kivi4 · aware"
