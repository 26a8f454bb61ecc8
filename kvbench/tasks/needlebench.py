"""NeedleBench v1 (OpenCompass, the 2024 definition CAKE's tables use): ``task=needlebench``.

Three subtasks in English and Chinese (shared/specs/benchmarks.md section 3):

* ``single_retrieval`` (S-RT, ``origin.py``): one needle at each depth of each context length;
* ``multi_retrieval`` (M-RT, ``parallel.py``): one needle per depth in the same context, all asked at once;
* ``multi_reasoning`` (M-RS, ``multi.py``): 2-5 derivation needles, the first at the depth, the next ones 10 % of
  the context apart; the question needs all of them.

A dataset here is one (subtask, language) pair (``single_retrieval_en``, ..., ``multi_reasoning_zh``) holding every
context length x depth x repeat (x needle count) of OpenCompass's per-cell datasets; its ``score`` equals the
OpenCompass group mean over those cells (cells have equal sizes).  The overall score needs all six datasets:
:func:`kvbench.metrics.synthetic.needlebench_summary` returns the group means (mean of EN and ZH) and
``overall = 0.4 S-RT + 0.3 M-RS + 0.3 M-RT``.

Haystack construction (all subtasks, OpenCompass HEAD since 2024-07): for ``counter`` in ``range(repeats)``:
``random.seed(counter)`` (shifted by ``task.seed - 42``) and shuffle the haystack records (cumulatively over
counters); choose the needle(s) -- S-RT and M-RS reseed with ``counter`` before their ``random.choice``, M-RT reseeds
before shuffling a fresh copy of its unique needles; take token-ised records in that order until ``length - buffer -
needle tokens`` tokens, cut, insert the needle tokens, decode.  Needles are wrapped in newlines.  Token arithmetic uses
the model's tokenizer (OpenCompass used tiktoken's gpt-4 encoding).  Prompts are never truncated: one longer than the
model's ``max_input_length`` is an error.  The buffers are OpenCompass's, sized for tiktoken: when the model's
tokenizer spends more on the prompt text (SentencePiece on Chinese) and the whole input (chat template included) would
exceed the context length, the haystack is shortened by the excess (``extra["haystack_trimmed"]``; 0 whenever the
buffer suffices), so every prompt fits its length.  Samples are stored in the sample cache (kvbench.sample_cache).

Inputs: ``PaulGrahamEssays.jsonl``, ``zh_finance.jsonl``, ``needles.jsonl`` and ``multi_needle_reasoning_{en,zh}.json``
from ``task.data_dir`` or ``./data/needlebench`` (HF dataset ``opencompass/NeedleBench``; ``scripts/prepare_data.py
needlebench`` writes there); each missing file is replaced by a shipped stand-in -- the filler essays, our own Chinese
text (``tasks/needlebench/haystack_zh.jsonl``), our own needles (``tasks/needlebench/needles.jsonl``, same schema),
kinship-chain reasoning records generated from ``tasks/needlebench/names.json`` -- recorded in metrics.json and
warned about when the run starts.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvbench.metrics.synthetic import (
    needlebench_multi_reasoning_score,
    needlebench_parallel_scores,
    needlebench_single_score,
)
from kvbench.prompting import render_prompt
from kvbench.resources import tasks_dir
from kvbench.sample_cache import cached_samples, source_fingerprint, tokenizer_fingerprint
from kvbench.tasks import provenance
from kvbench.tasks.base import Sample, TaskDataset, register_data_preparer, register_task, select_datasets
from kvbench.tasks.text_inputs import (
    TextTokenizer,
    hub_download,
    load_essays,
    option_values,
    resolve_input_dir,
)

log = logging.getLogger(__name__)

NB_DIR = tasks_dir() / "needlebench"
_HERE = Path(__file__).resolve().parent
#: Source files whose code generates the samples (their hash is part of the sample-cache key).
_GENERATOR_SOURCES = (_HERE / "needlebench.py", _HERE / "text_inputs.py", _HERE / "base.py")
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

_SIZE_BY_LENGTH = {4096: "4k", 4000: "4k", 8192: "8k", 8000: "8k", 32768: "32k", 32000: "32k"}
_SIZE_BY_LENGTH.update({131072: "128k", 128000: "128k"})

_OPTION_DEFAULTS: dict[str, Any] = {
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
}

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


def _prompt_parts(group: str, language: str) -> tuple[str, str, str]:
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


# ---- inputs -------------------------------------------------------------------------------------------------------


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


#: Kinship statement templates (NeedleBench ATC, v1) and their Chinese renderings (ours).
_KIN_TEMPLATES = {
    "en": [
        "{A} is {B}'s {r}.",
        "{B}'s {r} is {A}.",
        "{A}, as {B}'s {r}, has a significant impact on {B}'s upbringing.",
        "{A} is not only {B}'s {r} but also {B}'s role model.",
        "{B} is the child of {A}.",
        "For {B}, {A} is not just a {r}, but also a friend.",
        "{A} plays the role of {B}'s {r} in {B}'s life.",
        "{B} considers {A} as their {r}.",
    ],
    "zh": [
        "{A}是{B}的{r}。",
        "{B}的{r}是{A}。",
        "{A}作为{B}的{r}，对{B}的成长有重要影响。",
        "{A}不仅是{B}的{r}，还是{B}的榜样。",
        "{B}是{A}的孩子。",
        "对于{B}来说，{A}不只是{r}，还是朋友。",
        "{A}在{B}的生活中扮演着{r}的角色。",
        "{B}把{A}当作自己的{r}。",
    ],
}
_KIN_TERMS = {
    "en": [
        "father",
        "mother",
        "dad",
        "mom",
        "grandfather",
        "grandmother",
        "maternal grandmother",
        "maternal grandfather",
        "paternal grandfather",
        "paternal grandmother",
    ],
    "zh": ["父亲", "母亲", "爸爸", "妈妈", "祖父", "祖母", "外祖母", "外祖父", "爷爷", "奶奶"],
}
_KIN_QUESTION = {
    "en": "Given the context described above, who is the eldest relative that '{last}' can trace back to in the "
    "context?",
    "zh": "根据上文描述的内容，'{last}'能够向上追溯到的最年长的亲人是谁？",
}


def synthetic_reasoning_records(language: str, counts: Sequence[int], per_count: int = 20) -> list[dict[str, Any]]:
    """M-RS records in the v1 schema (``derivation_count``, ``derivations``, ``answer``, ``question``), generated
    deterministically from kinship chains over ``tasks/needlebench/names.json`` (our substitute for the R4C-based
    ``multi_needle_reasoning_*.json``).  ``derivation_count`` statements link ``count + 1`` people; answer = eldest."""
    names = json.loads((NB_DIR / "names.json").read_text(encoding="utf-8"))[LANGUAGES[language]].split(",")
    records = []
    for count in counts:
        rng = random.Random(f"needlebench-mrs-{language}-{count}")
        for _ in range(per_count):
            chain = rng.sample(names, count + 1)
            statements = [
                rng.choice(_KIN_TEMPLATES[language]).format(A=older, B=younger, r=rng.choice(_KIN_TERMS[language]))
                for older, younger in itertools.pairwise(chain)
            ]
            rng.shuffle(statements)
            records.append(
                {
                    "derivation_count": count,
                    "derivations": statements,
                    "answer": chain[0],
                    "question": _KIN_QUESTION[language].format(last=chain[-1]),
                }
            )
    return records


_HOW_TO_GET = "python scripts/prepare_data.py needlebench --out data (read from data/needlebench, or set task.data_dir)"


class NeedleBenchInputs:
    """Haystack records, needles and M-RS records for both languages (tokenised records cached)."""

    def __init__(self, input_dir: Path | None, tok: TextTokenizer) -> None:
        self.input_dir = input_dir
        self.tok = tok
        #: Provenance record per input (``haystack_en``, ``haystack_zh``, ``needles``, ``reasoning_{en,zh}``).
        self.sources: dict[str, dict[str, Any]] = {}
        self._haystack: dict[str, list[str]] = {}
        self._tokens: dict[str, list[list[int] | None]] = {}
        self._needles: list[dict[str, Any]] | None = None
        self._reasoning: dict[str, list[dict[str, Any]]] = {}

    def _find(self, name: str, stand_in: Path) -> tuple[Path, dict[str, Any]]:
        """The official file ``name`` in the input folder, else ``stand_in`` (recorded as such)."""
        if self.input_dir is not None and (self.input_dir / name).is_file():
            return self.input_dir / name, provenance.official(self.input_dir / name)
        return stand_in, provenance.stand_in(stand_in, name, _HOW_TO_GET)

    def haystack(self, language: str) -> list[str]:
        """Haystack record texts in file order (EN: Paul Graham essays; ZH: ``zh_finance.jsonl``)."""
        if language not in self._haystack:
            if language == "en":
                texts, self.sources["haystack_en"] = load_essays(self.input_dir, "PaulGrahamEssays.jsonl", _HOW_TO_GET)
            else:
                path, self.sources["haystack_zh"] = self._find("zh_finance.jsonl", NB_DIR / "haystack_zh.jsonl")
                texts = [r["text"] for r in _read_jsonl(path)]
            self._haystack[language] = texts
            self._tokens[language] = [None] * len(texts)
        return self._haystack[language]

    def record_tokens(self, language: str, index: int) -> list[int]:
        """Token ids of haystack record ``index`` (tokenised once)."""
        self.haystack(language)
        cached = self._tokens[language][index]
        if cached is None:
            cached = self.tok.encode(self._haystack[language][index])
            self._tokens[language][index] = cached
        return cached

    def all_needles(self) -> list[dict[str, Any]]:
        """Every needle record of ``needles.jsonl`` (both languages), file order."""
        if self._needles is None:
            path, self.sources["needles"] = self._find("needles.jsonl", NB_DIR / "needles.jsonl")
            self._needles = _read_jsonl(path)
        return self._needles

    def needles(self, language: str) -> list[dict[str, Any]]:
        """Needle records of ``language`` (``needle``, ``retrieval_question``, ``arg1``, ``arg2``), file order."""
        return [n for n in self.all_needles() if n.get("language") == LANGUAGES[language]]

    def reasoning(self, language: str, counts: Sequence[int]) -> list[dict[str, Any]]:
        """M-RS records of ``language``."""
        if language not in self._reasoning:
            name = f"multi_needle_reasoning_{language}.json"
            if self.input_dir is not None and (self.input_dir / name).is_file():
                self._reasoning[language] = json.loads((self.input_dir / name).read_text(encoding="utf-8"))
                self.sources[f"reasoning_{language}"] = provenance.official(self.input_dir / name)
            else:
                self._reasoning[language] = synthetic_reasoning_records(language, counts)
                record = provenance.stand_in(NB_DIR / "names.json", name, _HOW_TO_GET)
                record["by"] = "kinship chains generated from names.json (synthetic_reasoning_records)"
                self.sources[f"reasoning_{language}"] = record
        return self._reasoning[language]


def unique_needles(
    needles: Sequence[dict[str, Any]], n: int, rng: random.Random, language: str
) -> list[dict[str, Any]]:
    """OpenCompass ``get_unique_entries``: shuffle all lines of the needle file, keep the entries of ``language``
    with unseen arg1, unseen arg2 and unseen (arg1, arg2), stop at ``n``.  (OpenCompass shuffles with the global RNG
    in whatever state earlier datasets left it; we use ``rng``, seeded with ``task.seed``.)"""
    pool = list(needles)
    rng.shuffle(pool)
    pool = [entry for entry in pool if entry.get("language") == LANGUAGES[language]]
    seen1: set[str] = set()
    seen2: set[str] = set()
    seen_pair: set[tuple[str, str]] = set()
    out = []
    for entry in pool:
        a1, a2 = entry.get("arg1", ""), entry.get("arg2", "")
        if a1 in seen1 or a2 in seen2 or (a1, a2) in seen_pair:
            continue
        seen1.add(a1)
        seen2.add(a2)
        seen_pair.add((a1, a2))
        out.append(entry)
        if len(out) == n:
            break
    if len(out) < n:
        raise ValueError(f"only {len(out)} unique needles available, {n} depths need one each")
    return out


# ---- dataset ----------------------------------------------------------------------------------------------------


class NeedleBenchDataset(TaskDataset):
    """One NeedleBench v1 subtask in one language, over every context length, depth and repeat."""

    def __init__(
        self,
        group: str,
        language: str,
        inputs: NeedleBenchInputs,
        *,
        lengths: Sequence[int],
        depths: Sequence[float],
        buffer: int,
        repeats: int,
        seed: int,
        guide: bool,
        max_new_tokens: int,
        needle_counts: Sequence[int] = (2, 3, 4, 5),
        num_samples: int | None = None,
        use_chat_template: bool = False,
    ) -> None:
        if group not in GROUPS or language not in LANGUAGES:
            raise ValueError(f"unknown NeedleBench subtask {group!r}/{language!r}")
        self.group = group
        self.language = language
        self.use_chat_template = use_chat_template
        self.name = f"{group}_{language}"
        self.inputs = inputs
        self.tok = inputs.tok
        self.lengths = [int(x) for x in lengths]
        self.depths = [float(d) for d in depths]
        self.buffer = buffer
        self.repeats = repeats
        self.seed = seed
        self.guide = guide
        self.max_new_tokens = max_new_tokens
        self.needle_counts = list(needle_counts)
        self.num_samples = num_samples
        self.metric_name = {
            "single_retrieval": "needlebench_origin",
            "multi_retrieval": "needlebench_parallel",
            "multi_reasoning": "needlebench_multi",
        }[group]
        self._samples: list[Sample] | None = None
        self._states: list[list[int]] | None = None

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info.update(
            group=self.group,
            language=self.language,
            lengths=self.lengths,
            depths=self.depths,
            buffer=self.buffer,
            repeats=self.repeats,
            guide=self.guide,
        )
        return info

    def _input_names(self) -> list[str]:
        names = [f"haystack_{self.language}"]
        names.append("needles" if self.group != "multi_reasoning" else f"reasoning_{self.language}")
        return names

    def provenance(self) -> dict[str, dict[str, Any]]:
        self.inputs.haystack(self.language)
        if self.group == "multi_reasoning":
            self.inputs.reasoning(self.language, self.needle_counts)
        else:
            self.inputs.all_needles()
        return {name: self.inputs.sources[name] for name in self._input_names()}

    def cache_key(self) -> dict[str, Any]:
        """Everything the samples depend on (see :mod:`kvbench.sample_cache`)."""
        return {
            "dataset": self.name,
            "lengths": self.lengths,
            "depths": self.depths,
            "buffer": self.buffer,
            "repeats": self.repeats,
            "seed": self.seed,
            "guide": self.guide,
            "needle_counts": self.needle_counts,
            "chat_template": self.use_chat_template,
            "tokenizer": tokenizer_fingerprint(self.tok.tokenizer),
            "inputs": {name: record.get("sha256") for name, record in self.provenance().items()},
            "code": source_fingerprint(_GENERATOR_SOURCES),
        }

    # -- generation --

    def _seed(self, counter: int) -> int:
        """OpenCompass's ``random.seed(counter)`` (shifted by ``task.seed - 42``)."""
        return self.seed - 42 + counter

    def _counter_orders(self) -> list[list[int]]:
        """Per counter: the haystack record order after ``random.seed(counter); random.shuffle(lines)``, the
        shuffles cumulative over counters (OpenCompass reuses one list within a dataset)."""
        if self._states is None:
            order = list(range(len(self.inputs.haystack(self.language))))
            orders = []
            for counter in range(self.repeats):
                random.Random(self._seed(counter)).shuffle(order)
                orders.append(list(order))
            self._states = orders
        return self._states

    def _haystack(self, order: Sequence[int], target: int) -> list[int]:
        tokens: list[int] = []
        for index in order:
            if len(tokens) >= target:
                break
            tokens.extend(self.inputs.record_tokens(self.language, index))
        if len(tokens) < target:  # our short shipped haystacks: cycle the shuffled records
            while len(tokens) < target:
                for index in order:
                    tokens.extend(self.inputs.record_tokens(self.language, index))
                    if len(tokens) >= target:
                        break
        return tokens[:target]

    def _cells(self) -> list[tuple[int, int, float | None, int | None]]:
        """(counter, length, depth, needle count) in sample order: counter outer, so a prefix is balanced."""
        cells = []
        for counter in range(self.repeats):
            for length in self.lengths:
                if self.group == "multi_retrieval":
                    cells.append((counter, length, None, None))
                    continue
                for depth in self.depths:
                    if self.group == "multi_reasoning":
                        cells += [(counter, length, depth, n) for n in self.needle_counts]
                    else:
                        cells.append((counter, length, depth, None))
        return cells

    def samples(self) -> list[Sample]:
        if self._samples is None:
            cells = self._cells()
            count = len(cells) if self.num_samples is None else min(self.num_samples, len(cells))
            self._samples = cached_samples(
                self.sample_cache,
                "needlebench",
                self.name,
                self.cache_key,
                count,
                lambda n: [self._make(*cell) for cell in cells[:n]],
            )
        return self._samples

    def _make(self, counter: int, length: int, depth: float | None, count: int | None) -> Sample:
        """One cell.  Every random choice reseeds with the counter, as OpenCompass (S-RT needle, M-RS record: seed
        then ``choice``; M-RT: seed then shuffle a fresh copy of the unique needles)."""
        order = self._counter_orders()[counter]
        extra: dict[str, Any] = {"context_length": length, "counter": counter, "group": self.group}
        if self.group == "single_retrieval":
            record = random.Random(self._seed(counter)).choice(self.inputs.needles(self.language))
            needles = ["\n" + record["needle"] + "\n"]
            question = record["retrieval_question"]
            answers = [record["arg2"]]
            extra.update(needle=needles[0], keyword=record["arg2"], depth=depth)
            points_pct = [depth]
        elif self.group == "multi_retrieval":
            base = unique_needles(self.inputs.all_needles(), len(self.depths), random.Random(self.seed), self.language)
            chosen = list(base)
            random.Random(self._seed(counter)).shuffle(chosen)
            needles = ["\n" + r["needle"] + "\n" for r in chosen]
            question = parallel_question(chosen, self.language)
            answers = [r["arg2"] for r in chosen]
            extra.update(keywords=answers, depths=self.depths)
            points_pct = list(self.depths)
        else:
            pool = [
                r for r in self.inputs.reasoning(self.language, self.needle_counts) if r["derivation_count"] == count
            ]
            if not pool:
                raise ValueError(f"no M-RS record with {count} needles for {self.language}")
            record = random.Random(self._seed(counter)).choice(pool)
            needles = ["\n" + d + "\n" for d in record["derivations"]]
            question = record["question"]
            answers = [record["answer"]]
            extra.update(depth=depth, num_needles=count)
            points_pct = [depth]
        if self.guide:
            question = guide_question(question, self.group, self.language)

        needle_tokens = [self.tok.encode(n) for n in needles]
        head, middle, tail = _prompt_parts(self.group, self.language)
        question = middle.lstrip("\n") + question + tail
        target = max(length - self.buffer - sum(len(t) for t in needle_tokens), 0)
        trimmed = 0
        while True:
            tokens = self._haystack(order, target - trimmed)
            tokens, starts = self._insert(tokens, needle_tokens, points_pct)
            context = head + self.tok.decode(tokens) + "\n\n"
            excess = self._prompt_tokens(context, question) - length
            if excess <= 0 or target - trimmed <= 0:
                break
            # OpenCompass's length buffer is sized for tiktoken; a tokenizer that spends more tokens on the prompt
            # text (e.g. SentencePiece on Chinese) would overshoot the context length: trim the haystack to fit.
            trimmed = min(trimmed + excess, target)
        extra["needle_token_starts"] = starts
        extra["needles"] = [needle.strip("\n") for needle in needles]
        extra["haystack_tokens"] = len(tokens)
        extra["haystack_trimmed"] = trimmed
        sample_id = f"{self.name}_L{length}"
        sample_id += f"_D{_fmt(depth)}" if depth is not None else ""
        sample_id += f"_N{count}" if count is not None else ""
        return Sample(id=f"{sample_id}_R{counter}", context=context, question=question, answers=answers, extra=extra)

    def _prompt_tokens(self, context: str, question: str) -> int:
        """Tokens of the whole model input, as the runner encodes it (chat template included when used)."""
        if self.tok.tokenizer is None:
            return self.tok.count(context + question)
        rendered = render_prompt(self.tok.tokenizer, context, question, use_chat_template=self.use_chat_template)
        return len(self.tok.tokenizer(rendered.text, add_special_tokens=not rendered.templated).input_ids)

    def _insert(
        self, tokens: list[int], needle_tokens: list[list[int]], depths: Sequence[float | None]
    ) -> tuple[list[int], list[int]]:
        """Insert needles: S-RT at ``int(L * d / 100)``; M-RT needle i at depth i (shifted by earlier needles);
        M-RS first at the depth, then ``prev + len(prev) + L * diff / 100``, clipped."""
        total = len(tokens)
        if self.group == "multi_retrieval":
            points, inserted = [], 0
            for needle, depth in zip(needle_tokens, depths, strict=True):
                point = min(int(total * (float(depth) / 100)) + inserted, len(tokens))
                tokens = tokens[:point] + needle + tokens[point:]
                points.append(point)
                inserted += len(needle)
            return tokens, points
        depth = float(depths[0])  # type: ignore[arg-type]
        points = []
        for i in range(len(needle_tokens)):
            if i == 0:
                point = int(total * (depth / 100))
            else:
                point = int(points[i - 1] + len(needle_tokens[i - 1]) + total * (REASONING_DIFF / 100))
            points.append(min(point, total + sum(len(t) for t in needle_tokens[:i])))
        shifted = list(points)
        for i, needle in enumerate(needle_tokens):
            tokens = tokens[: shifted[i]] + needle + tokens[shifted[i] :]
            for j in range(i + 1, len(shifted)):
                shifted[j] += len(needle)
        return tokens, shifted

    # -- scoring --

    def score(self, predictions: Sequence[str], samples: Sequence[Sample]) -> dict[str, float]:
        """``score`` (0-100, the OpenCompass group mean), plus ``length_{L}`` and ``depth_{d}`` (and M-RS
        ``needles_{n}``) breakdowns."""
        if len(predictions) != len(samples):
            raise ValueError(f"{len(predictions)} predictions for {len(samples)} samples")
        if not samples:
            return {"score": 0.0}
        if self.group == "multi_retrieval":
            return self._score_parallel(predictions, samples)
        if self.group == "single_retrieval":
            per = [
                needlebench_single_score(p, s.extra["needle"], s.extra["keyword"])
                for p, s in zip(predictions, samples, strict=True)
            ]
        else:
            per = [
                needlebench_multi_reasoning_score(p, s.answers[0]) for p, s in zip(predictions, samples, strict=True)
            ]
        result = {"score": float(np.mean(per))}
        for key, label in (("context_length", "length"), ("depth", "depth"), ("num_needles", "needles")):
            values = sorted({s.extra[key] for s in samples if key in s.extra})
            for value in values:
                cell = [x for x, s in zip(per, samples, strict=True) if s.extra.get(key) == value]
                result[f"{label}_{_fmt(value)}"] = float(np.mean(cell))
        return result

    def _score_parallel(self, predictions: Sequence[str], samples: Sequence[Sample]) -> dict[str, float]:
        by_length: dict[int, list[int]] = {}
        for i, s in enumerate(samples):
            by_length.setdefault(int(s.extra["context_length"]), []).append(i)
        result: dict[str, float] = {}
        per_length = []
        depth_scores: dict[str, list[float]] = {}
        for length, idx in sorted(by_length.items()):
            depths = samples[idx[0]].extra["depths"]
            scores = needlebench_parallel_scores(
                [predictions[i] for i in idx], [samples[i].extra["keywords"] for i in idx], depths
            )
            result[f"length_{length}"] = scores["average_score"]
            per_length.append(scores["average_score"])
            for key, value in scores.items():
                if key.startswith("Depth"):
                    depth_scores.setdefault(key, []).append(value)
        result["score"] = float(np.mean(per_length))
        for key, values in depth_scores.items():
            result[f"depth_{key[len('Depth') :]}"] = float(np.mean(values))
        return result


@register_task("needlebench")
def build_needlebench(task_cfg: Any, tokenizer: Any, chat_template: bool = False) -> list[TaskDataset]:
    """Builder: datasets ``{single_retrieval,multi_retrieval,multi_reasoning}_{en,zh}`` (``task.language`` keeps one
    language; ``task.lengths`` / ``task.depths`` override the size's context lengths / depths)."""
    opts = option_values(task_cfg, _OPTION_DEFAULTS, "needlebench")
    size = opts["size"] or _SIZE_BY_LENGTH.get(getattr(task_cfg, "length", None) or 4096)
    if size not in SIZES:
        raise ValueError(
            f"NeedleBench size {size!r} unknown; set task.options.size to one of {', '.join(SIZES)} "
            f"(or task.length to 4096/8192/32768/131072)"
        )
    spec = SIZES[size]
    language = getattr(task_cfg, "language", None)
    if language is not None and language not in LANGUAGES:
        raise ValueError(f"task.language must be one of {', '.join(LANGUAGES)} or null, got {language!r}")
    languages = [language] if language else list(LANGUAGES)
    available = [f"{g}_{lang}" for g in GROUPS for lang in languages]
    names = select_datasets(available, getattr(task_cfg, "datasets", None), "needlebench")

    repeats = dict(REPEATS)
    if opts["repeats"] is not None:
        repeats.update(opts["repeats"] if isinstance(opts["repeats"], dict) else dict.fromkeys(GROUPS, opts["repeats"]))
    max_new = opts["max_new_tokens"]
    max_new = dict(max_new) if isinstance(max_new, Mapping) else dict.fromkeys(GROUPS, int(max_new))
    unknown = sorted(set(max_new) - set(GROUPS))
    if unknown:
        raise ValueError(f"task.options.max_new_tokens: unknown group(s) {unknown}; valid: {', '.join(GROUPS)}")
    buffers = opts["buffers"] or {}
    lengths = list(getattr(task_cfg, "lengths", None) or spec.lengths)
    depths = list(getattr(task_cfg, "depths", None) or spec.depths)
    if any(not 0 <= float(d) <= 100 for d in depths):
        raise ValueError(f"needle depths must be in [0, 100], got {depths}")

    tok = TextTokenizer(tokenizer)
    inputs = NeedleBenchInputs(resolve_input_dir(task_cfg, "needlebench", opts["source"]), tok)
    datasets: list[TaskDataset] = []
    for name in names:
        group, _, lang = name.rpartition("_")
        if lang == "en":
            buffer = int(buffers.get("en", {}).get(group, spec.buffer_en[group]))
        else:
            buffer = int(buffers.get("zh", BUFFER_ZH))
        if any(int(x) <= buffer for x in lengths):  # official too (4k M-RT EN at 1000): the haystack is empty
            log.warning("%s: context lengths %s do not exceed the %d-token buffer", name, lengths, buffer)
        datasets.append(
            NeedleBenchDataset(
                group,
                lang,
                inputs,
                lengths=lengths,
                depths=depths,
                buffer=buffer,
                repeats=int(repeats[group]),
                seed=int(getattr(task_cfg, "seed", 42)),
                guide=bool(opts["guide"]),
                max_new_tokens=int(max_new[group]),
                needle_counts=opts["needle_counts"],
                num_samples=getattr(task_cfg, "num_samples", None),
                use_chat_template=chat_template,
            )
        )
    return datasets


_HUB_FILES = (
    "PaulGrahamEssays.jsonl",
    "zh_finance.jsonl",
    "needles.jsonl",
    "multi_needle_reasoning_en.json",
    "multi_needle_reasoning_zh.json",
    "names.json",
)


@register_data_preparer("needlebench")
def prepare_needlebench(target_dir: Path, **options: Any) -> None:
    """Download NeedleBench v1's inputs from the HF dataset ``opencompass/NeedleBench`` into ``target_dir``.

    Options: ``repo_id`` (default ``opencompass/NeedleBench``), ``files`` (list of file names).
    """
    repo_id = options.get("repo_id", "opencompass/NeedleBench")
    for name in options.get("files", _HUB_FILES):
        hub_download(repo_id, name, Path(target_dir))


def _fmt(value: float | int | None) -> str:
    if value is None:
        return ""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
