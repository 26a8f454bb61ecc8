"""Prompt encoding: middle truncation, chat template and the context/question split."""

from __future__ import annotations

from kvbench.models import byte_level_tokenizer
from kvbench.prompting import encode_sample
from kvbench.tasks.base import Sample


def _sample(context: str, question: str) -> Sample:
    return Sample(id="s", context=context, question=question, answers=["x"])


def test_split_gives_the_same_ids_as_the_full_prompt() -> None:
    tok = byte_level_tokenizer()
    sample = _sample("Some long context. " * 20, "Question: what?")
    encoded = encode_sample(tok, sample, max_input_length=10_000, use_chat_template=False)
    assert encoded.input_ids == tok(sample.prompt).input_ids
    assert tok.decode(encoded.question_ids) == "Question: what?"
    assert not encoded.truncated


def test_middle_truncation_keeps_both_ends_and_the_question() -> None:
    tok = byte_level_tokenizer()
    sample = _sample("A" * 300 + "B" * 300, "Q?")
    encoded = encode_sample(tok, sample, max_input_length=101, use_chat_template=False)
    assert encoded.truncated and not encoded.question_lost
    text = tok.decode(encoded.input_ids, skip_special_tokens=True)
    # BOS counts toward the length (official rule): 50 tokens each side, one of them the BOS.
    assert text == "A" * 49 + "B" * 48 + "Q?"
    assert tok.decode(encoded.question_ids) == "Q?"


def test_question_cut_by_truncation_is_reported() -> None:
    tok = byte_level_tokenizer()
    sample = _sample("c" * 50, "q" * 200)
    encoded = encode_sample(tok, sample, max_input_length=100, use_chat_template=False)
    assert encoded.question_lost and encoded.question_ids == []


def test_chat_template_wraps_the_prompt_and_the_split_follows_it() -> None:
    tok = byte_level_tokenizer()
    tok.chat_template = "{% for m in messages %}<user>{{ m['content'] }}</user>{% endfor %}<bot>"
    sample = _sample("context text. ", "the question?")
    encoded = encode_sample(tok, sample, max_input_length=10_000, use_chat_template=True)
    assert tok.decode(encoded.context_ids) == "<user>context text. "
    assert tok.decode(encoded.question_ids) == "the question?</user><bot>"
