"""Decode-time policies and the paper-only methods against their references (kvbench issue #23).

* Short prompt, long generation: the cache grows to the budget, then evicts (H2O, TOVA, AhaKV, StreamingLLM, CAKE
  all let the cache reach B first); measured step by step.
* TOVA as ``src/tova_cache.py``: in tests/methods/test_tova.py.
* AhaKV: ``lambda_i`` readings; decoding honours ``gqa_agg``; recorded settings list only the knobs a method uses.
* XKV: the sampled-mode calibration is replayed on resume (identical predictions); the window counts once.
* Paper presets run their baselines with the settings that paper's runs used.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from kvbench.app.validation import validate_run
from kvbench.cache.kv_cache import KVBenchCache
from kvbench.eviction.decoding import padded_decode_attention
from kvbench.methods.ahakv import AhaScorer, sg_multiplier
from tests.methods.helpers import method_from_yaml, run_method, with_step_hook

CONF = Path(__file__).resolve().parents[2] / "conf"


def _lengths_per_step(method):
    """The method with its decode policy observed: layer 0's per-head lengths after every step."""
    seen: list[list[int]] = []

    def after(layer_idx, layer, state):
        if layer_idx == 0:
            seen.append(layer.head_lengths())

    return with_step_hook(method, after), seen


# ------------------------------------------------------------------------------------------ cap = budget
@pytest.mark.parametrize("name", ["streamingllm", "h2o", "tova", "ahakv", "cake"])
def test_the_cache_grows_to_the_budget_before_decoding_evicts(tiny_llama, name: str) -> None:
    """Prompt 100 tokens, budget 120 per layer, 40 new tokens: 101, 102, ... 120, 120, 120 (not 100 throughout)."""
    model, tokenizer = tiny_llama
    method = method_from_yaml(name)
    method, seen = _lengths_per_step(method)
    out = run_method(model, tokenizer, method, "120L", context=80, new=40)  # 80 context + 20 question tokens
    assert not out.record.evicted  # the prompt fits the budget: nothing is evicted at prefill
    assert out.record.decode_cap_per_layer == [120] * 4
    per_step = [max(heads) for heads in seen]
    assert per_step[:20] == list(range(101, 121))
    assert per_step[20:] == [120] * (len(per_step) - 20)


def test_cake_below_its_trigger_decodes_at_the_layer_budget(tiny_llama) -> None:
    """S = 140 <= C + 32 = 152: no prefill eviction (the code's trigger), then decoding caps every layer at C."""
    model, tokenizer = tiny_llama
    method = method_from_yaml("cake")
    method, seen = _lengths_per_step(method)
    out = run_method(model, tokenizer, method, "120L", context=120, new=6)
    assert not out.record.evicted and out.record.achieved_per_layer == [140] * 4
    assert out.record.decode_cap_per_layer == [120] * 4
    assert [max(heads) for heads in seen] == [120] * len(seen)


# ------------------------------------------------------------------------------------------ AhaKV
def test_ahakv_lambda_i_readings() -> None:
    gen = torch.Generator().manual_seed(6)
    keys, queries = torch.randn(2, 50, 8, generator=gen), torch.randn(4, 50, 8, generator=gen)
    method = method_from_yaml("ahakv_no_ra")
    assert method.settings["lambda_i"] == "total"
    scorer: AhaScorer = method.scorer
    total = scorer.row_attention(queries, keys, 8**-0.5, 20)
    # Manual: every row uses i = 50 (the prompt length), whatever its position.
    factor = float(sg_multiplier(torch.tensor([50]), 20, 8, "unscaled", 1e-3))
    expanded = keys.repeat_interleave(2, dim=0)
    raw = queries @ expanded.transpose(1, 2) * 8**-0.5 * factor
    raw = raw.masked_fill(torch.triu(torch.ones(50, 50, dtype=torch.bool), 1)[None], float("-inf"))
    torch.testing.assert_close(total, torch.softmax(raw, -1).sum(dim=1), rtol=1e-5, atol=1e-6)
    row = method_from_yaml("ahakv_no_ra", params={"lambda_i": "row"}).scorer.row_attention(queries, keys, 8**-0.5, 20)
    assert not torch.allclose(row, total)  # early rows (i <= k) get a near-uniform softmax under "row"


def test_decode_attention_reduces_groups_with_gqa_agg() -> None:
    gen = torch.Generator().manual_seed(8)
    cache = KVBenchCache(1)
    keys = torch.randn(1, 2, 10, 8, generator=gen)
    cache.update(keys, keys.clone(), 0)
    layer = cache.headwise_layers[0]
    query = torch.randn(4, 1, 8, generator=gen)
    per_query = torch.stack([torch.softmax(query[h, 0] @ keys[0, h // 2].T * 0.5, -1) for h in range(4)])
    for how, reduce in (("mean", lambda x: x.mean(0)), ("max", lambda x: x.amax(0)), ("sum", lambda x: x.sum(0))):
        got, _ = padded_decode_attention(layer, query, 0.5, how)  # [H, S]: every head holds all 10 tokens
        for head in range(2):
            torch.testing.assert_close(got[head], reduce(per_query[2 * head : 2 * head + 2]))
    assert method_from_yaml("ahakv", gqa_agg="max").decode_policy.gqa_agg == "max"


@pytest.mark.parametrize(
    ("name", "absent"),
    [
        ("ahakv", {"kernel_size", "pooling", "pool_padding"}),  # AhaKV rounds as score_dtype says (issue #28)
        ("tova", {"kernel_size", "pooling", "pool_padding", "gqa_agg"}),
        ("streamingllm", {"kernel_size", "pooling", "gqa_agg"}),  # the window sizes its protected recent tokens
        ("h2o", {"pooling", "pool_padding"}),
        ("full", {"window", "kernel_size", "pooling", "gqa_agg", "decode_eviction"}),
    ],
)
def test_recorded_settings_list_only_the_knobs_a_method_uses(tmp_path: Path, name: str, absent: set[str]) -> None:
    from hydra import compose, initialize_config_dir

    from kvbench.config import register_configs
    from kvbench.run.runner import Runner

    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"method={name}", "budget=64L" if name != "full" else "budget=full",
                                           "task.lengths=[1024]", "task.num_samples=1",
                                           "task.datasets=[niah_single_1k]", f"run.output_root={tmp_path}",
                                           "run.progress=false", "run.print_table=false"])  # fmt: skip
    Runner(validate_run(cfg)).run()
    metrics = json.loads(next(tmp_path.rglob("metrics.json")).read_text())
    assert not absent & set(metrics["settings"]), metrics["settings"]
    assert "reference" in metrics["settings"]


# ------------------------------------------------------------------------------------------ XKV
def _xkv_cfg(tmp_path: Path, extra: list[str]):
    from hydra import compose, initialize_config_dir

    from kvbench.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=["method=xkv_sampled", "budget=64L", "task.lengths=[1024]",
                                            "task.num_samples=4", "task.datasets=[niah_multikey_1k]",
                                            "method.params.sample_ratio=0.5", f"run.output_root={tmp_path}",
                                            "run.progress=false", "run.print_table=false", *extra])  # fmt: skip


def test_xkv_sampled_resume_replays_the_calibration(tmp_path: Path) -> None:
    """Kill after one of the two calibration samples, resume: predictions byte-identical to an uninterrupted run."""
    from kvbench.run.runner import Runner

    Runner(validate_run(_xkv_cfg(tmp_path / "a", []))).run()
    full = next((tmp_path / "a").rglob("predictions.jsonl"))
    rows = full.read_text().splitlines()
    states = [json.loads(r)["cache"]["allocator_state"] for r in rows]
    assert [s is not None for s in states] == [True, True, False, False]  # 2 calibrate, 2 reuse their average
    # The interrupted run: only the first prediction was written when it died.
    Runner(validate_run(_xkv_cfg(tmp_path / "b", []))).run()
    part = next((tmp_path / "b").rglob("predictions.jsonl"))
    part.write_text(rows[0] + "\n")
    for name in ("metrics.json", "timings.jsonl"):
        for path in (tmp_path / "b").rglob(name):
            path.unlink()
    Runner(validate_run(_xkv_cfg(tmp_path / "b", []))).run()
    resumed = part.read_text().splitlines()
    strip = [json.dumps({k: v for k, v in json.loads(r).items() if k != "timing"}) for r in resumed]
    expected = [json.dumps({k: v for k, v in json.loads(r).items() if k != "timing"}) for r in rows]
    assert strip == expected


def test_xkv_window_out_of_budget_counts_once() -> None:
    from tests.methods.test_cake import _prefill_layers, _random_layers

    layers = _random_layers(5, 4, context=120)
    method = method_from_yaml("xkv", window_in_budget=False)
    _, session = _prefill_layers(method, "40L", layers)
    assert sum(session.record.requested_per_layer) == (40 + 8) * 5  # B_total + L x ows, not + 2 L x ows


# ------------------------------------------------------------------------------------------ paper presets
def test_xkv_table_runs_every_baseline_as_pyramidkv_s_runner() -> None:
    preset = yaml.safe_load((CONF / "experiment" / "xkv_t3.yaml").read_text())
    assert preset["method"] == {"params": {"window": 8, "decode_eviction": False}}
