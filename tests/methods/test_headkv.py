"""HeadKV (kvbench/methods/headkv.py) against FYYFU/HeadKV's ``ReasonSnapKVCluster`` as recorded on seeded tensors and
the tiny Llama, float32 and bfloat16."""

from __future__ import annotations

import pytest
import torch

from kvbench.methods.headkv import head_capacities, head_shares, load_head_scores
from tests.methods.heads_replay import HEADS, kept_by_kvbench, model_layers, recording, tensor_queries
from tests.methods.helpers import method_from_yaml
from tests.reference_recordings import DTYPES, stored_input

SCORES = str(HEADS / "headkv_scores_tiny_llama.json")
WINDOW = 8


def case_layers(case: dict) -> list[dict[str, torch.Tensor]]:
    """Per layer: queries ``[H_q, S, D]`` and keys/values repeated to the query heads, as the reference sees them."""
    if case["kind"] == "model":
        layers = model_layers(case["inputs"], case["dtype"])
    else:
        length = int(case["inputs"].rsplit("/S", 1)[1])
        dtype = DTYPES[case["dtype"]]
        layers = [{
            "queries": tensor_queries(length, case["dtype"]),
            "keys": stored_input(f"tensor/keys_S{length}")[0].to(dtype),
            "values": stored_input(f"tensor/values_S{length}")[0].to(dtype),
        }]  # fmt: skip
    for layer in layers:
        layer["keys"] = layer["keys"].repeat_interleave(2, dim=0)
        layer["values"] = layer["values"].repeat_interleave(2, dim=0)
    return layers


def test_head_capacities_match_the_reference() -> None:
    shares = head_shares(load_head_scores(SCORES)[0], 1.0)
    for case in recording("HeadKV")["cases"]:
        capacities = head_capacities(shares, case["capacity"] - WINDOW, case["beta"], 2, 4)
        assert capacities.tolist() == case["head_capacity"], (case["capacity"], case["beta"])


def test_kept_tokens_match_the_reference() -> None:
    """Every recorded case (tensor and model, float32 and bfloat16, three budgets, two betas): each query head keeps
    the reference's positions."""
    cases = recording("HeadKV")["cases"]
    assert len(cases) == 60
    selections = 0
    for case in cases:
        method = method_from_yaml("headkv", params={"head_scores": SCORES, "beta": case["beta"]})
        for layer, inputs in enumerate(case_layers(case)):
            queries = inputs["queries"][:, -WINDOW:]
            kept = kept_by_kvbench(method, layer, 2, queries, inputs["keys"], inputs["values"], case["capacity"])
            where = (case["kind"], case["inputs"], case["dtype"], case["capacity"], case["beta"], layer)
            assert kept == [sorted(h) for h in case["kept"][layer]], where
            selections += len(kept)
    assert selections == (36 * 1 + 24 * 2) * 4


def test_head_scores_must_fit_the_model() -> None:
    method = method_from_yaml("headkv", params={"head_scores": SCORES})
    inputs = case_layers(recording("HeadKV")["cases"][0])[0]
    with pytest.raises(ValueError, match="hold 8 heads; the model has 3 compressible layers"):
        kept_by_kvbench(method, 0, 3, inputs["queries"][:, -WINDOW:], inputs["keys"], inputs["values"], 16)
    with pytest.raises(ValueError, match=r"estimate_headkv_scores\.py"):
        method_from_yaml("headkv", params={"head_scores": "no/such/file.json"})
    with pytest.raises(ValueError, match="valid: query_head"):
        method_from_yaml("headkv", gqa_granularity="kv_head", params={"head_scores": SCORES})
