"""What NeedleBench's generators read, with provenance: haystack records, needles and multi-needle reasoning
records per language (:class:`NeedleBenchInputs`); shipped stand-ins when the official files are absent."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvbench.resources import tasks_dir
from kvbench.tasks import provenance
from kvbench.tasks.needlebench.spec import LANGUAGES
from kvbench.tasks.text_inputs import (
    TextTokenizer,
    load_essays,
)

NB_DIR = tasks_dir() / "needlebench"


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
