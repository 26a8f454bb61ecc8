"""NeedleBench v1's subtasks, sizes (lengths, depths, buffers), repeats, ``task.options`` defaults and the
OpenCompass prompt texts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

GROUPS = ("single_retrieval", "multi_retrieval", "multi_reasoning")
LANGUAGES = {"en": "English", "zh": "Chinese"}

#: ``int(100 / 19 * i)`` for i in 0..19 (4k and 8k configs).
DEPTHS_20 = [int(100 / 19 * i) for i in range(20)]
#: The 11 sparse depths of the 32k and 128k configs.
DEPTHS_11 = [0, 10, 21, 31, 42, 52, 63, 73, 84, 94, 100]


@dataclass(frozen=True)
class SizeConfig:
    """One NeedleBench v1 size: context lengths, depths and the English length buffers per group."""

    lengths: tuple[int, ...]
    depths: tuple[int, ...]
    buffer_en: dict[str, int]


SIZES: dict[str, SizeConfig] = {
    "4k": SizeConfig(
        (1000, 2000, 3000, 4000),
        tuple(DEPTHS_20),
        {"single_retrieval": 600, "multi_retrieval": 1000, "multi_reasoning": 600},
    ),
    "8k": SizeConfig(
        (5000, 6000, 7000, 8000),
        tuple(DEPTHS_20),
        {"single_retrieval": 800, "multi_retrieval": 1300, "multi_reasoning": 1000},
    ),
    "32k": SizeConfig(
        (9000, 13000, 17000, 21000, 25000, 29000, 31000, 32000),
        tuple(DEPTHS_11),
        {"single_retrieval": 3000, "multi_retrieval": 3000, "multi_reasoning": 3000},
    ),
    "128k": SizeConfig(
        tuple(range(16000, 128001, 16000)),
        tuple(DEPTHS_11),
        {"single_retrieval": 600, "multi_retrieval": 3000, "multi_reasoning": 600},
    ),
}
BUFFER_ZH = 200
REPEATS = {"single_retrieval": 10, "multi_retrieval": 25, "multi_reasoning": 10}
#: Needle distance of M-RS in percent of the context (``diff``).
REASONING_DIFF = 10

SIZE_BY_LENGTH = {4096: "4k", 4000: "4k", 8192: "8k", 8000: "8k", 32768: "32k", 32000: "32k"}
SIZE_BY_LENGTH.update({131072: "128k", 128000: "128k"})

OPTION_DEFAULTS: dict[str, Any] = {
    #: 4k | 8k | 32k | 128k; null = from task.length (4096/8192/32768/131072), else 4k.
    "size": None,
    #: Repeats per cell, per group (OpenCompass: 10 / 25 / 10).
    "repeats": None,
    #: M-RS needle counts.
    "needle_counts": [2, 3, 4, 5],
    #: Length buffers override: {"en": {group: n}, "zh": n}; null = the size's values.
    "buffers": None,
    #: OpenCompass guide=True (adds "Before answering, please consider ...").
    "guide": True,
    #: Per-group output cap (OpenCompass uses the model's max_out_len); int = same for all groups.
    "max_new_tokens": {"single_retrieval": 100, "multi_retrieval": 400, "multi_reasoning": 100},
    "source": "auto",
    #: Named deviation: trim the haystack when the finished prompt overshoots the nominal length (OpenCompass's
    #: buffer is sized for tiktoken; official: never trimmed, the prompt may be longer than the length).
    "fit_length": False,
    #: Named deviation: cycle the haystack records when the corpus is shorter than the target (official: the
    #: haystack stops at the end of the corpus, a shorter prompt).
    "cycle_haystack": False,
}

#: Version of the sample generator, part of the sample-cache key: bump it whenever generated samples change.
#: 2: no trimming, no cycling by default (issue #27).
GENERATOR_VERSION = 2

# ---- prompts (opencompass/datasets/needlebench/{origin,parallel,multi}.py, position "End") ---------------------

_EN_HEAD = (
    "You are an intelligent AI assistant skilled in answering user questions.\n"
    "Please keep your answers concise and clear. Do not talk about irrelevant topics or repeat your answers.\n"
    "The document given to you by the user is "
)
_ZH_HEAD = (
    "你是一个善于回答用户问题的智能AI助手\n请保持你的回答简洁清楚。不要说和下面文档中的无关的话，或重复你的回答\n"
)
_ZH_DOC = "用户现在给你的文档是"
_ZH_PARALLEL_EXTRA = "请先仔细阅读下面的文档再依次回答最后提出的问题\n"
_EN_GUIDE = "Before answering, please consider what in the document is most relevant to this question."
_ZH_GUIDE = "在回答之前，请思考文档中与此问题最相关的内容是什么。"


def prompt_parts(group: str, language: str) -> tuple[str, str, str]:
    """(text before the haystack, text between haystack and question, text after the question)."""
    if language == "en":
        lead = "\n\nNow, the questions are: " if group == "multi_retrieval" else "\n\nNow, the question is: "
        return _EN_HEAD, lead, "\n" if group == "multi_retrieval" else ""
    if group == "multi_retrieval":
        return _ZH_HEAD + _ZH_PARALLEL_EXTRA + _ZH_DOC, "\n\n现在请问：", "\n"
    return _ZH_HEAD + _ZH_DOC, "\n\n现在请问：", ""


def guide_question(question: str, group: str, language: str) -> str:
    """OpenCompass ``guide=True`` rewrite: S-RT / M-RT insert the guide before the answer-format request, M-RS
    appends it."""
    guide = _EN_GUIDE if language == "en" else _ZH_GUIDE
    if group == "multi_reasoning":
        return question + guide
    if language == "en":
        parts = question.split("Please answer in the format")
        if len(parts) < 2:
            return question
        return parts[0] + guide + " Please answer in the format" + parts[1]
    parts = question.split("请按照")
    if len(parts) < 2:
        return question
    return parts[0] + guide + "请按照" + parts[1]


def parallel_question(needles: Sequence[dict[str, Any]], language: str) -> str:
    """M-RT question: all questions joined by "、" followed by the joined answer formats."""
    if language == "en":
        questions = "、".join(n["retrieval_question"].split("?")[0] + "?" for n in needles)
        formats = "、".join(n["retrieval_question"].split("'")[1].split(".")[0] for n in needles)
        return questions + "Please answer in the format of '" + formats + "'"
    questions = "、".join(n["retrieval_question"].split("？")[0] + "？" for n in needles)
    formats = "、".join(n["retrieval_question"].split("'")[1].split("。")[0] for n in needles)
    return questions + "请按照'" + formats + "'的格式回答。"
