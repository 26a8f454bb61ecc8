"""The full cache (family ``full``, kvbench/methods/full.py): nothing evicted, so kvbench's cache and attention give
exactly the tokens of plain transformers greedy generation, on every built-in architecture and storage backend."""

from __future__ import annotations

import copy

import pytest
import torch

from kvbench.budget import parse_budget
from kvbench.cache.kv_cache import BACKEND_ENV
from kvbench.eviction.base import EvictionMethod
from kvbench.inference.generate import generate
from kvbench.models.loading import BUILTIN_MODELS, build_builtin
from tests.attention.test_cache_attention import BACKENDS


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", BUILTIN_MODELS)
def test_full_method_reproduces_transformers_generate(name: str, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """method=full gives the same tokens as plain transformers greedy generate (sdpa, DynamicCache), with GQA."""
    monkeypatch.setenv(BACKEND_ENV, backend)
    model, tokenizer = build_builtin(name, seed=3)
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    prompt = torch.randint(3, len(tokenizer), (1, 160), generator=torch.Generator().manual_seed(1))
    reference = copy.deepcopy(model).eval()
    reference.set_attn_implementation("sdpa")
    with torch.no_grad():
        expected = reference.generate(prompt, max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
    model.set_attn_implementation("kvbench")
    model.eval()
    ids = prompt[0].tolist()
    full = EvictionMethod(name="full", family="full", scorer=None)
    for mode in ("aware", "agnostic"):
        out = generate(
            model,
            tokenizer,
            ids[:120],
            ids[120:],
            method=full,
            budget=parse_budget("full"),
            question_mode=mode,
            max_new_tokens=24,
            stop_token_ids=set(),
        )
        assert out.token_ids == expected[0, 160:].tolist(), mode
