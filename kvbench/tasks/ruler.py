"""RULER's 13 synthetic tasks (``task=ruler``), generated with the model's own tokenizer.

Implements NVIDIA/RULER's generators (``scripts/data/synthetic/*.py``, HEAD) from the description in
shared/specs/benchmarks.md section 2: templates, answer prefixes, ``tokens_to_generate``, needle/haystack procedures,
the size search (one sample of ``incremental`` units estimates tokens per unit, a binary search finds the largest
unit count whose freshly generated sample fits, then every sample shrinks by ``incremental`` until it fits) and the
scoring (``string_match_all`` / ``string_match_part``).

Prompt (official ``prepare.py``: ``model_template.format(task_template) + answer_prefix``): the task text is the
user message of the model's chat template (when ``model.chat_template`` is on) and the answer prefix follows the
template's assistant header, so the model continues it (``Sample.answer_prefix``).  CWE's worked example is a
complete turn of its own (the official template, model template included, formatted with the example and followed by
its answer); VT's in-context example sits at the start of the user message, as officially.  The NIAH singular rewrite
("Some" -> "A", ...) applies to the task template only (officially it also hits the model template's text, e.g.
"You are" in some system prompts; the templates RULER ships have no such words).

Length constraint (every task, official): ``tokens(full templated input incl. answer prefix) + max_new_tokens <=
task.length``, tokens counted as RULER's ``text_to_tokens`` (``tokenizer.tokenize``: special tokens written in the
template count, none is added).  With no chat template the runner adds the BOS on top, as RULER's HF client does.

Prompt split (kvpress, followed by Ada-KV): ``context`` = instruction + haystack (and the VT/CWE in-context example),
``question`` = the final question sentence (+ the chat template's end of turn and assistant header + the answer
prefix).  ``options.answer_prefix: user`` is a named deviation: the answer prefix (and CWE's example answer) is
appended to the user message instead, as in prompts built from kvpress's RULER data with a chat template.

Inputs: the noise / needle haystacks, VT, CWE and FWE need nothing else; the essay haystack uses Paul Graham essays
(``PaulGrahamEssays.json``, RULER's ``scripts/data/synthetic/json`` layout), qa_1/qa_2 SQuAD v2.0 dev / HotpotQA
dev-distractor, NIAH keys and CWE words wonderwords' lists -- from ``task.data_dir`` (or ``./data/ruler``, where
``scripts/prepare_data.py ruler`` writes).  Missing files are replaced by shipped stand-ins (our filler essays, tiny
QA fixtures, ~1,000-word lists): recorded as such in metrics.json and warned about, never silently.
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
import string
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvbench.metrics.synthetic import ruler_postprocess, string_match_all, string_match_part
from kvbench.prompting import render_prompt
from kvbench.resources import tasks_dir
from kvbench.sample_cache import cached_samples, source_fingerprint, tokenizer_fingerprint
from kvbench.tasks import provenance
from kvbench.tasks.base import Sample, TaskDataset, register_data_preparer, register_task, select_datasets
from kvbench.tasks.text_inputs import (
    TextTokenizer,
    download,
    hub_download,
    load_essays,
    option_values,
    resolve_input_dir,
)

log = logging.getLogger(__name__)

RULER_DIR = tasks_dir() / "ruler"

# ---- constants (scripts/data/synthetic/constants.py, scripts/synthetic.yaml) --------------------------------------

NOISE_LINE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE_TEMPLATE = "One of the special magic {type_needle_v} for {key} is: {value}."
#: Essay insertion depths: ``np.round(np.linspace(0, 100, 40)).astype(int)``.
ESSAY_DEPTHS: list[int] = [int(d) for d in np.round(np.linspace(0, 100, 40)).astype(int)]

NIAH_INSTRUCTION = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {type_needle_v} afterwards.\n"
)
NIAH_QUESTION = "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?"
NIAH_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"

VT_INSTRUCTION = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
VT_QUESTION = "Question: Find all variables that are assigned the value {query} in the text above."
VT_PREFIX = (
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are assigned "
    "the value {query}, they are: "
)

CWE_INSTRUCTION = (
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n"
)
CWE_QUESTION = "Question: What are the 10 most common words in the above list?"
CWE_PREFIX = " Answer: The top 10 words that appear most often in the list are:"

FWE_INSTRUCTION = (
    "Read the following coded text and track the frequency of each coded word. "
    "Find the three most frequently appeared coded words. "
)
FWE_QUESTION = (
    "Question: Do not provide any explanation. Please ignore the dots '....'. "
    "What are the three most frequently appeared words in the above coded text?"
)
FWE_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"

QA_INSTRUCTION = (
    "Answer the question based on the given documents. Only give me the answer and do not output any other words."
)
QA_PREFIX = " Answer:"

#: ``tokens_to_generate`` per generator.
MAX_NEW_TOKENS: dict[str, int] = {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50, "qa": 32}


@dataclass(frozen=True)
class RulerTask:
    """One of the 13 tasks: generator name and its arguments (``scripts/synthetic.yaml``)."""

    name: str
    generator: str
    args: dict[str, Any] = field(default_factory=dict)


def _niah(name: str, haystack: str, k: str, v: str, nk: int = 1, nv: int = 1, nq: int = 1) -> RulerTask:
    args = dict(type_haystack=haystack, type_needle_k=k, type_needle_v=v, num_needle_k=max(nk, nq))
    args.update(num_needle_v=nv, num_needle_q=nq)
    return RulerTask(name, "niah", args)


TASKS: dict[str, RulerTask] = {
    t.name: t
    for t in (
        _niah("niah_single_1", "noise", "words", "numbers"),
        _niah("niah_single_2", "essay", "words", "numbers"),
        _niah("niah_single_3", "essay", "words", "uuids"),
        _niah("niah_multikey_1", "essay", "words", "numbers", nk=4),
        _niah("niah_multikey_2", "needle", "words", "numbers"),
        _niah("niah_multikey_3", "needle", "uuids", "uuids"),
        _niah("niah_multivalue", "essay", "words", "numbers", nv=4),
        _niah("niah_multiquery", "essay", "words", "numbers", nq=4),
        RulerTask("vt", "vt", {"num_chains": 1, "num_hops": 4}),
        RulerTask("cwe", "cwe", {"freq_cw": 30, "freq_ucw": 3, "num_cw": 10}),
        RulerTask("fwe", "fwe", {"alpha": 2.0, "coded_wordlen": 6}),
        RulerTask("qa_1", "qa", {"dataset": "squad"}),
        RulerTask("qa_2", "qa", {"dataset": "hotpotqa"}),
    )
}

_OPTION_DEFAULTS: dict[str, Any] = {
    #: Samples per task and length when task.num_samples is null (RULER: 500).
    "samples_per_task": 500,
    #: Override every task's tokens_to_generate (KVCache-Factory used 64); null = RULER's per-task values.
    "max_new_tokens": None,
    #: Where the answer prefix goes: "assistant" (official: after the chat template's assistant header) or "user"
    #: (named deviation: appended to the user message, CWE's example inline).
    "answer_prefix": "assistant",
    #: auto | shipped | hub (see kvbench.tasks.text_inputs.resolve_input_dir).
    "source": "auto",
}


# ---- inputs ---------------------------------------------------------------------------------------------------


def _read_words(name: str) -> list[str]:
    path = RULER_DIR / "words" / f"{name}.txt"
    return [w.strip() for w in path.read_text(encoding="utf-8").split() if w.strip()]


_WORD_FILES = {"adjectives": "adjectivelist.txt", "nouns": "nounlist.txt", "verbs": "verblist.txt"}
_HOW_TO_GET = "python scripts/prepare_data.py ruler --out data (read from data/ruler, or set task.data_dir)"


def load_word_lists(input_dir: Path | None) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """``{"adjectives", "nouns", "verbs"}`` word lists and their provenance record.

    wonderwords' ``adjectivelist.txt`` / ``nounlist.txt`` / ``verblist.txt`` are used when found in ``input_dir``
    or in an installed ``wonderwords`` package (as RULER does); otherwise our shipped lists (about 1,000 words).
    """
    folders: list[Path] = []
    if input_dir is not None:
        folders += [input_dir, input_dir / "wonderwords"]
    try:
        import wonderwords  # type: ignore[import-not-found]

        folders.append(Path(wonderwords.__file__).parent / "assets")
    except ImportError:
        pass
    for folder in folders:
        if all((folder / f).is_file() for f in _WORD_FILES.values()):
            words = {k: (folder / f).read_text(encoding="utf-8").split() for k, f in _WORD_FILES.items()}
            files = {f: provenance.file_sha256(folder / f) for f in _WORD_FILES.values()}
            return words, {"source": "official", "path": str(folder), "sha256": provenance.digest_of(files)}
    words = {k: _read_words(k) for k in _WORD_FILES}
    shipped = RULER_DIR / "words"
    files = {f"{k}.txt": provenance.file_sha256(shipped / f"{k}.txt") for k in _WORD_FILES}
    record = {"source": "stand-in", "path": str(shipped), "sha256": provenance.digest_of(files),
              "missing": "wonderwords adjectivelist.txt / nounlist.txt / verblist.txt",
              "how_to_get": "pip install wonderwords (RULER's word lists)"}  # fmt: skip
    return words, record


def _pseudo_words(count: int, exclude: set[str]) -> list[str]:
    """``count`` distinct pronounceable lower-case pseudo-words (deterministic), none in ``exclude``.

    Used for CWE when more distinct words are needed than the word lists hold (RULER samples from
    ``english_words.json`` there).
    """
    rng = random.Random(20240101)
    onsets = ["b", "br", "c", "ch", "d", "dr", "f", "fl", "g", "gr", "h", "j", "k", "l", "m", "n", "p", "pl", "r"]
    onsets += ["s", "sh", "st", "t", "tr", "v", "w", "z"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "oo", "ou"]
    codas = ["", "n", "r", "l", "m", "st", "nd", "ck", "sh", "t"]
    out: list[str] = []
    seen = set(exclude)
    while len(out) < count:
        word = "".join(rng.choice(onsets) + rng.choice(vowels) for _ in range(rng.randint(2, 3))) + rng.choice(codas)
        if word not in seen:
            seen.add(word)
            out.append(word)
    return out


@dataclass
class QACorpus:
    """RULER's QA inputs: sorted unique documents and questions pointing at their gold (and extra) documents."""

    docs: list[str]
    questions: list[dict[str, Any]]
    source: str


def read_squad(path: Path) -> QACorpus:
    """SQuAD v2.0 dev (``{"data": [{"paragraphs": [{"context", "qas": [...]}]}]}``), answerable questions only."""
    data = json.loads(path.read_text(encoding="utf-8"))["data"]
    docs = sorted({p["context"] for article in data for p in article["paragraphs"]})
    index = {d: i for i, d in enumerate(docs)}
    questions = []
    for article in data:
        article_docs = [index[p["context"]] for p in article["paragraphs"]]
        for paragraph in article["paragraphs"]:
            gold = index[paragraph["context"]]
            for qa in paragraph["qas"]:
                if qa.get("is_impossible", False):
                    continue
                questions.append(
                    {
                        "query": qa["question"],
                        "outputs": [a["text"] for a in qa["answers"]],
                        "context": [gold],
                        "more_context": [i for i in article_docs if i != gold],
                    }
                )
    return QACorpus(docs, questions, str(path))


def read_hotpotqa(path: Path) -> QACorpus:
    """HotpotQA dev distractor (list of ``{"question", "answer", "context": [[title, [sentences]], ...]}``)."""
    data = json.loads(path.read_text(encoding="utf-8"))

    def doc_text(title: str, sentences: Sequence[str]) -> str:
        return f"{title}\n{''.join(sentences)}"

    docs = sorted({doc_text(t, s) for record in data for t, s in record["context"]})
    index = {d: i for i, d in enumerate(docs)}
    questions = [
        {
            "query": record["question"],
            "outputs": [record["answer"]],
            "context": [index[doc_text(t, s)] for t, s in record["context"]],
            "more_context": [],
        }
        for record in data
    ]
    return QACorpus(docs, questions, str(path))


_QA_FILES = {
    "squad": (("dev-v2.0.json", "squad.json"), read_squad, "qa_fixture_squad.json"),
    "hotpotqa": (("hotpot_dev_distractor_v1.json", "hotpotqa.json"), read_hotpotqa, "qa_fixture_hotpotqa.json"),
}


def load_qa(dataset: str, input_dir: Path | None) -> tuple[QACorpus, dict[str, Any]]:
    """SQuAD / HotpotQA from ``input_dir`` (also its ``json/`` folder, RULER's layout) when present, else the shipped
    fixture (a stand-in: recorded and warned about by the runner)."""
    names, reader, fixture = _QA_FILES[dataset]
    if input_dir is not None:
        for folder in (input_dir, input_dir / "json"):
            for name in names:
                if (folder / name).is_file():
                    return reader(folder / name), provenance.official(folder / name)
    path = RULER_DIR / "qa" / fixture
    return reader(path), provenance.stand_in(path, names[0], _HOW_TO_GET)


# ---- generation -----------------------------------------------------------------------------------------------


@dataclass
class Generated:
    """One generated RULER sample before it becomes a :class:`Sample` (``shots``: worked examples, each ``(task
    text, answer prefix + answer)``, rendered as complete turns before the prompt)."""

    context: str
    question: str
    answer_prefix: str
    answers: list[str]
    extra: dict[str, Any] = field(default_factory=dict)
    shots: tuple[tuple[str, str], ...] = ()

    def as_sample_parts(self, answer_prefix_mode: str) -> dict[str, Any]:
        """``context``/``question``/``answer_prefix``/``shots`` of the :class:`Sample` for an answer-prefix mode."""
        if answer_prefix_mode == "assistant":
            return {"context": self.context, "question": self.question, "answer_prefix": self.answer_prefix,
                    "shots": self.shots}  # fmt: skip
        inline = "".join(user + reply + "\n" for user, reply in self.shots)
        return {"context": inline + self.context, "question": self.question + self.answer_prefix,
                "answer_prefix": "", "shots": ()}  # fmt: skip


def _zeta(s: float, terms: int = 1000) -> float:
    """Riemann zeta for s > 1 (direct sum plus Euler-Maclaurin tail; |error| < 1e-12 for s >= 1.5)."""
    if s <= 1:
        raise ValueError("zeta needs s > 1")
    head = sum(k ** (-s) for k in range(1, terms))
    n = float(terms)
    return head + n ** (1 - s) / (s - 1) + 0.5 * n ** (-s) + s * n ** (-s - 1) / 12


def _sentences(text: str) -> list[str]:
    """Sentence split (stand-in for ``nltk.sent_tokenize``): after ``.``, ``!`` or ``?`` (plus closing quotes)."""
    return [s for s in re.split(r"(?<=[.!?])[\"')\]]*\s+", text.strip()) if s]


class RulerGenerator:
    """Generates the samples of one RULER task at one length (deterministic for a seed).

    Lengths are measured on the prompt as the model will see it (``use_chat_template``: the model's chat template
    included; ``answer_prefix_mode``: where the answer prefix goes), in ``tokenizer.tokenize`` tokens.
    """

    def __init__(
        self,
        task: RulerTask,
        length: int,
        tok: TextTokenizer,
        seed: int,
        max_new_tokens: int,
        inputs: RulerInputs,
        *,
        use_chat_template: bool = False,
        answer_prefix_mode: str = "assistant",
    ) -> None:
        self.task = task
        self.length = length
        self.tok = tok
        self.seed = seed
        self.max_new_tokens = max_new_tokens
        self.inputs = inputs
        self.use_chat_template = use_chat_template
        self.answer_prefix_mode = answer_prefix_mode
        self.rng = random.Random(seed)
        self.args = task.args
        #: Smallest unit count a sample can be built with (VT needs one noise line per chain line).
        self.min_units = task.args["num_hops"] + 1 if task.generator == "vt" else 1

    # -- size search --

    def count(self, sample: Generated) -> int:
        """Tokens of the full model input (chat template and answer prefix included), RULER's ``text_to_tokens``."""
        if self.tok.tokenizer is None:
            return self.tok.count(sample.context + sample.question + sample.answer_prefix)
        parts = sample.as_sample_parts(self.answer_prefix_mode)
        text = render_prompt(self.tok.tokenizer, **parts, use_chat_template=self.use_chat_template).text
        return self.tok.count(text)

    def fits(self, sample: Generated) -> bool:
        return self.count(sample) + self.max_new_tokens <= self.length

    def shrink_unit(self, build: Callable[[int], Generated], incremental: int) -> int:
        """``incremental``, halved while a sample of that many units does not fit (only at lengths below what the
        official unit allows, e.g. a 500-word essay unit at 1K tokens; RULER itself would fail there)."""
        while incremental > 1 and not self.fits(build(incremental)):
            incremental //= 2
        return incremental

    def search(self, build: Callable[[int], Generated], incremental: int, upper: int | None = None) -> int:
        """Largest unit count (>= ``incremental``) whose freshly built sample fits (RULER HEAD's binary search)."""
        if upper is None:
            probe = build(incremental)
            per_unit = max(self.count(probe) / incremental, 1e-9)
            upper = max(int(self.length / per_unit * 3), 2 * incremental)
        lower, best = incremental, incremental
        while lower <= upper:
            mid = (lower + upper) // 2
            if self.fits(build(mid)):
                best, lower = mid, mid + 1
            else:
                upper = mid - 1
        return best

    def fit_sample(self, build: Callable[[int], Generated], units: int, incremental: int) -> Generated:
        """Build with ``units``; while too long, retry with ``units - incremental`` (error below one unit)."""
        while True:
            sample = build(units)
            if self.fits(sample):
                sample.extra["units"] = units
                return sample
            # Below one unit above the minimum, step by 1 (RULER itself would fail there).
            units = units - incremental if units - incremental >= self.min_units else units - 1
            if units < self.min_units:
                raise ValueError(
                    f"RULER {self.task.name}: cannot fit a sample into {self.length} tokens "
                    f"(template + {self.max_new_tokens} new tokens are too long)"
                )

    def generate(self, num_samples: int) -> list[Generated]:
        generator = getattr(self, f"_generate_{self.task.generator}")
        return generator(num_samples)

    def _depth(self, text: str, position: int) -> float:
        """Depth in percent of character offset ``position`` of ``text``, measured in tokens."""
        total = self.tok.count(text)
        return 100.0 * self.tok.count(text[:position]) / max(total, 1)

    # -- NIAH --

    def _random_value(self, kind: str) -> str:
        if kind == "numbers":
            return str(self.rng.randint(10**6, 10**7 - 1))
        if kind == "words":
            return self.rng.choice(self.inputs.niah_words)
        if kind == "uuids":
            return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        raise ValueError(f"unknown needle type {kind!r}")

    def _niah_templates(self) -> tuple[str, str, str, str]:
        """(instruction, question, answer prefix, value type) with RULER's singular rewrite when q*v == 1."""
        a = self.args
        instruction, question, prefix = NIAH_INSTRUCTION, NIAH_QUESTION, NIAH_PREFIX
        type_v = a["type_needle_v"]
        if a["num_needle_q"] * a["num_needle_v"] == 1:
            rewritten = []
            for text in (instruction, question, prefix):
                for old, new in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
                    text = text.replace(old, new)
                rewritten.append(text)
            instruction, question, prefix = rewritten
            type_v = type_v[:-1]
        return instruction, question, prefix, type_v

    def _build_niah(self, num_haystack: int) -> Generated:
        a = self.args
        rng = self.rng
        keys, values, needles = [], [], []
        for _ in range(a["num_needle_k"]):
            key = self._random_value(a["type_needle_k"])
            keys.append(key)
            vals = [self._random_value(a["type_needle_v"]) for _ in range(a["num_needle_v"])]
            values.append(vals)
            needles += [NEEDLE_TEMPLATE.format(type_needle_v=a["type_needle_v"], key=key, value=v) for v in vals]
        random.Random(self.seed).shuffle(needles)

        kind = a["type_haystack"]
        if kind == "essay":
            words = self.inputs.essay_words
            if num_haystack > len(words):
                words = words * math.ceil(num_haystack / len(words))
            sentences = _sentences(" ".join(words[:num_haystack]))
            points = sorted(int(len(sentences) * d / 100) for d in rng.sample(ESSAY_DEPTHS, len(needles)))
            pieces, last = [], 0
            for point, needle in zip(points, needles, strict=True):
                pieces += [*sentences[last:point], needle]
                last = point
            pieces += sentences[last:]
            haystack = " ".join(pieces)
        else:
            if kind == "noise":
                lines = [NOISE_LINE] * num_haystack
            elif kind == "needle":
                lines = [
                    NEEDLE_TEMPLATE.format(
                        type_needle_v=a["type_needle_v"],
                        key=self._random_value(a["type_needle_k"]),
                        value=self._random_value(a["type_needle_v"]),
                    )
                    for _ in range(num_haystack)
                ]
            else:
                raise ValueError(f"unknown haystack type {kind!r}")
            if num_haystack < len(needles):
                raise ValueError("haystack shorter than the number of needles")
            for index, needle in zip(
                sorted(rng.sample(range(num_haystack), len(needles)), reverse=True), needles, strict=True
            ):
                lines.insert(index, needle)
            haystack = "\n".join(lines)

        queried = rng.sample(range(a["num_needle_k"]), a["num_needle_q"])
        answers = [v for i in queried for v in values[i]]
        query_keys = [keys[i] for i in queried]
        query = query_keys[0] if len(query_keys) == 1 else ", ".join(query_keys[:-1]) + ", and " + query_keys[-1]
        instruction, question, prefix, type_v = self._niah_templates()
        head = instruction.format(type_needle_v=type_v)
        return Generated(
            context=head + haystack + "\n",
            question=question.format(type_needle_v=type_v, query=query),
            answer_prefix=prefix.format(type_needle_v=type_v, query=query),
            answers=answers,
            extra={"needles": needles, "query_keys": query_keys, "_haystack": haystack},
        )

    def _generate_niah(self, num_samples: int) -> list[Generated]:
        incremental = 500 if self.args["type_haystack"] == "essay" else (25 if self.length >= 4096 else 5)
        incremental = self.shrink_unit(self._build_niah, incremental)
        units = self.search(self._build_niah, incremental)
        out = []
        for _ in range(num_samples):
            sample = self.fit_sample(self._build_niah, units, incremental)
            haystack = sample.extra.pop("_haystack")
            depths = []
            for needle in sample.extra["needles"]:
                pos = haystack.find(needle)
                depths.append(round(self._depth(haystack, pos), 2) if pos >= 0 else None)
            sample.extra["needle_depths"] = depths
            first = next(
                (
                    d
                    for n, d in zip(sample.extra["needles"], depths, strict=True)
                    if any(a in n for a in sample.answers)
                ),
                None,
            )
            sample.extra["depth"] = first
            out.append(sample)
        return out

    # -- variable tracking --

    def _names(self, count: int, size: int, taken: set[str]) -> list[str]:
        names: list[str] = []
        while len(names) < count:
            name = "".join(self.rng.choices(string.ascii_uppercase, k=size))
            if name not in taken and name != "VAR":
                taken.add(name)
                names.append(name)
        return names

    def _vt_text(self, num_noises: int, size: int, value: str | None) -> tuple[str, list[str], str]:
        """(haystack with the chain(s), names of chain 0, value of chain 0)."""
        a = self.args
        taken: set[str] = set()
        chains: list[list[str]] = []
        first_names: list[str] = []
        first_value = ""
        for j in range(a["num_chains"]):
            names = self._names(a["num_hops"] + 1, size, taken)
            chain_value = value if value is not None else str(self.rng.randint(10000, 99998))
            lines = [f"VAR {names[0]} = {chain_value}"]
            lines += [f"VAR {names[i + 1]} = VAR {names[i]} " for i in range(a["num_hops"])]
            chains.append(lines)
            if j == 0:
                first_names, first_value = names, chain_value
        sentences = [NOISE_LINE] * num_noises
        for chain in chains:
            positions = sorted(self.rng.sample(range(len(sentences)), len(chain)))
            for offset, (pos, line) in enumerate(zip(positions, chain, strict=True)):
                sentences.insert(pos + offset, line)
        haystack = "\n".join(sentences).replace(". \n", ".\n")
        return haystack, first_names, first_value

    def _build_vt_icl_probe(self, num_noises: int) -> Generated:
        haystack, names, value = self._vt_text(num_noises, 3, "12345")
        num_v = self.args["num_hops"] + 1
        return Generated(
            context=VT_INSTRUCTION + haystack + "\n",
            question=VT_QUESTION.format(query=value),
            answer_prefix=VT_PREFIX.format(num_v=num_v, query=value),
            answers=names,
        )

    def _randomized_icl(self) -> str:
        text = self._icl
        for name in self._icl_names:
            text = text.replace(name, "".join(self.rng.choices(string.ascii_uppercase, k=len(name))))
        return text.replace("12345", str(self.rng.randint(10000, 99998)))

    def _build_vt(self, num_noises: int) -> Generated:
        icl = self._randomized_icl() + "\n"
        haystack, names, value = self._vt_text(num_noises, 5, None)
        num_v = self.args["num_hops"] + 1
        return Generated(
            context=icl + VT_INSTRUCTION + haystack + "\n",
            question=VT_QUESTION.format(query=value),
            answer_prefix=VT_PREFIX.format(num_v=num_v, query=value),
            answers=names,
            extra={"_haystack": haystack, "_first_line": f"VAR {names[0]} = {value}"},
        )

    def _generate_vt(self, num_samples: int) -> list[Generated]:
        # One-shot example: a 500-token sample (5-noise-line units, no answer budget), 3-letter names, value 12345.
        # A tokenizer too verbose for even 5 noise lines in 500 tokens (e.g. byte-level) gets the minimal example.
        # The example is sized with the raw task template (no model template), as officially.
        outer = self.length, self.max_new_tokens, self.use_chat_template, self.answer_prefix_mode
        self.length, self.max_new_tokens, self.use_chat_template, self.answer_prefix_mode = 500, 0, False, "user"
        try:
            icl_units = self.search(self._build_vt_icl_probe, 5)
            probe = self.fit_sample(self._build_vt_icl_probe, icl_units, 5)
        except ValueError:
            probe = self._build_vt_icl_probe(self.min_units)
        finally:
            self.length, self.max_new_tokens, self.use_chat_template, self.answer_prefix_mode = outer
        self._icl = probe.context + probe.question + probe.answer_prefix + " " + " ".join(probe.answers) + "\n"
        self._icl_names = probe.answers
        incremental = 10 if self.length >= 4096 else 5
        units = self.search(self._build_vt, incremental)
        out = []
        for _ in range(num_samples):
            sample = self.fit_sample(self._build_vt, units, incremental)
            haystack, line = sample.extra.pop("_haystack"), sample.extra.pop("_first_line")
            sample.extra["depth"] = round(self._depth(haystack, haystack.find(line)), 2)
            out.append(sample)
        return out

    # -- common words extraction --

    def _cwe_pool(self, needed: int) -> list[str]:
        words = self.inputs.cwe_words
        if needed <= len(words):
            return words
        if len(self.inputs.cwe_extra) < needed:
            self.inputs.cwe_extra = words + _pseudo_words(needed - len(words), set(words))
        return self.inputs.cwe_extra

    def _cwe_example(self, num_words: int, common_repeats: int, uncommon_repeats: int, common_nums: int):
        pool = self._cwe_pool(num_words)
        chosen = self.rng.sample(pool, num_words)
        common, uncommon = chosen[:common_nums], chosen[common_nums:]
        word_list = common * common_repeats + uncommon * uncommon_repeats
        random.Random(self.seed).shuffle(word_list)
        return " ".join(f"{i + 1}. {w}" for i, w in enumerate(word_list)), common

    def _build_cwe(self, num_words: int) -> Generated:
        a = self.args
        if self.length < 4096:
            shot_ctx, shot_answer = self._cwe_example(20, 3, 1, a["num_cw"])
            ctx, answer = self._cwe_example(num_words, 6, 1, a["num_cw"])
        else:
            shot_ctx, shot_answer = self._cwe_example(40, 10, 3, a["num_cw"])
            ctx, answer = self._cwe_example(num_words, a["freq_cw"], a["freq_ucw"], a["num_cw"])
        shot_reply = CWE_PREFIX + " " + " ".join(f"{i + 1}. {w}" for i, w in enumerate(shot_answer))
        return Generated(
            context=CWE_INSTRUCTION + ctx + "\n",
            question=CWE_QUESTION,
            answer_prefix=CWE_PREFIX,
            answers=answer,
            shots=((CWE_INSTRUCTION + shot_ctx + "\n" + CWE_QUESTION, shot_reply),),
        )

    def _generate_cwe(self, num_samples: int) -> list[Generated]:
        probe_words = 4096
        per_word = max(self.count(self._build_cwe(probe_words)) / probe_words, 1e-9)
        units = self.search(self._build_cwe, 10, upper=int(self.length // per_word) * 2)
        return [self.fit_sample(self._build_cwe, units, 10) for _ in range(num_samples)]

    # -- frequent words extraction --

    def _fwe_vocab(self, vocab_size: int) -> list[str]:
        words: set[str] = set()
        while len(words) < vocab_size:
            words.add("".join(self.rng.choices(string.ascii_lowercase, k=self.args["coded_wordlen"])))
        vocab = sorted(words)
        random.Random(self.seed).shuffle(vocab)
        vocab[0] = "..."
        return vocab

    def _build_fwe(self, vocab: list[str], num_words: int) -> Generated:
        alpha = self.args["alpha"]
        ranks = np.arange(1, len(vocab) + 1, dtype=float)
        counts = (num_words * ranks ** (-alpha) / _zeta(alpha)).astype(int)
        words = [w for w, c in zip(vocab, counts, strict=True) for _ in range(int(c))]
        random.Random(self.seed).shuffle(words)
        return Generated(
            context=FWE_INSTRUCTION + " ".join(words) + "\n",
            question=FWE_QUESTION,
            answer_prefix=FWE_PREFIX,
            answers=vocab[1:4],
        )

    def _generate_fwe(self, num_samples: int) -> list[Generated]:
        budget = self.length - self.max_new_tokens
        vocab_size = max(budget // 50, 4)
        step = max(budget // 32, 1)
        num_words = max(budget // 6, 1)
        vocab = self._fwe_vocab(vocab_size)
        while self.count(self._build_fwe(vocab, num_words)) < budget:
            num_words += step
        num_words = max(num_words - step, step)
        out = []
        for _ in range(num_samples):
            vocab = self._fwe_vocab(vocab_size)
            words = num_words
            sample = self._build_fwe(vocab, words)
            while self.count(sample) > budget:
                words -= step
                if words <= 0:
                    raise ValueError(f"RULER fwe: cannot fit a sample into {self.length} tokens")
                sample = self._build_fwe(vocab, words)
            sample.extra["units"] = words
            out.append(sample)
        return out

    # -- QA --

    def _build_qa(self, index: int, num_docs: int) -> Generated:
        corpus = self.inputs.qa_corpus(self.args["dataset"])
        record = corpus.questions[index]
        gold, more = list(record["context"]), list(record["more_context"])
        if num_docs < len(corpus.docs):
            if num_docs - len(gold) > len(more):
                taken = set(gold) | set(more)
                remaining = [i for i in range(len(corpus.docs)) if i not in taken]
                extra_count = max(0, num_docs - len(gold) - len(more))
                chosen = gold + more + self.rng.sample(remaining, min(extra_count, len(remaining)))
            else:
                chosen = gold + self.rng.sample(more, max(num_docs - len(gold), 0))
        else:
            repeats = math.ceil(num_docs / len(corpus.docs))
            chosen = (list(range(len(corpus.docs))) * repeats)[:num_docs]
            missing = [g for g in gold if g not in chosen]
            chosen = chosen[: len(chosen) - len(missing)] + missing
        docs = [corpus.docs[i] for i in chosen]
        random.Random(self.seed).shuffle(docs)
        documents = "\n\n".join(f"Document {i + 1}:\n{d}" for i, d in enumerate(docs))
        return Generated(
            context=QA_INSTRUCTION + "\n\nThe following are given documents.\n\n" + documents + "\n\n",
            question=QA_INSTRUCTION + "\n\nQuestion: " + record["query"],
            answer_prefix=QA_PREFIX,
            answers=list(record["outputs"]),
            extra={"num_docs": num_docs, "question_index": index},
        )

    def _generate_qa(self, num_samples: int) -> list[Generated]:
        corpus = self.inputs.qa_corpus(self.args["dataset"])
        if num_samples > len(corpus.questions):
            log.warning(
                "RULER %s: only %d questions in %s; generating %d samples",
                self.task.name,
                len(corpus.questions),
                corpus.source,
                len(corpus.questions),
            )
            num_samples = len(corpus.questions)
        incremental = self.shrink_unit(lambda n: self._build_qa(0, n), 10)
        units = self.search(lambda n: self._build_qa(0, n), incremental)
        return [self.fit_sample(lambda n, i=i: self._build_qa(i, n), units, incremental) for i in range(num_samples)]


class RulerInputs:
    """Everything the generators read: word lists, essay words and QA corpora (the last two loaded lazily)."""

    def __init__(self, input_dir: Path | None) -> None:
        self.input_dir = input_dir
        self.words, words_record = load_word_lists(input_dir)
        self.niah_words = sorted({f"{adj}-{noun}" for adj in self.words["adjectives"] for noun in self.words["nouns"]})
        self.cwe_words = sorted(set(self.words["nouns"] + self.words["adjectives"] + self.words["verbs"]))
        self.cwe_extra: list[str] = []
        #: Provenance record per input name (``words``, ``essays``, ``squad``, ``hotpotqa``), filled as loaded.
        self.records: dict[str, dict[str, Any]] = {"words": words_record}
        self._essay_words: list[str] | None = None
        self._qa: dict[str, QACorpus] = {}

    @property
    def essay_words(self) -> list[str]:
        """Whitespace-normalised words of all essays (RULER: ``re.sub(r"\\s+", " ", text).split(" ")``)."""
        if self._essay_words is None:
            essays, self.records["essays"] = load_essays(self.input_dir, "PaulGrahamEssays.json", _HOW_TO_GET)
            self._essay_words = re.sub(r"\s+", " ", " ".join(essays)).strip().split(" ")
        return self._essay_words

    def qa_corpus(self, dataset: str) -> QACorpus:
        """The SQuAD (``squad``) or HotpotQA (``hotpotqa``) corpus, loaded on first use."""
        if dataset not in self._qa:
            self._qa[dataset], self.records[dataset] = load_qa(dataset, self.input_dir)
        return self._qa[dataset]

    def used_by(self, task: RulerTask) -> dict[str, dict[str, Any]]:
        """Provenance records of the inputs ``task`` reads (loading them if needed)."""
        records = {"generator": provenance.generated(f"kvbench RULER {task.generator} generator")}
        names = []
        if task.generator == "niah":
            if task.args["type_haystack"] == "essay":
                self.essay_words  # noqa: B018  (loads the essays and records where from)
                names.append("essays")
            if "words" in (task.args["type_needle_k"], task.args["type_needle_v"]):
                names.append("words")
        elif task.generator == "cwe":
            names.append("words")
        elif task.generator == "qa":
            self.qa_corpus(task.args["dataset"])
            names.append(task.args["dataset"])
        records.update({name: self.records[name] for name in names})
        return records


# ---- datasets ---------------------------------------------------------------------------------------------------


ANSWER_PREFIX_MODES = ("assistant", "user")
#: Source files whose code generates the samples (their hash is part of the sample-cache key).
_HERE = Path(__file__).resolve().parent
_GENERATOR_SOURCES = (_HERE / "ruler.py", _HERE / "text_inputs.py", _HERE / "base.py", _HERE.parent / "prompting.py")


class RulerDataset(TaskDataset):
    """One RULER task at one target length; samples are generated on first use (or read from the sample cache)."""

    def __init__(
        self,
        task: RulerTask,
        length: int,
        tokenizer: Any,
        inputs: RulerInputs,
        *,
        num_samples: int,
        seed: int,
        max_new_tokens: int | None = None,
        answer_prefix: str = "assistant",
        name: str | None = None,
        use_chat_template: bool = False,
    ) -> None:
        if answer_prefix not in ANSWER_PREFIX_MODES:
            raise ValueError(
                f"task.options.answer_prefix={answer_prefix!r}; valid values: {', '.join(ANSWER_PREFIX_MODES)}"
            )
        self.task = task
        self.use_chat_template = use_chat_template
        self.length = length
        self.tok = TextTokenizer(tokenizer)
        self.inputs = inputs
        self.num_samples = num_samples
        self.seed = seed
        self.name = name or task.name
        self.max_new_tokens = max_new_tokens or MAX_NEW_TOKENS[task.generator]
        self.answer_prefix_mode = answer_prefix
        self.metric_name = "string_match_part" if task.generator == "qa" else "string_match_all"
        self._samples: list[Sample] | None = None

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info.update(
            task=self.task.name,
            length=self.length,
            seed=self.seed,
            answer_prefix=self.answer_prefix_mode,
            length_counts_chat_template=self.use_chat_template,
        )
        return info

    def provenance(self) -> dict[str, dict[str, Any]]:
        return self.inputs.used_by(self.task)

    def cache_key(self) -> dict[str, Any]:
        """Everything the samples depend on (see :mod:`kvbench.sample_cache`)."""
        return {
            "task": self.task.name,
            "generator": self.task.generator,
            "args": self.task.args,
            "length": self.length,
            "seed": self.seed,
            "max_new_tokens": self.max_new_tokens,
            "answer_prefix": self.answer_prefix_mode,
            "chat_template": self.use_chat_template,
            "tokenizer": tokenizer_fingerprint(self.tok.tokenizer),
            "inputs": {name: record.get("sha256", record.get("by")) for name, record in self.provenance().items()},
            "code": source_fingerprint(_GENERATOR_SOURCES),
        }

    def samples(self) -> list[Sample]:
        if self._samples is None:
            self._samples = cached_samples(
                self.sample_cache, "ruler", self.name, self.cache_key, self.num_samples, self.generate_samples
            )
        return self._samples

    def generate_samples(self, count: int) -> list[Sample]:
        """Generate ``count`` samples (no cache)."""
        generator = RulerGenerator(
            self.task,
            self.length,
            self.tok,
            self.seed,
            self.max_new_tokens,
            self.inputs,
            use_chat_template=self.use_chat_template,
            answer_prefix_mode=self.answer_prefix_mode,
        )
        out = []
        for i, gen in enumerate(generator.generate(count)):
            prompt_tokens = generator.count(gen)
            extra = dict(gen.extra)
            extra.update(
                task=self.task.name,
                target_length=self.length,
                prompt_tokens=prompt_tokens,
                length_with_generation=prompt_tokens + self.max_new_tokens,
            )
            parts = gen.as_sample_parts(self.answer_prefix_mode)
            out.append(Sample(id=f"{self.task.name}_{self.length}_{i}", answers=gen.answers, extra=extra, **parts))
        return out

    def postprocess(self, prediction: str) -> str:
        return ruler_postprocess(prediction)

    def score(self, predictions: Sequence[str], samples: Sequence[Sample]) -> dict[str, float]:
        """``score`` (0-100, string_match_all or _part per RULER) and ``nulls`` (empty predictions)."""
        refs = [s.answers for s in samples]
        fn = string_match_part if self.metric_name == "string_match_part" else string_match_all
        return {"score": fn(predictions, refs), "nulls": float(sum(not p.strip() for p in predictions))}


@register_task("ruler")
def build_ruler(task_cfg: Any, tokenizer: Any, chat_template: bool = False) -> list[TaskDataset]:
    """Builder: one dataset per selected task (``task.datasets``) and length (``task.lengths`` or ``task.length``).

    With several lengths the dataset names get a ``_{length}`` suffix (``niah_single_1_4096``).
    """
    opts = option_values(task_cfg, _OPTION_DEFAULTS, "ruler")
    names = select_datasets(list(TASKS), getattr(task_cfg, "datasets", None), "ruler")
    lengths = list(getattr(task_cfg, "lengths", None) or [getattr(task_cfg, "length", None) or 4096])
    if any(int(x) < 256 for x in lengths):
        raise ValueError(f"RULER lengths must be at least 256 tokens, got {lengths}")
    num_samples = getattr(task_cfg, "num_samples", None) or int(opts["samples_per_task"])
    inputs = RulerInputs(resolve_input_dir(task_cfg, "ruler", opts["source"]))
    datasets: list[TaskDataset] = []
    for length in lengths:
        for name in names:
            datasets.append(
                RulerDataset(
                    TASKS[name],
                    int(length),
                    tokenizer,
                    inputs,
                    num_samples=num_samples,
                    seed=int(getattr(task_cfg, "seed", 42)),
                    max_new_tokens=opts["max_new_tokens"],
                    answer_prefix=opts["answer_prefix"],
                    name=name if len(lengths) == 1 else f"{name}_{length}",
                    use_chat_template=chat_template,
                )
            )
    return datasets


_SQUAD_URL = "https://rajpurkar.github.io/SQuAD-explorer/dataset/dev-v2.0.json"
_HOTPOT_URL = "http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_dev_distractor_v1.json"


@register_data_preparer("ruler")
def prepare_ruler(target_dir: Path, **options: Any) -> None:
    """Fetch RULER's external inputs into ``target_dir``: SQuAD v2.0 dev, HotpotQA dev-distractor (the URLs of
    RULER's ``download_qa_dataset.sh``) and Paul Graham essays (``PaulGrahamEssays.jsonl`` of the HF dataset
    ``opencompass/NeedleBench``).  Options: ``squad_url``, ``hotpotqa_url``, ``essays_repo``."""
    target = Path(target_dir)
    download(options.get("squad_url", _SQUAD_URL), target / "dev-v2.0.json")
    download(options.get("hotpotqa_url", _HOTPOT_URL), target / "hotpot_dev_distractor_v1.json")
    hub_download(options.get("essays_repo", "opencompass/NeedleBench"), "PaulGrahamEssays.jsonl", target)
