"""Scorers of the synthetic long-context benchmarks: RULER, NeedleBench (v1, 2024) and the needle grid.

Definitions follow ``shared/specs/benchmarks.md`` sections 2.5, 3.5, 3.7 and 4.2; every function names the official
scorer it re-implements.  All functions are pure Python (no model, no tokenizer).

Scales
------
* RULER task scores and NeedleBench scores are on 0-100.
* Needle-grid per-sample scores: ROUGE-1 F x 10 (0-10, the stored ``score`` of KVCache-Factory) and word-set
  recall (0-1, the heatmap colour); the dataset headline is the set recall x 100 averaged over cells.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence

# --------------------------------------------------------------------------------------------------------------
# RULER (scripts/eval/evaluate.py, scripts/eval/synthetic/constants.py)
# --------------------------------------------------------------------------------------------------------------

_CONTROL_CHARS = re.compile(r"[\x00-\x1f]")


def ruler_postprocess(prediction: str) -> str:
    """RULER's post-processing: strip, replace every control character (``\\x00``-``\\x1f``) by ``\\n``, strip."""
    return _CONTROL_CHARS.sub("\n", prediction.strip()).strip()


def string_match_all_sample(prediction: str, references: Sequence[str]) -> float:
    """Fraction (0-1) of the references that occur (case-insensitive substring) in the prediction."""
    if not references:
        return 0.0
    pred = prediction.lower()
    return sum(ref.lower() in pred for ref in references) / len(references)


def string_match_part_sample(prediction: str, references: Sequence[str]) -> float:
    """1.0 if any reference occurs (case-insensitive substring) in the prediction, else 0.0."""
    pred = prediction.lower()
    return float(max((ref.lower() in pred for ref in references), default=False))


def string_match_all(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """RULER ``string_match_all`` over a task: ``round(mean_i(per-sample fraction) * 100, 2)`` (0-100)."""
    _check_lengths(predictions, references)
    if not predictions:
        return 0.0
    per_sample = [string_match_all_sample(p, r) for p, r in zip(predictions, references, strict=True)]
    return round(sum(per_sample) / len(per_sample) * 100, 2)


def string_match_part(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """RULER ``string_match_part`` over a task: ``round(mean_i(any reference hit) * 100, 2)`` (0-100)."""
    _check_lengths(predictions, references)
    if not predictions:
        return 0.0
    per_sample = [string_match_part_sample(p, r) for p, r in zip(predictions, references, strict=True)]
    return round(sum(per_sample) / len(per_sample) * 100, 2)


def ruler_average(task_scores: Mapping[str, float]) -> float:
    """RULER's headline per length: the plain mean of the task scores (13 tasks in the full benchmark)."""
    if not task_scores:
        raise ValueError("no RULER task scores to average")
    return sum(task_scores.values()) / len(task_scores)


# --------------------------------------------------------------------------------------------------------------
# NeedleBench v1 (opencompass/datasets/needlebench/{origin,parallel,multi}.py; summarizers/needlebench.py, 2024)
# --------------------------------------------------------------------------------------------------------------


def levenshtein(a: str, b: str) -> int:
    """Plain Levenshtein distance with unit insert/delete/substitute costs."""
    if len(a) < len(b):
        a, b = b, a
    if not b:
        return len(a)
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        current = [i]
        for j, cb in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


_WHITESPACE = re.compile(r"\s+")


def needlebench_single_score(prediction: str, needle: str, keyword: str) -> float:
    """NeedleBench v1 single-needle (S-RT) score of one sample, 0-100 (``NeedleBenchOriginEvaluator``).

    100 if ``keyword`` is a (case-sensitive) substring of the raw prediction; otherwise 0.2 x the Levenshtein
    similarity ``100 * (1 - lev / max(len))`` between prediction and needle with all whitespace removed.
    """
    if keyword in prediction:
        return 100.0
    pred = _WHITESPACE.sub("", prediction)
    ref = _WHITESPACE.sub("", needle)
    longest = max(len(pred), len(ref))
    similarity = 100.0 * (1 - levenshtein(pred, ref) / longest) if longest else 100.0
    return 0.2 * similarity


def needlebench_parallel_scores(
    predictions: Sequence[str], keywords: Sequence[Sequence[str]], depths: Sequence[float]
) -> dict[str, float]:
    """NeedleBench v1 multi-needle retrieval (M-RT) score of one dataset (one context length), 0-100.

    ``keywords[i][k]`` is the keyword of the needle placed at ``depths[k]`` in sample ``i`` (every sample shares the
    same depth list).  Per depth: 100 x fraction of samples whose prediction contains that keyword (case-sensitive);
    ``average_score`` = mean over depths.  Returns ``{"average_score": ..., "Depth{d}": ...}``.
    """
    _check_lengths(predictions, keywords)
    by_depth = dict.fromkeys(depths, 0.0)
    for prediction, sample_keywords in zip(predictions, keywords, strict=True):
        if len(sample_keywords) != len(depths):
            raise ValueError(f"{len(sample_keywords)} keywords for {len(depths)} depths")
        for keyword, depth in zip(sample_keywords, depths, strict=True):
            if keyword in prediction:
                by_depth[depth] += 100.0 / len(predictions)
    result = {f"Depth{_fmt_number(d)}": score for d, score in by_depth.items()}
    result["average_score"] = sum(by_depth.values()) / len(by_depth) if by_depth else 0.0
    return result


def needlebench_multi_reasoning_score(prediction: str, answer: str) -> float:
    """NeedleBench v1 multi-needle reasoning (M-RS) score of one sample, 0-100 (``NeedleBenchMultiEvaluator``).

    ``100 x |{w in answer.lower().split() : w in prediction.lower()}| / len(answer.split())``.
    """
    keywords = answer.lower().split()
    if not keywords:
        return 0.0
    pred = prediction.lower()
    return 100.0 * sum(word in pred for word in keywords) / len(keywords)


#: v1 weights of the overall score (``needlebench_*_summarizer``, 2024): S-RT 0.4, M-RS 0.3, M-RT 0.3.
NEEDLEBENCH_WEIGHTS: dict[str, float] = {"single_retrieval": 0.4, "multi_reasoning": 0.3, "multi_retrieval": 0.3}


def needlebench_overall(group_scores: Mapping[str, float], weights: Mapping[str, float] | None = None) -> float:
    """NeedleBench-Overall-Score = ``(0.4 S-RT + 0.3 M-RS + 0.3 M-RT) / (0.4 + 0.3 + 0.3)`` (v1, 2024).

    ``group_scores`` maps ``single_retrieval`` / ``multi_retrieval`` / ``multi_reasoning`` to the group scores
    (each the mean over its EN and ZH datasets, 0-100).  ``weights`` overrides the v1 weights (v2: 1/3 each).
    """
    weights = dict(NEEDLEBENCH_WEIGHTS if weights is None else weights)
    missing = [group for group in weights if group not in group_scores]
    if missing:
        raise ValueError(f"missing NeedleBench group score(s) {missing}; expected keys {sorted(weights)}")
    return sum(weights[g] * group_scores[g] for g in weights) / sum(weights.values())


def needlebench_summary(dataset_scores: Mapping[str, float]) -> dict[str, float]:
    """Group and overall NeedleBench scores from per-dataset scores of :mod:`kvbench.tasks.needlebench`.

    ``dataset_scores`` maps dataset names ``{group}_{lang}`` (e.g. ``single_retrieval_en``,
    ``multi_retrieval_zh``) to their ``score``.  Each group score is the mean over the languages present (CAKE's
    "Overall = mean(ZH, EN)"); the result holds every group score plus ``overall`` (needs all three groups).
    """
    groups: dict[str, list[float]] = {}
    for name, score in dataset_scores.items():
        group, _, lang = name.rpartition("_")
        if group not in NEEDLEBENCH_WEIGHTS or lang not in ("en", "zh"):
            raise ValueError(f"not a NeedleBench dataset name: {name!r} (expected <group>_<en|zh>)")
        groups.setdefault(group, []).append(score)
    result = {group: sum(values) / len(values) for group, values in groups.items()}
    if all(group in result for group in NEEDLEBENCH_WEIGHTS):
        result["overall"] = needlebench_overall(result)
    return result


# --------------------------------------------------------------------------------------------------------------
# Needle grid (KVCache-Factory run_needle_in_haystack.py + scripts/scripts_needle/visualize.py)
# --------------------------------------------------------------------------------------------------------------

#: The words the heatmap score looks for (visualize.py): lower-case, whitespace split, "day." keeps its period.
NEEDLE_EXPECTED_WORDS: tuple[str, ...] = (
    "eat",
    "a",
    "sandwich",
    "and",
    "sit",
    "in",
    "dolores",
    "park",
    "on",
    "a",
    "sunny",
    "day.",
)


def needle_set_recall(response: str, expected: Sequence[str] = NEEDLE_EXPECTED_WORDS, legacy: bool = False) -> float:
    """Heatmap score (0-1): ``|set(response.lower().split()) & set(expected)| / |set(expected)|``.

    ``legacy=True`` divides by ``len(expected)`` (12, duplicates counted) as before 2024-07 and in FranxYao's script,
    so the maximum is 11/12.
    """
    found = set(response.lower().split()) & set(expected)
    return len(found) / (len(expected) if legacy else len(set(expected)))


_NON_ALNUM = re.compile(r"[^a-z0-9]+")


def rouge1_f(reference: str, prediction: str) -> float:
    """ROUGE-1 F-measure (0-1) as Google ``rouge-score`` computes it with ``use_stemmer=True``.

    Tokens: lower-case, non-alphanumerics to spaces, whitespace split, Porter stem for tokens longer than 3 chars;
    multiset unigram overlap; F = 2PR/(P+R).
    """
    ref = _rouge_tokens(reference)
    pred = _rouge_tokens(prediction)
    if not ref or not pred:
        return 0.0
    overlap = sum((Counter(ref) & Counter(pred)).values())
    precision, recall = overlap / len(pred), overlap / len(ref)
    return 0.0 if overlap == 0 else 2 * precision * recall / (precision + recall)


def needle_rouge_score(needle: str, response: str) -> float:
    """KVCache-Factory's stored per-result score: ROUGE-1 F(needle, response) x 10 (0-10)."""
    return rouge1_f(needle, response) * 10


def _rouge_tokens(text: str) -> list[str]:
    tokens = _NON_ALNUM.sub(" ", text.lower()).split()
    return [porter_stem(t) if len(t) > 3 else t for t in tokens]


# Porter (1980) stemmer, written from the published algorithm description.

_VOWELS = frozenset("aeiou")


def _is_consonant(word: str, i: int) -> bool:
    ch = word[i]
    if ch in _VOWELS:
        return False
    if ch == "y":
        return i == 0 or not _is_consonant(word, i - 1)
    return True


def _measure(stem: str) -> int:
    """Number of VC sequences in ``stem`` ([C](VC)^m[V])."""
    pattern = "".join("c" if _is_consonant(stem, i) else "v" for i in range(len(stem)))
    return len(re.findall(r"v+c+", pattern))


def _has_vowel(stem: str) -> bool:
    return any(not _is_consonant(stem, i) for i in range(len(stem)))


def _ends_double_consonant(word: str) -> bool:
    return len(word) >= 2 and word[-1] == word[-2] and _is_consonant(word, len(word) - 1)


def _ends_cvc(word: str) -> bool:
    if len(word) < 3:
        return False
    return (
        _is_consonant(word, len(word) - 3)
        and not _is_consonant(word, len(word) - 2)
        and _is_consonant(word, len(word) - 1)
        and word[-1] not in "wxy"
    )


def _replace_suffix(word: str, rules: Sequence[tuple[str, str]], min_measure: int) -> str:
    for suffix, replacement in rules:
        if word.endswith(suffix):
            stem = word[: len(word) - len(suffix)]
            return stem + replacement if _measure(stem) > min_measure else word
    return word


_STEP2 = (
    ("ational", "ate"),
    ("tional", "tion"),
    ("enci", "ence"),
    ("anci", "ance"),
    ("izer", "ize"),
    ("bli", "ble"),
    ("alli", "al"),
    ("entli", "ent"),
    ("eli", "e"),
    ("ousli", "ous"),
    ("ization", "ize"),
    ("ation", "ate"),
    ("ator", "ate"),
    ("alism", "al"),
    ("iveness", "ive"),
    ("fulness", "ful"),
    ("ousness", "ous"),
    ("aliti", "al"),
    ("iviti", "ive"),
    ("biliti", "ble"),
    ("logi", "log"),
)
_STEP3 = (
    ("icate", "ic"),
    ("ative", ""),
    ("alize", "al"),
    ("iciti", "ic"),
    ("ical", "ic"),
    ("ful", ""),
    ("ness", ""),
)
_STEP4 = (
    "al",
    "ance",
    "ence",
    "er",
    "ic",
    "able",
    "ible",
    "ant",
    "ement",
    "ment",
    "ent",
    "ion",
    "ou",
    "ism",
    "ate",
    "iti",
    "ous",
    "ive",
    "ize",
)


def porter_stem(word: str) -> str:
    """Porter stemmer (lower-case input).  Words of 2 letters or fewer are returned unchanged."""
    if len(word) <= 2:
        return word
    # Step 1a
    if word.endswith(("sses", "ies")):
        word = word[:-2]
    elif word.endswith("ss"):
        pass
    elif word.endswith("s"):
        word = word[:-1]
    # Step 1b
    step1b_extra = False
    if word.endswith("eed"):
        if _measure(word[:-3]) > 0:
            word = word[:-1]
    elif word.endswith("ed") and _has_vowel(word[:-2]):
        word, step1b_extra = word[:-2], True
    elif word.endswith("ing") and _has_vowel(word[:-3]):
        word, step1b_extra = word[:-3], True
    if step1b_extra:
        if word.endswith(("at", "bl", "iz")):
            word += "e"
        elif _ends_double_consonant(word) and word[-1] not in "lsz":
            word = word[:-1]
        elif _measure(word) == 1 and _ends_cvc(word):
            word += "e"
    # Step 1c
    if word.endswith("y") and _has_vowel(word[:-1]):
        word = word[:-1] + "i"
    # Steps 2-3
    word = _replace_suffix(word, _STEP2, 0)
    word = _replace_suffix(word, _STEP3, 0)
    # Step 4 (longest matching suffix)
    for suffix in sorted(_STEP4, key=len, reverse=True):
        if word.endswith(suffix):
            stem = word[: len(word) - len(suffix)]
            if _measure(stem) > 1 and (suffix != "ion" or stem.endswith(("s", "t"))):
                word = stem
            break
    # Step 5
    if word.endswith("e"):
        stem = word[:-1]
        m = _measure(stem)
        if m > 1 or (m == 1 and not _ends_cvc(stem)):
            word = stem
    if _measure(word) > 1 and _ends_double_consonant(word) and word.endswith("l"):
        word = word[:-1]
    return word


# --------------------------------------------------------------------------------------------------------------


def _check_lengths(predictions: Sequence[object], references: Sequence[object]) -> None:
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")


def _fmt_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean (NaN for an empty sequence)."""
    return sum(values) / len(values) if values else math.nan
