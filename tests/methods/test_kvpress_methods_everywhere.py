"""Issue #43's methods beyond their parity tests: batched decoding (``run.decode_batch``) gives batch 1's tokens and
cache records, sliding-window models compress their full-attention layers only, and the lm-eval bridge runs them.

The generic suites already cover part of it by reading the method registry: every family's default preset runs on
the sliding-window and hybrid models (``tests/models/test_sliding_models.py``) and end to end with sampled budgets
(``tests/end_to_end/test_methods_end_to_end.py``).  They do not cover batched decoding (a fixed list of the
papers' families), the wrappers (``selection``, ``rescale``, ``allocation=ada_kvpress``, ``decode_interval`` /
``decode_ratio``, PyramidKV's kvpress schedule) on a sliding model, nor any one-class method through lm-eval: this
file checks a fixed sample of that product (every #43 scorer once, each wrapper once), not all of it.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import kvbench
import kvbench.attention  # registers the "kvbench" attention
from kvbench.budget import parse_budget
from kvbench.eviction.base import build_method
from kvbench.eviction.kvpress_pyramid import kvpress_pyramid_budgets
from kvbench.models.loading import build_builtin
from tests.inference.test_batch_decode import _requests, assert_batched_equals_alone
from tests.methods.helpers import method_from_yaml
from tests.reference_recordings import kvpress_n_kept


def one_class(family: str, **params: Any) -> dict:
    """The config of a one-class method with ``params`` (wrappers included)."""
    return {"name": family, "family": family, "params": params}


#: Every scorer of #43 once, and each wrapper once over one of them (``pyramidkv_kvpress``: a YAML preset).
BATCHED = {
    "knorm": one_class("knorm"),
    "random": one_class("random", seed=0),  # seed null draws from the global generator: batch 1 then batched differ
    "keydiff+decode_interval": one_class("keydiff", decode_interval=3),
    "lagkv": one_class("lagkv", lag_size=16),  # the lag path at these prompt lengths (n_sink + 2 lag < S)
    "cur": one_class("cur"),
    "qfilter": one_class("qfilter"),
    "noncausal": one_class("noncausal", chunk_size=32),
    "expected_attention+ada_kvpress": one_class("expected_attention", epsilon=0.01, allocation="ada_kvpress"),
    "leverage": one_class("leverage"),
    "compactor": one_class("compactor", chunk_size=32),
    "observed_attention": one_class("observed_attention"),
    "knorm+chunkkv": one_class("knorm", selection="chunkkv", selection_length=8),
    "keydiff+critical": one_class("keydiff", rescale="critical"),
    "knorm+decode_ratio": one_class("knorm", decode_interval=2, decode_ratio=0.5),
    "pyramidkv_kvpress": "pyramidkv_kvpress",
}


def method_of(spec: dict | str):
    """A fresh method (decode policies keep per-sample state in their sessions, the recipe is shared)."""
    return method_from_yaml(spec, window=16) if isinstance(spec, str) else build_method(spec)


@pytest.fixture(scope="module")
def tiny_gqa():
    model, tokenizer = build_builtin("tiny-random-llama", seed=3)
    model.set_attn_implementation("kvbench")
    return model.eval(), tokenizer


@pytest.mark.parametrize("name", sorted(BATCHED))
def test_batched_decoding_equals_batch_one(tiny_gqa, name: str) -> None:
    """Three samples of different lengths decoded together (``decode_batch=3``) give each sample's batch-1 tokens,
    text, stop reason and cache record (kvpress's budget ``0.5cr``: half of each sample's context per layer)."""
    model, tokenizer = tiny_gqa
    method, budget = method_of(BATCHED[name]), parse_budget("0.5cr")
    requests = _requests(model.config.vocab_size, 3, stops={7})
    alone = assert_batched_equals_alone(model, tokenizer, method, budget, requests, "aware", 3, name, torch_seed=0)
    assert all(expected.record.evicted for expected in alone), name
    if "decode" in name:  # the interval policy cut the cache while decoding
        assert any(
            final < achieved + len(r.token_ids) - 1
            for r in alone
            for final, achieved in zip(r.record.final_per_layer, r.record.achieved_per_layer, strict=True)
        ), name


@pytest.mark.parametrize("arch", ["gemma2", "qwen2_hybrid"])
def test_wrappers_compress_full_attention_layers_only_on_sliding_models(arch: str) -> None:
    """The wrappers on a sliding-window and a hybrid model: sliding layers keep their window, every full-attention
    layer is compressed to what it requested (kvpress's ``max(1, int(S (1 - c)))`` where uniform)."""
    from transformers import AutoModelForCausalLM

    from tests.models.test_sliding_models import CONFIGS, PROMPT, SLIDING, WINDOW

    torch.manual_seed(0)
    built = AutoModelForCausalLM.from_config(CONFIGS[arch](), attn_implementation="eager").eval()
    ids = torch.tensor([PROMPT])
    wrappers = ("knorm+chunkkv", "keydiff+critical", "knorm+decode_ratio", "expected_attention+ada_kvpress")
    for name in (*wrappers, "pyramidkv_kvpress"):
        with kvbench.press(built, method_of(BATCHED[name]), parse_budget("0.5cr"), "aware") as record:
            built.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=0)
        last = record.last
        assert last.sliding_layers == SLIDING[arch], name
        assert last.compressible_layers == [i for i in range(len(last.achieved_per_head)) if i not in SLIDING[arch]]
        assert last.evicted and last.requested_per_head == last.achieved_per_head, name
        assert all(max(last.achieved_per_head[i]) <= WINDOW - 1 for i in last.sliding_layers), name
        kept, layers = kvpress_n_kept(len(PROMPT), 0.5), len(last.compressible_layers)
        requested = [last.requested_per_layer[i] for i in last.compressible_layers]
        if name == "pyramidkv_kvpress":  # kvpress's pyramid over the full-attention layers only (window 16 here)
            unrounded = len(PROMPT) * (1 - 0.5)  # kvpress's mean S (1 - c), before rounding
            assert requested == kvpress_pyramid_budgets(unrounded, 16, 20, layers, len(PROMPT)), requested
            assert requested[0] > requested[-1]
        elif name != "expected_attention+ada_kvpress":  # Ada-KV moves budget between heads, not layers
            assert requested == [kept] * layers, name


def test_one_class_methods_and_wrappers_run_through_lm_eval(tmp_path) -> None:
    """``--model kvbench --model_args method=<one-class method>[,method.params.<wrapper>=...]``: a class-only method
    is a preset of the bridge as of ``run.py``; each context compressed once at kvpress's budget, a wrapper applied
    (ChunkKV keeps whole chunks, the interval policy cuts while generating)."""
    pytest.importorskip("lm_eval")
    from kvbench.lmeval.model import KVBenchLM
    from kvbench.lmeval.tasks import task_manager
    from tests.lmeval.test_lmeval import MODEL, _evaluate, _write_tasks

    manager = task_manager(str(_write_tasks(tmp_path)), include_defaults=False)
    for method, overrides, task in [
        ("knorm", {"method.params.selection": "chunkkv", "method.params.selection_length": 4}, "kv_mc"),
        ("keydiff", {"method.params.decode_interval": 2}, "kv_gen"),
    ]:
        lm = KVBenchLM(pretrained=MODEL, method=method, budget="0.5cr", question_mode="agnostic", **overrides)
        _evaluate(lm, manager, tasks=[task])
        assert lm.records, method
        for record in lm.records:
            cache = record["cache"]
            assert cache["evicted"], method
            kept = kvpress_n_kept(cache["context_tokens"], 0.5)
            assert cache["requested_per_layer"] == [kept] * 4, method
            if task == "kv_mc":  # ChunkKV keeps max(1, int(n_chunks (1 - c))) whole chunks of 4 (the last partial)
                chunks = max(1, int(math.ceil(cache["context_tokens"] / 4) * 0.5))
                assert all(4 * chunks - 3 <= n <= 4 * chunks for n in cache["achieved_per_layer"]), cache
            else:  # the interval policy cut each layer while generating: never above the budget plus the interval
                assert all(n <= kept + 2 for n in cache["final_per_layer"]), (cache, record["new_tokens"])
