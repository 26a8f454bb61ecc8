"""SCBench's prompts, re-implemented from microsoft/MInference ``scbench/eval_utils.py`` (commit ``fb56c91``):
``create_multiturn_prompt`` (multi-turn, golden context) and ``create_scdq_prompt`` (multi-request), with and
without the model's chat template; the templates themselves are data (``tasks/scbench/prompts.json``).

Multi-turn: the first prompt is the task template filled with the context and the first query (chat: one user
message, generation prompt added); each later prompt carries the previous turn's *golden* answer and the next query
-- raw: the follow-up template (``{pre_ans}\\n\\n...``); chat: the conversation ``[system "", assistant <answer>,
user <query>]`` rendered with the generation prompt, from which the rendering of ``[system ""]`` + generation
prompt is removed (``str.replace``), so what remains is the answer, its end-of-turn and the next user turn.

Multi-request: the first prompt is the context part of the template (chat: the user message up to a delimiter, its
end-of-turn cut off), each query its own part (chat: the user message after the delimiter, end-of-turn and
generation prompt included).

Official quirks kept: ``scbench_mf``'s multi-turn chat follow-ups all use the *last* turn's ``What is ...?``
prefix (a loop variable that outlives its loop); its multi-request context prompt is prefixed with the first turn's
raw input; ``scbench_summary``'s chat follow-ups end with ``This paper``; a golden answer is passed through ``str``
for the generic tasks and ``scbench_mf`` (a list answer shows as ``['a', 'b']``) but as is for the others.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from kvbench import resources

SCBENCH_DIR = resources.tasks_dir() / "scbench"
#: The delimiter ``create_scdq_prompt`` splits the chat-rendered user message at.
DELIMITER = "[SEPSEPSEP]"
_OPTION_TASKS = ("scbench_choice_eng",)
_QUESTION_TASKS = ("scbench_choice_eng", "scbench_qa_eng", "scbench_qa_chn")
#: Tasks whose golden answer goes into the chat conversation as is (the others through ``str``).
_RAW_ANSWER_TASKS = ("scbench_choice_eng", "scbench_qa_eng", "scbench_qa_chn", "scbench_summary")


@lru_cache(maxsize=1)
def templates() -> dict[str, Any]:
    """``tasks/scbench/prompts.json``: the official template tables and generation limits."""
    return json.loads((SCBENCH_DIR / "prompts.json").read_text(encoding="utf-8"))


def _what_is(turn_input: str) -> str:
    """``scbench_mf``'s prefix: ``What is <the largest number of the list>?`` from ``The ... is`` in the input."""
    found = re.findall(r"The .+ is", turn_input)
    if not found:
        raise ValueError(f"scbench_mf: no 'The ... is' in the query {turn_input!r}")
    return f"What is {found[0].lower()[:-3]}?"


def turn_fields(task: str, turn: dict[str, Any]) -> dict[str, Any]:
    """The ``str.format`` fields of one turn's query (``question`` + options, or ``input``)."""
    if task in _QUESTION_TASKS:
        fields: dict[str, Any] = {"question": turn["input"]}
        if task in _OPTION_TASKS:
            fields.update({f"OPTION_{letter}": turn["options"][i] for i, letter in enumerate("ABCD")})
        return fields
    if task == "scbench_mf":
        return {"prefix": _what_is(turn["input"]), "input": turn["input"]}
    return {"input": turn["input"]}


def _context(example: dict[str, Any]) -> Any:
    return example["context"] if "context" in example else example["input"]


def _chat(tokenizer: Any, messages: list[dict[str, Any]], generation_prompt: bool = True) -> str:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False)


def multi_turn_prompts(task: str, example: dict[str, Any], tokenizer: Any, use_chat_template: bool) -> list[str]:
    """``create_multiturn_prompt(...)["prompts"]`` (golden context): one prompt per turn."""
    table = templates()
    turns = example["multi_turns"]
    first = table["first_turn"][task].format(context=_context(example), **turn_fields(task, turns[0]))
    if not use_chat_template:
        follow = table["follow_up"][task]
        return [first] + [
            follow.format(pre_ans=turns[i - 1]["answer"], **turn_fields(task, turns[i])) for i in range(1, len(turns))
        ]
    system = _chat(tokenizer, [{"role": "system", "content": ""}])
    in_chat = table["follow_up_in_chat"][task]
    last_fields = turn_fields(task, turns[-1]) if task == "scbench_mf" else None
    prompts = [_chat(tokenizer, [{"role": "user", "content": first}])]
    for i in range(1, len(turns)):
        answer = turns[i - 1]["answer"]
        fields = turn_fields(task, turns[i])
        if last_fields is not None:  # the official loop's leftover ``prefix``: the last turn's
            fields = {**fields, "prefix": last_fields["prefix"]}
        messages = [
            {"role": "system", "content": ""},
            {"role": "assistant", "content": answer if task in _RAW_ANSWER_TASKS else str(answer)},
            {"role": "user", "content": in_chat.format(**fields)},
        ]
        text = _chat(tokenizer, messages).replace(system, "")
        prompts.append(text + "This paper" if task == "scbench_summary" else text)
    return prompts


def multi_request_prompts(task: str, example: dict[str, Any], tokenizer: Any, use_chat_template: bool) -> list[str]:
    """``create_scdq_prompt(...)["prompts"]``: the context prompt, then one prompt per query."""
    table = templates()
    turns = example["multi_turns"]
    template = table["multi_request"][task]
    if isinstance(template, list):  # (context part, query part): choice / QA tasks
        context_prompt = template[0].format(context=_context(example))
        queries = [template[1].format(**turn_fields(task, turn)) for turn in turns]
    elif task == "scbench_mf":
        context_prompt = template.format(prefix=turns[0]["input"], context=_context(example))
        queries = [table["follow_up_in_chat"][task].format(**turn_fields(task, turn)) for turn in turns]
    else:
        context_prompt = template.format(context=_context(example))
        queries = [turn["input"] for turn in turns]
    if use_chat_template:
        context_prompt = _chat(tokenizer, [{"role": "user", "content": context_prompt + DELIMITER}]).split(DELIMITER)[0]
        queries = [
            _chat(tokenizer, [{"role": "system", "content": ""}, {"role": "user", "content": DELIMITER + query}]).split(
                DELIMITER
            )[1]
            for query in queries
        ]
    return [context_prompt, *queries]


def first_query_start(task: str, example: dict[str, Any], first_prompt: str) -> int:
    """Where the first query starts in the multi-turn first prompt (after the context; for question-agnostic
    compression): the end of the template's context part as it appears in ``first_prompt`` (its length when absent)."""
    template = templates()["first_turn"][task]
    cut = template.index("{context}") + len("{context}")
    fields = {"context": _context(example), **turn_fields(task, example["multi_turns"][0])}
    head = template[:cut].format(**fields).lstrip()
    found = first_prompt.find(head)
    return len(first_prompt) if found < 0 else found + len(head)


def official_label(task: str, turn: dict[str, Any]) -> Any:
    """``get_ground_truth`` for one turn: ``[answer, letter]`` (choice), ``[answer]`` (English QA), else the answer."""
    answer = turn["answer"]
    if task == "scbench_choice_eng":
        return [answer, "ABCD"[turn["options"].index(answer)]]
    if task == "scbench_qa_eng":
        return [answer]
    return answer
