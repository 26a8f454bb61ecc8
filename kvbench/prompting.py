"""From a :class:`~kvbench.tasks.base.Sample` to token ids: truncation, chat template, context/question split.

Order of operations:

1. truncation, per the dataset's official rule (:attr:`TaskDataset.truncation`):

   * ``"middle"`` (LongBench ``pred.py``): the user text ``context + question`` is tokenised with special tokens (a
     BOS counts) and, if longer than the model's ``max_input_length``, cut in the *middle*: the first and last
     ``max_input_length // 2`` tokens are decoded back to text and joined;
   * ``"middle_joined"`` (LongBench v2 ``pred.py``): the same tokenisation, but the kept ids are the first
     ``max_input_length // 2`` and the last ``-(-max_input_length // 2)`` (exactly ``max_input_length`` in all), joined
     as ids and decoded once;
   * ``"middle_joined_half"`` (InfiniteBench ``src/eval_*.py``): as ``middle_joined`` with two equal halves of
     ``max_input_length // 2`` ids (an odd maximum keeps one fewer), and the ids are decoded even when nothing is cut
     (``truncate_by_tokens`` always decodes: special-token text such as ``</s>`` in a context is dropped);
   * ``"none"`` (RULER, NeedleBench: their harnesses build prompts that fit and never cut them): a prompt longer than
     ``max_input_length`` is an error naming the sample and both lengths;

2. rendering (:func:`render_prompt`): each few-shot turn, then the user text, wrapped by the chat template when the
   model and the dataset use one, then the answer prefix (after the assistant header, as official RULER);
3. one tokenisation of the rendered text (special tokens added only when no template was applied), split into the
   context part and the question part at the character where the question starts (token offsets), so the token ids
   are identical in question-aware and question-agnostic modes.

Chat templates may rewrite the user message (Llama-2/3, Gemma strip surrounding whitespace): the question boundary is
found by *rendering around it* -- the template renders the user text with a marker at the boundary, the marker's
position is the boundary, and the text without the marker must equal the template's rendering of the unmarked user
text (else a clear error).  Nothing searches the rendered text for the prompt string.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvbench.checks import check_choice
from kvbench.errors import KVBenchError
from kvbench.sample import Sample

if TYPE_CHECKING:  # type hints only: the task modules import this one, and validation imports them torch-free
    from transformers import PreTrainedTokenizerBase

TRUNCATION_MODES = ("middle", "middle_joined", "middle_joined_half", "none")
#: BOS of a chat-templated prompt: ``single`` (the template carries its BOS; no second one is added, nor to a text
#: that starts with the BOS text, e.g. RULER's ``meta-llama3`` template) or
#: ``reference_double`` (the templated text is tokenised with special tokens, as Ada-KV's and CAKE's LongBench
#: ``pred.py``: a template starting with the BOS text then yields two BOS ids).  Untemplated prompts always get the
#: tokenizer's special tokens.
BOS_MODES = ("single", "reference_double")
#: Marks the question boundary while the chat template renders (private-use characters, never in benchmark text).
_MARK = "\ue000kvbench-question-starts\ue001"


class PromptTooLong(KVBenchError):
    """A prompt of a dataset that is never truncated does not fit the model's ``max_input_length``."""


@dataclass
class EncodedPrompt:
    """Token ids of one sample.

    Attributes
    ----------
    context_ids:
        Ids up to where the question starts (compressed first in question-agnostic mode).
    question_ids:
        The question's ids, including any chat-template suffix and the answer prefix (empty when the sample has no
        question).
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


@dataclass(frozen=True)
class RenderedPrompt:
    """The model's whole input text and where its question starts.

    Attributes
    ----------
    text:
        Shots, user turn (chat template applied or not) and answer prefix.
    question_start:
        Character offset of the question in ``text`` (``len(text)`` when there is no question).
    templated:
        Whether a chat template was applied (then ``text`` carries its own special tokens, e.g. the BOS).
    """

    text: str
    question_start: int
    templated: bool


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


def truncate_prompt_joined(prompt: str, tokenizer: Any, max_length: int, equal_halves: bool = False) -> str:
    """LongBench v2 ``pred.py``'s rule: ``ids = tokenizer.encode(prompt)`` (special tokens included); if longer than
    ``max_length``, ``ids[:max_length // 2] + ids[-max_length // 2:]`` (Python's floor division: an odd
    ``max_length`` keeps one more token at the end, ``max_length`` in all), decoded once with
    ``skip_special_tokens=True``; otherwise the prompt unchanged.  ``equal_halves``: InfiniteBench's
    ``truncate_by_tokens``, ``split = max_length // 2; ids[:split] + ids[-split:]``, and the ids are decoded even when
    nothing is cut (special-token text in the prompt, ``</s>`` or ``<|eot_id|>``, is dropped, as there)."""
    return joined_truncation(prompt, tokenizer, max_length, equal_halves)[0]


def joined_truncation(prompt: str, tokenizer: Any, max_length: int, equal_halves: bool) -> tuple[str, bool]:
    """:func:`truncate_prompt_joined`'s text and whether ids were cut."""
    if max_length < 2:
        raise ValueError(f"max_length must be >= 2, got {max_length}")
    ids = list(tokenizer(prompt, truncation=False, add_special_tokens=True).input_ids)
    if len(ids) <= max_length:
        return (tokenizer.decode(ids, skip_special_tokens=True) if equal_halves else prompt), False
    tail = max_length // 2 if equal_halves else -(-max_length // 2)
    kept = ids[: max_length // 2] + ids[len(ids) - tail :]
    return tokenizer.decode(kept, skip_special_tokens=True), True


def split_truncated_prompt(truncated_prompt: str, question: str) -> tuple[str, str]:
    """Re-split a (possibly middle-truncated) full prompt into ``(context, question)``: the question stays the
    suffix when it survived truncation intact; otherwise everything is context and the question is empty."""
    if question and truncated_prompt.endswith(question):
        return truncated_prompt[: len(truncated_prompt) - len(question)], question
    return truncated_prompt, ""


def render_user_turn(
    tokenizer: PreTrainedTokenizerBase, user_text: str, template_kwargs: Mapping[str, Any] | None = None
) -> str:
    """The chat template applied to one user message, with the generation prompt (assistant header);
    ``template_kwargs``: extra variables the template reads (``{"enable_thinking": False}``: Qwen3's template closes
    an empty think block after the assistant header, as kvpress's pipeline renders it)."""
    if not getattr(tokenizer, "chat_template", None):
        raise KVBenchError(
            "model.chat_template=true but the tokenizer has no chat template; set model.chat_template=false"
        )
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": user_text}], tokenize=False, add_generation_prompt=True, **(template_kwargs or {})
    )
    assert isinstance(rendered, str)
    return rendered


def _render_split(
    tokenizer: PreTrainedTokenizerBase, context: str, question: str, template_kwargs: Mapping[str, Any] | None
) -> tuple[str, int]:
    """``(rendered user turn, offset where the question starts)``, found by rendering a marker at the boundary."""
    rendered = render_user_turn(tokenizer, context + question, template_kwargs)
    if not question:
        return rendered, len(rendered)
    marked = render_user_turn(tokenizer, context + _MARK + question, template_kwargs)
    start = marked.find(_MARK)
    if start < 0 or marked.count(_MARK) != 1 or marked[:start] + marked[start + len(_MARK) :] != rendered:
        raise KVBenchError(
            "the chat template rewrites the prompt around the question boundary, so the context/question split "
            f"cannot be located (rendered {len(rendered)} characters; the question starts with {question[:40]!r}); "
            "set model.chat_template=false or use a template that keeps the user message"
        )
    return rendered, start


def render_prompt(
    tokenizer: PreTrainedTokenizerBase,
    context: str,
    question: str,
    *,
    answer_prefix: str = "",
    shots: Sequence[tuple[str, str]] = (),
    use_chat_template: bool,
    template_kwargs: Mapping[str, Any] | None = None,
) -> RenderedPrompt:
    """Render shots, the user text ``context + question`` and the answer prefix (see the module docstring);
    ``template_kwargs``: extra variables of the chat template (:func:`render_user_turn`)."""
    if use_chat_template:
        head = "".join(render_user_turn(tokenizer, user, template_kwargs) + reply + "\n" for user, reply in shots)
        turn, start = _render_split(tokenizer, context, question, template_kwargs)
    else:
        head = "".join(user + reply + "\n" for user, reply in shots)
        turn, start = context + question, len(context)
    text = head + turn + answer_prefix
    question_start = len(head) + start if question else len(text)
    return RenderedPrompt(text, question_start, use_chat_template)


def render_sample(
    tokenizer: PreTrainedTokenizerBase,
    sample: Sample,
    use_chat_template: bool,
    template_kwargs: Mapping[str, Any] | None = None,
) -> RenderedPrompt:
    """:func:`render_prompt` of a sample."""
    return render_prompt(
        tokenizer,
        sample.context,
        sample.question,
        answer_prefix=sample.answer_prefix,
        shots=sample.shots,
        use_chat_template=use_chat_template,
        template_kwargs=template_kwargs,
    )


def _tokenize_split(
    tokenizer: PreTrainedTokenizerBase, rendered: RenderedPrompt, bos: str = "single"
) -> tuple[list[int], list[int]]:
    """Tokenise the rendered text once and split the ids where the question starts (token offsets); ``bos``: one of
    :data:`BOS_MODES`."""
    add_special = not rendered.templated or bos == "reference_double"
    bos_text = getattr(tokenizer, "bos_token", None)
    if bos == "single" and bos_text and rendered.text.startswith(bos_text):
        add_special = False  # the text writes its own BOS (RULER's meta-llama3 template): never a second one
    encoding = tokenizer(rendered.text, add_special_tokens=add_special, return_offsets_mapping=True)
    ids: list[int] = encoding.input_ids
    offsets: list[tuple[int, int]] = encoding.offset_mapping
    boundary = rendered.question_start
    split = len(ids)
    if boundary < len(rendered.text):
        for index, (start_char, end_char) in enumerate(offsets):
            # Special tokens added by the tokenizer have (0, 0) offsets; the first real token at or after the
            # boundary starts the question, and a token straddling the boundary goes to the question.
            if end_char > start_char and (start_char >= boundary or end_char > boundary):
                split = index
                break
    return ids[:split], ids[split:]


def encode_sample(
    tokenizer: PreTrainedTokenizerBase,
    sample: Sample,
    *,
    max_input_length: int,
    use_chat_template: bool,
    truncation: str = "middle",
    bos: str = "single",
    template_kwargs: Mapping[str, Any] | None = None,
) -> EncodedPrompt:
    """Tokenise ``sample`` following the module's rules (``truncation``: one of :data:`TRUNCATION_MODES`; ``bos``:
    one of :data:`BOS_MODES`; ``template_kwargs``: extra variables of the chat template)."""
    check_choice("truncation", truncation, TRUNCATION_MODES)
    check_choice("bos", bos, BOS_MODES)
    context, question = sample.context, sample.question
    truncated = question_lost = False
    text = context + question
    if truncation == "middle":
        text = truncate_prompt(context + question, tokenizer, max_input_length)
        truncated = text != context + question
    elif truncation in ("middle_joined", "middle_joined_half"):
        halves = truncation == "middle_joined_half"
        text, truncated = joined_truncation(context + question, tokenizer, max_input_length, halves)
    if text != context + question:  # cut, or (InfiniteBench) decoded back without its special-token text
        context, kept_question = split_truncated_prompt(text, question)
        question_lost = truncated and bool(question) and not kept_question
        question = kept_question
    rendered = render_prompt(
        tokenizer,
        context,
        question,
        answer_prefix=sample.answer_prefix,
        shots=sample.shots,
        use_chat_template=use_chat_template,
        template_kwargs=template_kwargs,
    )
    context_ids, question_ids = _tokenize_split(tokenizer, rendered, bos)
    length = len(context_ids) + len(question_ids)
    if truncation == "none" and length > max_input_length:
        raise PromptTooLong(
            f"sample {sample.id!r}: the prompt has {length} tokens, more than model.max_input_length="
            f"{max_input_length}; this benchmark's official harness never truncates prompts. Use a shorter "
            "task.length / task.lengths, or a model with a longer context (model.max_input_length)"
        )
    return EncodedPrompt(context_ids, question_ids, truncated=truncated, question_lost=question_lost)
