"""The performance bench's plumbing on the tiny model (timings themselves are not asserted: they belong to the
bench, not to unit tests): CSV columns, bytes accounting, tables with paper numbers beside ours, plots."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from kvbench import bench


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    plan = bench.preset("smoke")
    plan.micro_sizes = [64, 256]
    plan.peak_gbps = 10.0  # skip the bandwidth measurement
    bench.run_plan(plan, out, log=lambda line: None)
    return out


def _read(path: Path) -> list[dict[str, str]]:
    with open(path) as handle:
        return list(csv.DictReader(handle))


def test_bench_csv_has_every_cell_and_consistent_bytes(smoke_run: Path) -> None:
    rows = _read(smoke_run / "bench.csv")
    cells = {(r["backend"], r["method"]) for r in rows}
    assert cells == {("torch", "full"), ("torch", "snapkv"), ("paged", "full"), ("paged", "snapkv")}
    per_token = 16 * 2 * 4  # tiny: head_dim 16, K+V, float32
    for row in rows:
        assert float(row["prefill_s"]) > 0 and float(row["decode_ms_per_token"]) > 0
        assert float(row["decode_bandwidth_fraction"]) > 0
        kept = int(row["kept_tokens_final"])
        assert int(row["cache_bytes_final"]) == kept * per_token  # stored bytes: the same on every backend
        # what the backend holds per stored byte: pages add partly filled last pages and reserved decode headroom
        assert float(row["stored_bytes_ratio"]) >= 1.0
    by = {(r["backend"], r["method"]): r for r in rows}
    for backend in ("torch", "paged"):
        # snapkv at 32L on a 256-token context keeps 32 per stored head and layer (4 layers; its preset stores the
        # 4 query heads: query-head granularity, as the reference)
        stored = 4 if bench.load_method("snapkv").gqa_granularity == "query_head" else 2
        assert int(by[(backend, "snapkv")]["kept_tokens_after_prefill"]) == 32 * stored * 4
        assert int(by[(backend, "full")]["kept_tokens_after_prefill"]) == 256 * 2 * 4
        assert float(by[(backend, "full")]["prefill_vs_full"]) == 1.0


def test_micro_benchmarks_and_targets(smoke_run: Path) -> None:
    append = _read(smoke_run / "append.csv")
    assert {r["backend"] for r in append} == {"torch", "paged", "paged_growing"}
    for row in append:
        expected = (
            int(row["heads"])
            if row["backend"] != "torch"
            else int(row["heads"]) * (1 + int(row["cache_tokens_per_head"]))
        )
        assert int(row["rows_written_per_append"]) == expected
    stored = _read(smoke_run / "bytes.csv")
    uniform16 = [r for r in stored if r["page_size"] == "16" and r["allocation"] == "uniform"]
    assert all(float(r["ratio"]) == 1.0 for r in uniform16)  # budgets are multiples of the page size
    summary = json.loads((smoke_run / "summary.json").read_text())
    assert summary["targets"]["bytes_target_met (<= 1.02)"] is True


def test_tables_put_paper_numbers_beside_ours(smoke_run: Path) -> None:
    t13 = _read(smoke_run / "cake_t13.csv")
    paper_rows = [r for r in t13 if r["paper"]]
    assert len(paper_rows) == 80  # 5 lengths x 4 methods x 4 columns
    assert all(r["ours"].startswith("not measured") for r in paper_rows)  # no mistral-7b run on CPU
    ours = [r for r in t13 if not r["paper"]]
    assert ours and all("CPU-size config" in r["source"] for r in ours)
    xkv = _read(smoke_run / "xkv_t4.csv")
    full_gb = next(r for r in xkv if r["method"] == "FullKV" and r["column"] == "kv_cache_gb")
    assert float(full_gb["ours"]) == pytest.approx(8192 * 32 * 8 * 128 * 2 * 2 / 1e9, rel=1e-3)
    max_ctx = _read(smoke_run / "adakv_max_context.csv")
    full = {
        r["memory_limit_gb"]: int(r["max_context_tokens"])
        for r in max_ctx
        if r["arch"] == "mistral-7b" and r["method"] == "full"
    }
    compressed = {
        r["memory_limit_gb"]: int(r["max_context_tokens"])
        for r in max_ctx
        if r["arch"] == "mistral-7b" and r["method"] != "full"
    }
    assert compressed["80"] > full["80"] > 0
    for name in ("context_tiny.png", "append_scaling.png", "cake_t13.md"):
        assert (smoke_run / name).stat().st_size > 0


def test_random_model_has_the_real_architecture_shapes() -> None:
    """The 2-layer slice has Llama-3.1-8B's attention and MLP shapes (without building the 8B model)."""
    spec = bench.ARCHITECTURES["llama3.1-8b-2l"]
    assert (spec["hidden_size"], spec["num_attention_heads"], spec["num_key_value_heads"]) == (4096, 32, 8)
    model = bench.build_random_model("tiny", torch.device("cpu"), torch.float32)
    assert model.config.num_hidden_layers == 4
    weights = [p for n, p in model.named_parameters() if n.endswith("q_proj.weight")]
    assert 0.015 < float(weights[0].detach().std()) < 0.025  # N(0, 0.02), not uninitialised memory
