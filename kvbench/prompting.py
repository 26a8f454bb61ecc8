"""From a :class:`~kvbench.tasks.base.Sample` to token ids: truncation, chat template, context/question split.

Order of operations (LongBench's official rule, applied to every task):

1. the raw prompt ``context + question`` is tokenised (with special tokens, so a BOS counts, as in LongBench's
   ``pred.py``) and, if longer than the model's ``max_input_length``, truncated in the *middle*: the first and the
   last ``max_input_length // 2`` tokens are decoded back to text and joined;
2. the chat template is applied to the (truncated) text when both the model and the dataset allow it;
3. the templated text is tokenised once (special tokens added only when no template was applied), and split into
   the context part and the question part at the character where the question starts (token offsets), so the
   token ids are identical in question-aware and question-agnostic modes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from kvbench.errors import KVBenchError
from kvbench.tasks.base import Sample


@dataclass
class EncodedPrompt:
    """Token ids of one sample.

    Attributes
    ----------
    context_ids:
        Ids up to where the question starts (compressed first in question-agnostic mode).
    question_ids:
        The question's ids, including any chat-template suffix (empty when the sample has no question).
    truncated:
        Whether middle truncation removed tokens.
    question_lost:
        True when truncation cut into the question, so the split fell back to "everything is context".
    """

    context_ids: list[int]
    question_ids: list[int]
    truncated: bool
    question_lost: bool = False

    @property
    def input_ids(self) -> list[int]:
        return self.context_ids + self.question_ids


def truncate_middle(token_ids: list[int], max_length: int) -> list[int]:
    """Official LongBench middle truncation: if longer than ``max_length``, keep the first and the last
    ``int(max_length / 2)`` tokens (an odd ``max_length`` keeps ``max_length - 1``); otherwise unchanged."""
    if max_length < 2:
        raise ValueError(f"max_length must be >= 2, got {max_length}")
    if len(token_ids) <= max_length:
        return list(token_ids)
    half = int(max_length / 2)
    return list(token_ids[:half]) + list(token_ids[-half:])


def truncate_prompt(prompt: str, tokenizer: Any, max_length: int, add_special_tokens: bool = True) -> str:
    """Official string-level rule (LongBench ``pred.py``): tokenize the prompt (special tokens included); if too
    long, decode the first and the last half with ``skip_special_tokens=True`` and join the two strings."""
    ids = list(tokenizer(prompt, truncation=False, add_special_tokens=add_special_tokens).input_ids)
    if len(ids) <= max_length:
        return prompt
    half = int(max_length / 2)
    kept = truncate_middle(ids, max_length)
    return tokenizer.decode(kept[:half], skip_special_tokens=True) + tokenizer.decode(
        kept[half:], skip_special_tokens=True
    )


def split_truncated_prompt(truncated_prompt: str, question: str) -> tuple[str, str]:
    """Re-split a (possibly middle-truncated) full prompt into ``(context, question)``: the question stays the
    suffix when it survived truncation intact; otherwise everything is context and the question is empty."""
    if question and truncated_prompt.endswith(question):
        return truncated_prompt[: len(truncated_prompt) - len(question)], question
    return truncated_prompt, ""


def encode_sample(
    tokenizer: PreTrainedTokenizerBase, sample: Sample, *, max_input_length: int, use_chat_template: bool
) -> EncodedPrompt:
    """Tokenise ``sample`` following the module's rules."""
    context, question = sample.context, sample.question
    text = truncate_prompt(context + question, tokenizer, max_input_length)
    truncated = text != context + question
    question_lost = False
    if truncated:
        context, kept_question = split_truncated_prompt(text, question)
        question_lost = bool(question) and not kept_question
        question = kept_question
    if use_chat_template:
        if not getattr(tokenizer, "chat_template", None):
            raise KVBenchError(
                "model.chat_template=true but the tokenizer has no chat template; set model.chat_template=false"
            )
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": context + question}], tokenize=False, add_generation_prompt=True
        )
        assert isinstance(rendered, str)
        start = rendered.rfind(context + question)
        if start < 0:
            raise KVBenchError("the chat template altered the prompt text; cannot locate the question boundary")
        boundary = start + len(context)
        add_special = False
    else:
        rendered = context + question
        boundary = len(context)
        add_special = True
    encoding = tokenizer(rendered, add_special_tokens=add_special, return_offsets_mapping=True)
    ids: list[int] = encoding.input_ids
    offsets: list[tuple[int, int]] = encoding.offset_mapping
    split = len(ids)
    if question:
        for index, (start_char, end_char) in enumerate(offsets):
            # Special tokens have (0, 0) offsets; the first real token at or after the boundary starts the question.
            if end_char > start_char and start_char >= boundary:
                split = index
                break
            if end_char > boundary > start_char:  # a token straddles the boundary: it goes to the question
                split = index
                break
    return EncodedPrompt(ids[:split], ids[split:], truncated=truncated, question_lost=question_lost)
