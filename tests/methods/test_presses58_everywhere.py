"""Issue #58's presses beyond their parity tests: batched decoding (``run.decode_batch``) gives batch 1's tokens and
cache records, and the lm-eval bridge runs them (sliding-window and hybrid models: the generic suite
``tests/models/test_sliding_models.py`` runs every family, DMS at a threshold)."""

from __future__ import annotations

from typing import Any

import pytest

from kvbench.budget import parse_budget
from kvbench.eviction.base import build_method
from tests.inference.test_batch_decode import _requests, assert_batched_equals_alone
from tests.methods.test_kvpress_methods_everywhere import tiny_gqa  # noqa: F401  (the module's model fixture)


def config(family: str, **params: Any) -> dict:
    return {"name": family, "family": family, "params": params}


#: Each new family once (DMS while decoding too), at a budget of its form.
CASES = {
    "dms": (config("dms", sliding_window_size=16), "1e9thr"),
    "dms+decoding": (config("dms", sliding_window_size=16, decoding=True), "-0.5thr"),
    "merging": (config("merging", press="keydiff"), "0.5cr"),
    "composed": (config("composed", stages=["keydiff", "knorm"], ratios=[0.25]), "0.5cr"),
    "per_layer": (config("per_layer", compression_ratios=[0.1, 0.3, 0.5, 0.7]), "0.4cr"),
    # seed: each sample's own generator (kvpress's global one draws in another order when samples decode together)
    "cam": (config("cam", compression_interval=2, target_size=24, merge_budget=4, seed=0), "0.5cr"),
    "entropy_chunkkv": (config("entropy_chunkkv", press="keydiff", chunk_length=8), "0.5cr"),
    "lukv": (config("lukv", press="keydiff"), "0.5cr"),
    "cap": (config("cap"), "0.5cr"),
    "kvcompose+unstructured": (config("kvcompose", structured=False), "0.5cr"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_batched_decoding_equals_batch_one(tiny_gqa, name: str) -> None:  # noqa: F811
    """Three samples of different lengths decoded together (``decode_batch=3``) give each sample's batch-1 tokens,
    text, stop reason and cache record (per head: DMS's counts differ by head)."""
    model, tokenizer = tiny_gqa
    spec, budget_spec = CASES[name]
    method, budget = build_method(spec), parse_budget(budget_spec)
    requests = _requests(model.config.vocab_size, 3, stops={7})
    alone = assert_batched_equals_alone(model, tokenizer, method, budget, requests, "agnostic", 3, name)
    assert all(expected.record.evicted for expected in alone), name
    if name == "cam":  # compressed to 24 while decoding, values merged
        assert all(max(r.record.final_per_layer) <= 24 + 1 for r in alone), name
    if name == "dms+decoding":  # heads differ; tokens leaving the window were evicted while decoding too
        assert any(len(set(heads)) > 1 for r in alone for heads in r.record.achieved_per_head), name
        appended = [len(r.question_ids) + len(out.token_ids) - 1 for r, out in zip(requests, alone, strict=True)]
        assert any(
            final < achieved + added
            for out, added in zip(alone, appended, strict=True)
            for final, achieved in zip(out.record.final_per_layer, out.record.achieved_per_layer, strict=True)
        ), name


def test_threshold_and_merging_methods_run_through_lm_eval(tmp_path) -> None:
    """``--model kvbench --model_args method=dms,budget=<t>thr`` and ``method=merging``: each context compressed once,
    the threshold's kept count recorded as what it requested."""
    pytest.importorskip("lm_eval")
    from kvbench.lmeval.model import KVBenchLM
    from kvbench.lmeval.tasks import task_manager
    from tests.lmeval.test_lmeval import MODEL, _evaluate, _write_tasks

    manager = task_manager(str(_write_tasks(tmp_path)), include_defaults=False)
    for method, budget, overrides in [
        ("dms", "1e9thr", {"method.params.sliding_window_size": 4}),
        ("merging", "0.5cr", {}),
    ]:
        lm = KVBenchLM(pretrained=MODEL, method=method, budget=budget, question_mode="agnostic", **overrides)
        _evaluate(lm, manager, tasks=["kv_gen"])
        assert lm.records, method
        for record in lm.records:
            cache = record["cache"]
            assert cache["evicted"] and cache["requested_per_head"] == cache["achieved_per_head"], method
            if method == "dms":  # everything but the 4-token window scores below 1e9
                assert all(n == min(4, cache["context_tokens"]) for n in cache["achieved_per_layer"]), cache
