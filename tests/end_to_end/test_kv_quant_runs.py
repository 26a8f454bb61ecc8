"""The issue #59 acceptance runs, shortened: ``method=snapkv budget=0.5x kv_quant=kivi4`` and ``method=full
kv_quant=kivi2`` (with the unquantized full cache beside them) on the embedded default (tiny model, tiny_niah, here 2
samples of 512 tokens), through the runner.  Their folders are ``<budget>+<kv_quant>``; ``metrics.json`` names the
variant and its settings; the full cache's stored bytes per sample equal docs/kv_quant.md's formula computed from
the prompt length alone (nothing evicted), and every ``metrics.json`` mean is the mean of its rows; the results
page's headline chart places both runs by their stored bytes, the frontier through them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from kvbench.api import compose_config
from kvbench.app.validation import validate_run
from kvbench.reporting.dashboard_data import load_dashboard_runs
from kvbench.reporting.pivot import headline, pivots
from kvbench.run.runner import Runner

SHORT = ["task.num_samples=2", "task.lengths=[512]", "run.progress=false", "run.print_table=false"]


def full_kivi2_bytes(context: int, kv_heads: int = 2, layers: int = 3, dim: int = 32) -> int:
    """docs/kv_quant.md's formula for a full cache of ``context`` tokens under kivi2 (G 32, R 128, float32)."""
    key_quantized, value_quantized = context // 128 * 128, max(0, context - 128)
    per_head = math.ceil(2 * key_quantized * dim / 8) + math.ceil(2 * value_quantized * dim / 8)
    per_head += 2 * 4 * (dim * key_quantized // 32 + value_quantized * dim // 32)
    per_head += (2 * context - key_quantized - value_quantized) * dim * 4
    return per_head * kv_heads * layers


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("kvq") / "runs"
    for method, budget, quant in (("snapkv", "0.5x", "kivi4"), ("full", "64L", "kivi2"), ("full", "full", "none")):
        cfg = compose_config(method=method, budget=budget, overrides=[*SHORT, f"kv_quant={quant}"])
        cfg.run.output_root = str(root)
        Runner(validate_run(cfg)).run()
    return root


def dataset_files(folder: Path) -> list[tuple[dict, list[dict]]]:
    out = []
    for metrics_path in sorted(folder.glob("*/metrics.json")):
        rows = [json.loads(line) for line in (metrics_path.parent / "predictions.jsonl").read_text().splitlines()]
        out.append((json.loads(metrics_path.read_text()), rows))
    return out


def test_folders_metrics_and_bytes(runs: Path) -> None:
    base = runs / "tiny" / "tiny_niah"
    assert sorted(p.name for p in (base / "snapkv").iterdir()) == ["ratio0.5+kivi4"]
    assert sorted(p.name for p in (base / "full").iterdir()) == ["64L+kivi2", "full"]
    for folder, quant in ((base / "snapkv" / "ratio0.5+kivi4", "kivi4"), (base / "full" / "64L+kivi2", "kivi2")):
        assert OmegaConf.load(folder / "config.yaml").kv_quant.name == quant
        for metrics, rows in dataset_files(folder):
            assert metrics["kv_quant"] == quant and metrics["settings"]["kv_quant"]["scheme"] == "kivi"
            stored = [row["cache"]["stored_bytes"] for row in rows]
            assert metrics["cache"]["mean_stored_bytes"] == pytest.approx(sum(stored) / len(stored), abs=0.1)
            assert all(row["cache"]["stored_bytes"] < row["cache"]["full_cache_bytes"] for row in rows)
            if quant == "kivi2":  # nothing evicted: the formula from the prompt length alone
                assert stored == [full_kivi2_bytes(row["cache"]["context_tokens"]) for row in rows]
    for metrics, _ in dataset_files(base / "full" / "full"):
        assert "kv_quant" not in metrics and "kv_quant" not in metrics["settings"]  # unquantized: as before #59


def test_headline_places_both_runs_by_their_bytes(runs: Path) -> None:
    """Each run is one point at its stored-bytes fraction (the mean of its datasets' ``mean_stored_vs_full``); the
    memory frontier runs through the chart's points (the full cache at 1)."""
    dashboard = load_dashboard_runs(runs)
    [chart] = headline(pivots(dashboard))
    series = {s["method"]: s["points"] for s in chart["series"]}
    assert set(series) == {"snapkv+kivi4", "full+kivi2"} and chart["full"] is not None
    base = runs / "tiny" / "tiny_niah"
    for method, folder in (
        ("snapkv+kivi4", base / "snapkv" / "ratio0.5+kivi4"),
        ("full+kivi2", base / "full" / "64L+kivi2"),
    ):
        fractions = [metrics["cache"]["mean_stored_vs_full"] for metrics, _ in dataset_files(folder)]
        [point] = series[method]
        assert point["x"] == pytest.approx(sum(fractions) / len(fractions)) and 0 < point["x"] < 1
    points = {(p["x"], p["y"]) for s in chart["series"] for p in s["points"]} | {(1.0, chart["full"]["y"])}
    frontier = chart["frontier"]["aware"]
    assert frontier and {(p["x"], p["y"]) for p in frontier} <= points
    assert [p["x"] for p in frontier] == sorted(p["x"] for p in frontier)


def test_evaluate_takes_a_kv_quant_preset(tmp_path: Path) -> None:
    """``kvbench.evaluate(model, tokenizer, ..., kv_quant="kivi4")`` on a model of one's own: the same folder naming."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import kvbench
    from kvbench.resources import models_dir

    folder = models_dir() / "tiny-niah"
    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    evaluation = kvbench.evaluate(
        model,
        tokenizer,
        method="snapkv",
        budget="0.5x",
        limit=1,
        kv_quant="kivi4",
        output_dir=tmp_path,
        overrides=["task.lengths=[512]", "task.datasets=[niah_single_512]"],
        progress=False,
    )
    assert evaluation.folder is not None and evaluation.folder.name == "ratio0.5+kivi4"
    assert evaluation.config.kv_quant.scheme == "kivi"
