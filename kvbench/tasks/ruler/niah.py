"""RULER's needle-in-a-haystack family (8 tasks: single, multi-key, multi-value, multi-query; noise, essay or
needle haystacks)."""

from __future__ import annotations

import math
import random
import re
import uuid

from kvbench.tasks.ruler.sizing import Generated, SizedGenerator
from kvbench.tasks.ruler.spec import (
    ESSAY_DEPTHS,
    NEEDLE_TEMPLATE,
    NIAH_INSTRUCTION,
    NIAH_PREFIX,
    NIAH_QUESTION,
    NOISE_LINE,
)


def _sentences(text: str) -> list[str]:
    """Sentence split (stand-in for ``nltk.sent_tokenize``): after ``.``, ``!`` or ``?`` (plus closing quotes)."""
    return [s for s in re.split(r"(?<=[.!?])[\"')\]]*\s+", text.strip()) if s]


def join_at_depths(sentences: list[str], points: list[int], needles: list[str]) -> str:
    """RULER's essay insertion: the sentences between consecutive insertion points (``0``, the sorted ``points``,
    ``len(sentences)``) joined by spaces, each run followed by its needle, everything joined by spaces.  An empty run
    (a needle at depth 0 or 100, two needles at one point) stays an empty piece, so the text gets a leading,
    trailing or double space exactly as RULER's."""
    bounds = [0, *points, len(sentences)]
    pieces: list[str] = []
    for i in range(1, len(bounds)):
        pieces.append(" ".join(sentences[bounds[i - 1] : bounds[i]]))
        if i - 1 < len(needles):
            pieces.append(needles[i - 1])
    return " ".join(pieces)


class NiahGenerator(SizedGenerator):
    """The NIAH tasks: needles (key -> value sentences) inserted in a haystack; the question asks for the values
    of the queried keys."""

    def _random_value(self, kind: str) -> str:
        if kind == "numbers":
            return str(self.rng.randint(10**6, 10**7 - 1))
        if kind == "words":
            return self.rng.choice(self.inputs.niah_words)
        if kind == "uuids":
            return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        raise ValueError(f"unknown needle type {kind!r}")

    def _niah_templates(self) -> tuple[str, str, str, str, str, str]:
        """(instruction, question, answer prefix, value type, template head, template tail) with RULER's singular
        rewrite when q*v == 1 (applied, as officially, to the whole template: the model template's text too)."""
        a = self.args
        instruction, question, prefix = NIAH_INSTRUCTION, NIAH_QUESTION, NIAH_PREFIX
        head, tail = self.template_head, self.template_tail
        type_v = a["type_needle_v"]
        if a["num_needle_q"] * a["num_needle_v"] == 1:
            rewritten = []
            for text in (instruction, question, prefix, head, tail):
                for old, new in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
                    text = text.replace(old, new)
                rewritten.append(text)
            instruction, question, prefix, head, tail = rewritten
            type_v = type_v[:-1]
        return instruction, question, prefix, type_v, head, tail

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
            haystack = join_at_depths(sentences, points, needles)
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
        instruction, question, prefix, type_v, head, tail = self._niah_templates()
        sample = Generated(
            context=instruction.format(type_needle_v=type_v) + haystack + "\n",
            question=question.format(type_needle_v=type_v, query=query),
            answer_prefix=prefix.format(type_needle_v=type_v, query=query),
            answers=answers,
            extra={"needles": needles, "query_keys": query_keys, "_haystack": haystack},
        )
        return self._wrap(sample, head, tail)

    def _generate_niah(self, num_samples: int) -> list[Generated]:
        incremental = 500 if self.args["type_haystack"] == "essay" else (25 if self.length >= 4096 else 5)
        incremental, units = self.search(self._build_niah, incremental)
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
