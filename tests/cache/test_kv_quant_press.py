"""Eviction over quantized KV storage scores what kvpress scores (issue #59): kvpress's forward hook compresses a
``QuantizedCache`` layer's *dequantized* prompt states and quantizes the kept ones again; kvbench's session scores the
layer after its attention, once the layer has quantized the prompt, and its ``keep`` re-quantizes.

Recorded by ``scripts/reference/record_kv_quant_press.py`` (kvpress 0.5.5, transformers 5.2, optimum-quanto 0.2.7):
SnapKVPress and TOVAPress at compression ratio 0.5 on the trained tiny model over
``QuantizedCache(backend="quanto", nbits=4, q_group_size=32, residual_length=16)``, the context compressed and the
question fed after it (kvpress's pipeline).  kvbench runs ``snapkv_kvpress`` / ``tova_kvpress`` at ``0.5cr``,
question-agnostic, with the same quantized storage under transformers 5.2's flush rule (``flush_rule=5.2``).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
import torch

from kvbench.api import compose_config
from kvbench.budget import parse_budget
from kvbench.config import KVQuantConfig
from kvbench.eviction.base import build_method
from kvbench.inference.generate import generate
from kvbench.inference.prefill import prefill
from kvbench.resources import models_dir
from tests.reference_recordings import is_valid_topk

RECORDING = Path(__file__).resolve().parents[1] / "fixtures" / "reference" / "kv_quant" / "kv_quant_press.json"
METHODS = {"SnapKVPress": "snapkv_kvpress", "TOVAPress": "tova_kvpress"}
QUANTO4 = KVQuantConfig(
    name="quanto4",
    scheme="quanto",
    nbits=4,
    group_size=32,
    residual_length=16,
    axis_key=0,
    axis_value=0,
    flush_rule="5.2",
)


@cache
def recording() -> dict:
    return json.loads(RECORDING.read_text())


def quantized_case(press: str) -> dict:
    return next(c for c in recording()["cases"] if c["press"] == press and c["cache"] != "dynamic")


@pytest.fixture(scope="module")
def tiny_niah():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import kvbench.attention.function  # noqa: F401  (registers attn_implementation="kvbench")

    folder = models_dir() / "tiny-niah"
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="kvbench")
    return model.eval(), AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("press", sorted(METHODS))
def test_kept_positions_are_kvpress_top_k_over_the_dequantized_prompt(tiny_niah, press: str) -> None:
    model, _ = tiny_niah
    data, case = recording(), quantized_case(press)
    method = build_method(compose_config(method=METHODS[press]).method)
    state = prefill(
        model,
        data["context_ids"],
        [],
        method=method,
        budget=parse_budget("0.5cr"),
        question_mode="agnostic",
        kv_quant=QUANTO4,
    )
    for call in case["scores"]:
        layer = state.cache.layers[call["layer"]]
        for head, positions in enumerate(layer.positions):
            kept = sorted(int(p) for p in positions)
            scores = torch.tensor(call["scores"][head])
            assert kept == call["kept"][head] or is_valid_topk(scores, kept), (press, call["layer"], head)


def test_the_recording_tells_dequantized_scores_apart() -> None:
    """Over the unquantized cache kvpress keeps other positions: matching the quantized case means scoring what the
    quantized cache holds."""
    for press in METHODS:
        quantized = quantized_case(press)
        dynamic = next(c for c in recording()["cases"] if c["press"] == press and c["cache"] == "dynamic")
        assert any(q["kept"] != d["kept"] for q, d in zip(quantized["scores"], dynamic["scores"], strict=True))


@pytest.mark.parametrize("press", sorted(METHODS))
def test_greedy_tokens_equal_kvpress_pipeline(tiny_niah, press: str) -> None:
    data, case = recording(), quantized_case(press)
    output = generate(
        *tiny_niah,
        data["context_ids"],
        data["question_ids"],
        method=build_method(compose_config(method=METHODS[press]).method),
        budget=parse_budget("0.5cr"),
        question_mode="agnostic",
        max_new_tokens=len(case["tokens"]),
        stop_token_ids=set(),
        kv_quant=QUANTO4,
    )
    assert list(output.token_ids) == case["tokens"]
