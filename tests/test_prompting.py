"""Prompt encoding: middle truncation, chat template and the context/question split."""

from __future__ import annotations

import pytest

from kvbench.errors import KVBenchError
from kvbench.models.loading import byte_level_tokenizer
from kvbench.prompting import PromptTooLong, encode_sample, render_sample
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


# ---------------------------------------------------------------- real tokenizers and published chat templates

# Prompts whose user message a stripping template rewrites: LongBench passage_count ends in ": ", NeedleBench M-RT in
# "\n", RULER vt's answer prefix in "they are: " (with answer_prefix=user).
STRIPPED_ENDINGS = [
    ("Paragraph 1: rivers.\n\nParagraph 2: hills.\n\n", "Please enter the final count.\n\nThe final answer is: "),
    ("The document given to you by the user is rivers and hills.\n\n", "Now, the questions are: Where?、Why?\n"),
    ("  Memorize the chain.\nVAR AB = 1\n", "Question: Find all variables. Answer: they are: "),
]


@pytest.mark.parametrize("template", ["llama3", "llama3.1", "llama2", "gemma", "mistral-v0.2", "qwen2"])
@pytest.mark.parametrize(("context", "question"), STRIPPED_ENDINGS)
def test_templates_that_strip_the_prompt_are_located_by_rendering(real_tokenizer, template, context, question):
    family = {"llama3": "llama3", "llama3.1": "llama3", "qwen2": "qwen2"}.get(template, "mistral-v1")
    tok = real_tokenizer(family, template)
    sample = _sample(context, question)
    encoded = encode_sample(tok, sample, max_input_length=10_000, use_chat_template=True, truncation="none")
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": context + question}], tokenize=False, add_generation_prompt=True
    )
    assert encoded.input_ids == tok(rendered, add_special_tokens=False).input_ids  # exactly the template's prompt
    question_text = tok.decode(encoded.question_ids)
    assert question_text.lstrip().startswith(question.split(".")[0].strip())
    assert context.strip().split()[-1] in tok.decode(encoded.context_ids)
    assert question.split()[0] not in tok.decode(encoded.context_ids)


def test_a_template_rewriting_the_boundary_is_a_clear_error(real_tokenizer):
    tok = real_tokenizer("llama3")
    tok.chat_template = "{{ messages[0]['content'] | replace('  ', ' ') }}"  # merges the spaces around the boundary
    with pytest.raises(KVBenchError, match="rewrites the prompt around the question boundary"):
        encode_sample(tok, _sample("context ", " question"), max_input_length=100, use_chat_template=True)


def test_answer_prefix_follows_the_assistant_header(real_tokenizer):
    tok = real_tokenizer("llama3", "llama3")
    sample = Sample(id="s", context="Text.\n", question="What is it?", answers=["x"], answer_prefix=" Answer:")
    rendered = render_sample(tok, sample, use_chat_template=True)
    assert rendered.text.endswith("What is it?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n Answer:")
    encoded = encode_sample(tok, sample, max_input_length=1000, use_chat_template=True, truncation="none")
    assert tok.decode(encoded.question_ids).endswith("assistant<|end_header_id|>\n\n Answer:")
    plain = encode_sample(tok, sample, max_input_length=1000, use_chat_template=False, truncation="none")
    assert tok.decode(plain.input_ids) == "<|begin_of_text|>Text.\nWhat is it? Answer:"


def test_shots_are_rendered_as_complete_turns(real_tokenizer):
    tok = real_tokenizer("llama3", "llama3")
    sample = Sample(
        id="s",
        context="List b.\n",
        question="Q?",
        answers=["x"],
        answer_prefix=" A:",
        shots=(("List a.\nQ?", " A: a"),),
    )
    text = render_sample(tok, sample, use_chat_template=True).text
    turn = "<|start_header_id|>user<|end_header_id|>\n\n{}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    first = "<|begin_of_text|>" + turn.format("List a.\nQ?") + " A: a\n"
    assert text == first + "<|begin_of_text|>" + turn.format("List b.\nQ?") + " A:"  # official RULER CWE format
    assert render_sample(tok, sample, use_chat_template=False).text == "List a.\nQ? A: a\nList b.\nQ? A:"
    encoded = encode_sample(tok, sample, max_input_length=1000, use_chat_template=True, truncation="none")
    assert "List a." in tok.decode(encoded.context_ids) and tok.decode(encoded.question_ids).startswith("Q?")


def test_untruncated_prompt_longer_than_the_model_is_an_error():
    tok = byte_level_tokenizer()
    sample = _sample("x" * 300, "q?")
    with pytest.raises(
        PromptTooLong, match=r"sample 's': the prompt has 303 tokens, more than model.max_input_length=100"
    ):
        encode_sample(tok, sample, max_input_length=100, use_chat_template=False, truncation="none")
    middle = encode_sample(tok, sample, max_input_length=100, use_chat_template=False, truncation="middle")
    assert middle.truncated and len(middle.input_ids) == 100
