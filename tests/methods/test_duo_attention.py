"""DuoAttention (kvbench/methods/duo_attention.py) against its recorded references: the original's head selection
(mit-han-lab/duo-attention ``sparsify_attention_heads``) and kvpress 0.5.5's ``DuoAttentionPress`` on the tiny Llama."""

from __future__ import annotations

import numpy as np
import pytest

from kvbench.methods.duo_attention import load_duo_pattern, retrieval_heads
from tests.methods.heads_replay import HEADS, kept_by_kvbench, model_layers, recording
from tests.methods.helpers import method_from_yaml, run_method


def duo_method(pattern: str, **params):
    return method_from_yaml("duo_attention", params={"pattern": str(HEADS / pattern), **params})


def test_head_selection_matches_the_original_and_kvpress() -> None:
    """Both rules give the recorded retrieval heads on every pattern and sparsity (the 4x4 pattern has tied gates,
    where the original's seeded noise and kvpress's argsort disagree with each other)."""
    cases = [c for c in recording("DuoAttention")["cases"] if c["kind"] == "head_selection"]
    assert len(cases) == 12
    rules_differ = 0
    for case in cases:
        gates = load_duo_pattern(str(HEADS / case["pattern"])).gates
        original = retrieval_heads(gates, case["sparsity"], "quantile", 42)
        kvpress = retrieval_heads(gates, case["sparsity"], "kvpress", None)
        assert original.astype(int).tolist() == case["original_retrieval"], case["sparsity"]
        assert kvpress.astype(int).tolist() == case["kvpress_retrieval"], case["sparsity"]
        rules_differ += case["original_retrieval"] != case["kvpress_retrieval"]
    assert rules_differ == 3  # 0.25, 0.5 and 0.6 on the tied 4x4 pattern


def test_kept_tokens_match_kvpress_on_the_tiny_llama() -> None:
    """Every layer and KV head keeps kvpress's positions, float32 and bfloat16, with the recorded sizes given
    explicitly and with the budget spelling them (budget = sinks + recent, recent_size null)."""
    cases = [c for c in recording("DuoAttention")["cases"] if c["kind"] == "model"]
    assert len(cases) == 12
    original_heads = {
        c["sparsity"]: c["original_retrieval"]
        for c in recording("DuoAttention")["cases"]
        if c["kind"] == "head_selection" and c["pattern"] == "duo_pattern_tiny_llama"
    }
    selections = 0
    for case in cases:
        sink, recent = case["sink_size"], case["recent_size"]
        explicit = duo_method(case["pattern"], sparsity=case["sparsity"], selection="kvpress", recent_size=recent)
        from_budget = duo_method(case["pattern"], sparsity=case["sparsity"], selection="kvpress")
        # The original's selection picks the same heads on this pattern (recorded), so it keeps the same tokens.
        assert original_heads[case["sparsity"]] == case["kvpress_retrieval"]
        original = duo_method(case["pattern"], sparsity=case["sparsity"], recent_size=recent)
        for layer, inputs in enumerate(model_layers(case["inputs"], case["dtype"])):
            queries = inputs["queries"][:, -32:]
            for method, budget in ((explicit, 64), (from_budget, sink + recent), (original, 64)):
                kept = kept_by_kvbench(method, layer, 2, queries, inputs["keys"], inputs["values"], budget)
                assert kept == [sorted(h) for h in case["kept"][layer]], (case["inputs"], case["sparsity"], layer)
                selections += len(kept)
    assert selections == 12 * 2 * 3 * 2


def test_budget_is_what_a_streaming_head_keeps() -> None:
    """Sinks from the pattern, the rest of the budget recent; retrieval heads whole (ragged per-head lengths)."""
    case = next(c for c in recording("DuoAttention")["cases"] if c["kind"] == "model" and c["inputs"].endswith("S128"))
    inputs = model_layers(case["inputs"], case["dtype"])[0]
    method = duo_method("duo_pattern_tiny_llama", sparsity=0.5)  # layer 0: head 0 retrieval, head 1 streaming
    kept = kept_by_kvbench(method, 0, 2, inputs["queries"][:, -32:], inputs["keys"], inputs["values"], 40)
    assert kept[0] == list(range(128))
    assert kept[1] == [0, 1, 2, 3, *range(128 - 36, 128)]


def test_pattern_errors_name_the_path_and_the_estimation_command(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"estimate_duo_pattern\.py"):
        duo_method("no_such_pattern")
    (tmp_path / "full_attention_heads.tsv").write_text("0.5\t0.5\n")
    with pytest.raises(ValueError, match=r"lacks \['config.json'\]"):
        method_from_yaml("duo_attention", params={"pattern": str(tmp_path)})
    method = duo_method("duo_pattern_4x4")  # 4 x 4: the tiny Llama has 2 x 2
    inputs = model_layers("model/sdpa/float32/S48", "float32")[0]
    with pytest.raises(ValueError, match="4 layers x 4 KV heads"):
        kept_by_kvbench(method, 0, 2, inputs["queries"][:, -32:], inputs["keys"], inputs["values"], 20)
    assert np.array_equal(
        load_duo_pattern(str(HEADS / "duo_pattern_tiny_llama")).gates, [[0.8125, 0.046875], [1, 0.3125]]
    )


def test_decode_eviction_rolls_the_streaming_heads_only(tiny_llama, tmp_path) -> None:
    """``method.decode_eviction: true`` (the original's streaming cache): while decoding, every streaming head stays
    at its sinks + recent, retrieval heads grow by one token a step; off (kvpress's), every head grows."""
    model, tokenizer = tiny_llama  # 4 layers x 2 KV heads
    (tmp_path / "full_attention_heads.tsv").write_text("0.9\t0.1\n0.2\t0.8\n0.7\t0.3\n0.4\t0.6\n")
    (tmp_path / "config.json").write_text('{"sink_size": 4, "recent_size": 16}')
    params = {"pattern": str(tmp_path), "sparsity": 0.5}
    rolling = run_method(
        model, tokenizer, method_from_yaml("duo_attention", decode_eviction=True, params=params), "40L"
    )
    growing = run_method(model, tokenizer, method_from_yaml("duo_attention", params=params), "40L")
    prompt, new = 320, 12
    retrieval = [[1, 0], [0, 1], [1, 0], [0, 1]]  # the higher gate of each layer (sparsity 0.5: 4 of 8 streaming)
    for layer, heads in enumerate(retrieval):
        assert rolling.record.achieved_per_head[layer] == [prompt if r else 40 for r in heads]
        final = [prompt + new - 1 if r else 40 for r in heads]  # the last generated token is never stored
        assert rolling.record.final_per_layer[layer] == round(sum(final) / 2)  # the mean over the layer's heads
    # Off: streaming heads grow from 40 like the retrieval heads (kvpress masks the prefill only).
    assert growing.record.final_per_layer == [round((prompt + new - 1 + 40 + new - 1) / 2)] * 4
