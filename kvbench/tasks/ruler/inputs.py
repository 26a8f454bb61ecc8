"""What RULER's generators read, with provenance: wonderwords' word lists, the essay haystack, SQuAD / HotpotQA
(:class:`RulerInputs`); shipped stand-ins when the official files are absent."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvbench.resources import tasks_dir
from kvbench.tasks import provenance
from kvbench.tasks.ruler.spec import RulerTask
from kvbench.tasks.text_inputs import load_essays

RULER_DIR = tasks_dir() / "ruler"


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


def pseudo_words(count: int, exclude: set[str]) -> list[str]:
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
        self._english_words: list[str] | None = None
        self._qa: dict[str, QACorpus] = {}

    @property
    def essay_words(self) -> list[str]:
        """Whitespace-normalised words of all essays, RULER's ``re.sub(r"\\s+", " ", text).split(" ")`` (no strip: a
        text ending in whitespace gives a last empty word, as officially)."""
        if self._essay_words is None:
            essays, self.records["essays"] = load_essays(self.input_dir, "PaulGrahamEssays.json", _HOW_TO_GET)
            self._essay_words = re.sub(r"\s+", " ", " ".join(essays)).split(" ")
        return self._essay_words

    @property
    def english_words(self) -> list[str] | None:
        """RULER's ``english_words.json`` values (CWE's pool beyond the word lists) when the input folder has it
        (``english_words.json`` or ``json/english_words.json``), else ``None``."""
        if self._english_words is None and self.input_dir is not None:
            for path in (self.input_dir / "english_words.json", self.input_dir / "json" / "english_words.json"):
                if path.is_file():
                    self._english_words = list(json.loads(path.read_text(encoding="utf-8")).values())
                    self.records["english_words"] = provenance.official(path)
                    break
        return self._english_words

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
            if self.english_words is not None:
                names.append("english_words")
        elif task.generator == "qa":
            self.qa_corpus(task.args["dataset"])
            names.append(task.args["dataset"])
        records.update({name: self.records[name] for name in names})
        return records
