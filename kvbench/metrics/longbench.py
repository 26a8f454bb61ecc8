"""LongBench v1 scoring with the exact semantics of the official ``LongBench/metrics.py`` and ``eval.py``.

Everything here is a re-implementation (no code from the LongBench repository), written to give bit-identical
numbers to the official scorer run with its real dependencies (``rouge==1.0.1``, ``fuzzywuzzy==0.18.0``,
``jieba``), quirks included:

* :func:`rouge_score` replicates pltrdy ``rouge`` 1.0.1 ROUGE-L (summary-level union LCS over ``"."``-split
  sentences with *set* semantics, case-sensitive, no stemming), its "empty hypothesis/reference" exceptions
  (score 0.0), and even its recursion-depth failure: the package reconstructs the LCS with a recursive function,
  so a long period-free sentence pair overflows Python's default recursion limit (1000) and the official
  ``except:`` turns the sample into 0.0.  We compute the same traceback iteratively and reproduce the failure
  at the exact depth at which it happens when ``eval.py`` is run as a script (see ``_OFFICIAL_*`` constants).
* :func:`classification_score` keeps the official list-mutation-while-iterating behaviour.
* :func:`code_sim_score` uses ``fuzz.ratio`` semantics; fuzzywuzzy's result depends on whether
  python-Levenshtein is installed, so the backend is a switch: ``"difflib"`` (stdlib, the official default since
  LongBench's requirements do not install python-Levenshtein) or ``"levenshtein"`` (indel ratio, via
  ``rapidfuzz`` or ``Levenshtein``).
* :func:`scorer` / :func:`scorer_e` mirror ``eval.py``: first-line post-processing for trec/triviaqa/samsum/lsht,
  max over reference answers, ``round(100 * mean, 2)``, LongBench-E length buckets.

The per-metric functions keep their official names and signatures (``metric(prediction, ground_truth,
**kwargs)``) so they can be checked one-to-one against the official code.
"""

from __future__ import annotations

import difflib
import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kvbench.checks import check_choice

__all__ = [
    "CODE_SIM_BACKENDS",
    "DATASET2METRIC",
    "DEFAULT_CODE_SIM_BACKEND",
    "FIRST_LINE_DATASETS",
    "classification_score",
    "code_sim_score",
    "count_score",
    "f1_score",
    "fuzz_ratio",
    "normalize_answer",
    "normalize_zh_answer",
    "qa_f1_score",
    "qa_f1_zh_score",
    "retrieval_score",
    "retrieval_zh_score",
    "rouge_score",
    "rouge_zh_score",
    "scorer",
    "scorer_e",
]

#: Code-similarity backends for ``fuzz.ratio``: stdlib difflib (fuzzywuzzy without python-Levenshtein, the
#: official default) or the Levenshtein indel ratio (fuzzywuzzy with python-Levenshtein installed).
CODE_SIM_BACKENDS: tuple[str, ...] = ("difflib", "levenshtein")
DEFAULT_CODE_SIM_BACKEND = "difflib"

#: Datasets whose prediction is cut to its first non-leading line before scoring (``eval.py``).
FIRST_LINE_DATASETS: tuple[str, ...] = ("trec", "triviaqa", "samsum", "lsht")

# --- recursion-depth emulation of rouge 1.0.1 --------------------------------------------------------------
# CPython's default recursion limit.
_OFFICIAL_RECURSION_LIMIT = 1000
# Frames on the stack when rouge's recursive ``_recon`` is first entered, when ``eval.py`` runs as a script:
# <module> -> scorer -> rouge_score -> Rouge.get_scores -> Rouge._get_avg_scores -> metric lambda
# -> rouge_l_summary_level -> _union_lcs -> _recon_lcs.  ``rouge_zh_score`` adds one frame.
# Measured against the real package (CPython 3.11): a traceback of 990 steps passes, 991 steps fail.
_OFFICIAL_FRAMES_BEFORE_RECON = 9


# ------------------------------------------------------------------------------------------------------------
# Normalisation and token F1
# ------------------------------------------------------------------------------------------------------------

_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_ASCII_PUNCTUATION = frozenset(string.punctuation)
# The official CJK punctuation list (metrics.py normalize_zh_answer), in its order.
_CN_PUNCTUATION = (
    "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝"
    "～｟｠｢｣､、〃》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿–—‘’‛“”„‟…‧﹏."
)
_ZH_PUNCTUATION = frozenset(string.punctuation + _CN_PUNCTUATION)


def normalize_answer(s: str) -> str:
    """Lower-case, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace (in that order)."""
    text = s.lower()
    text = "".join(ch for ch in text if ch not in _ASCII_PUNCTUATION)
    text = _ARTICLES_RE.sub(" ", text)
    return " ".join(text.split())


def normalize_zh_answer(s: str) -> str:
    """Lower-case, drop ASCII and CJK punctuation, remove all whitespace (in that order)."""
    text = s.lower()
    text = "".join(ch for ch in text if ch not in _ZH_PUNCTUATION)
    return "".join(text.split())


def f1_score(prediction: Sequence[str], ground_truth: Sequence[str], **kwargs: Any) -> float:
    """Multiset token F1 between two token lists; returns the int ``0`` when nothing overlaps (as official)."""
    common = Counter(prediction) & Counter(ground_truth)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction)
    recall = 1.0 * num_same / len(ground_truth)
    return (2 * precision * recall) / (precision + recall)


def qa_f1_score(prediction: str, ground_truth: str, **kwargs: Any) -> float:
    """Token F1 after :func:`normalize_answer` (English QA datasets and triviaqa)."""
    return f1_score(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


def _jieba_cut(text: str) -> list[str]:
    """``jieba.cut(text, cut_all=False)`` (accurate mode, HMM on), imported lazily."""
    try:
        import jieba
    except ImportError as err:  # pragma: no cover - jieba is a declared dependency
        raise ImportError("the Chinese LongBench metrics need jieba: pip install jieba==0.42.1") from err
    return list(jieba.cut(text, cut_all=False))


def qa_f1_zh_score(prediction: str, ground_truth: str, **kwargs: Any) -> float:
    """Token F1 over jieba tokens, each normalised by :func:`normalize_zh_answer`, empty tokens dropped."""
    pred_tokens = [tok for tok in (normalize_zh_answer(t) for t in _jieba_cut(prediction)) if len(tok) > 0]
    gt_tokens = [tok for tok in (normalize_zh_answer(t) for t in _jieba_cut(ground_truth)) if len(tok) > 0]
    return f1_score(pred_tokens, gt_tokens)


# ------------------------------------------------------------------------------------------------------------
# ROUGE-L, pltrdy rouge 1.0.1 semantics
# ------------------------------------------------------------------------------------------------------------


class _RecursionOverflow(Exception):
    """Raised where rouge 1.0.1's recursive LCS traceback would hit the default recursion limit."""


def _rouge_sentences(text: str) -> list[str]:
    """Split on ``"."``, keep non-empty pieces, collapse each piece's whitespace (may leave ``""`` sentences)."""
    return [" ".join(piece.split()) for piece in text.split(".") if len(piece) > 0]


def _lcs_word_set(x: list[str], y: list[str], max_steps: int) -> set[str]:
    """Words of the LCS of ``x`` and ``y`` reconstructed with rouge's traceback (ties move along ``y``).

    Raises :class:`_RecursionOverflow` when the traceback takes more than ``max_steps`` steps, which is where the
    recursive original overflows the stack.
    """
    n, m = len(x), len(y)
    if min(n, m) > max_steps:  # every traceback step lowers i or j by at most one
        raise _RecursionOverflow
    table = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(1, n + 1):
        xi = x[i - 1]
        row, prev = table[i], table[i - 1]
        for j in range(1, m + 1):
            if xi == y[j - 1]:
                row[j] = prev[j - 1] + 1
            else:
                up, left = prev[j], row[j - 1]
                row[j] = up if up > left else left
    words: set[str] = set()
    i, j, steps = n, m, 0
    while i > 0 and j > 0:
        steps += 1
        if steps > max_steps:
            raise _RecursionOverflow
        if x[i - 1] == y[j - 1]:
            words.add(x[i - 1])
            i -= 1
            j -= 1
        elif table[i - 1][j] > table[i][j - 1]:
            i -= 1
        else:
            j -= 1
    return words


def _rouge_l_f(prediction: str, ground_truth: str, extra_frames: int = 0) -> float:
    """ROUGE-L F of ``Rouge().get_scores([prediction], [ground_truth], avg=True)``; 0.0 where the package raises."""
    hyp = _rouge_sentences(prediction)
    ref = _rouge_sentences(ground_truth)
    if not hyp or not ref:  # "Hypothesis is empty." / "Reference is empty." raised by rouge-1
        return 0.0
    # Frames: the traceback of k steps uses k+1 nested calls on top of the frames already there.
    max_steps = _OFFICIAL_RECURSION_LIMIT - (_OFFICIAL_FRAMES_BEFORE_RECON + extra_frames) - 1
    hyp_words = [s.split(" ") for s in hyp]
    ref_words = [s.split(" ") for s in ref]
    m = len({w for words in ref_words for w in words})
    n = len({w for words in hyp_words for w in words})
    union: set[str] = set()
    llcs = 0
    try:
        for r_words in ref_words:
            prev_count = len(union)
            for c_words in hyp_words:
                union |= _lcs_word_set(r_words, c_words, max_steps)
            llcs += len(union) - prev_count
    except _RecursionOverflow:
        return 0.0
    r_lcs = llcs / m
    p_lcs = llcs / n
    return 2.0 * ((p_lcs * r_lcs) / (p_lcs + r_lcs + 1e-8))


def rouge_score(prediction: str, ground_truth: str, **kwargs: Any) -> float:
    """ROUGE-L F1 as ``Rouge().get_scores(...)["rouge-l"]["f"]`` of pltrdy rouge 1.0.1; any failure gives 0.0."""
    return _rouge_l_f(prediction, ground_truth)


def rouge_zh_score(prediction: str, ground_truth: str, **kwargs: Any) -> float:
    """:func:`rouge_score` over space-joined jieba tokens (dureader, vcsum)."""
    pred = " ".join(_jieba_cut(prediction))
    gt = " ".join(_jieba_cut(ground_truth))
    return _rouge_l_f(pred, gt, extra_frames=1)


# ------------------------------------------------------------------------------------------------------------
# Classification, retrieval, counting
# ------------------------------------------------------------------------------------------------------------


def classification_score(prediction: str, ground_truth: str, **kwargs: Any) -> float:
    """trec/lsht: classes found as substrings of the prediction; those that are strict substrings of the gold
    label are removed *while iterating the same list* (so the element after each removed one is skipped, as in
    the official code); ``1/len(matches)`` if the gold label survives, else 0.0."""
    all_classes = kwargs["all_classes"]
    em_match_list = [class_name for class_name in all_classes if class_name in prediction]
    # Deliberate mutation during iteration: reproduces the official skip-after-remove behaviour.
    for match_term in em_match_list:
        if match_term in ground_truth and match_term != ground_truth:
            em_match_list.remove(match_term)
    if ground_truth in em_match_list:
        return 1.0 / len(em_match_list)
    return 0.0


def _fraction_equal(numbers: list[str], target: str) -> float:
    """Share of ``numbers`` equal to ``target`` (0.0 when there are none)."""
    if not numbers:
        return 0.0
    return float(sum(1 for number in numbers if str(number) == str(target)) / len(numbers))


def _paragraph_id(ground_truth: str, pattern: str) -> str:
    """The paragraph number in a retrieval answer (the official code fails on answers without one)."""
    matches = re.findall(pattern, ground_truth)
    if not matches:
        raise ValueError(f"retrieval answer {ground_truth!r} does not match {pattern!r}")
    return matches[0]


def retrieval_score(prediction: str, ground_truth: str, **kwargs: Any) -> float:
    """passage_retrieval_en: share of the numbers in the prediction equal to the gold ``Paragraph N``."""
    return _fraction_equal(re.findall(r"\d+", prediction), _paragraph_id(ground_truth, r"Paragraph (\d+)"))


def retrieval_zh_score(prediction: str, ground_truth: str, **kwargs: Any) -> float:
    """passage_retrieval_zh: share of the numbers in the prediction equal to the gold ``段落N``."""
    return _fraction_equal(re.findall(r"\d+", prediction), _paragraph_id(ground_truth, r"段落(\d+)"))


def count_score(prediction: str, ground_truth: str, **kwargs: Any) -> float:
    """passage_count: share of the numbers in the prediction equal to the gold count."""
    return _fraction_equal(re.findall(r"\d+", prediction), ground_truth)


# ------------------------------------------------------------------------------------------------------------
# Code similarity
# ------------------------------------------------------------------------------------------------------------


def _levenshtein_ratio() -> Callable[[str, str], float]:
    """The indel-based ratio of python-Levenshtein, from rapidfuzz (preferred) or Levenshtein."""
    try:
        from rapidfuzz.distance import Indel

        return Indel.normalized_similarity
    except ImportError:
        pass
    try:
        import Levenshtein

        return Levenshtein.ratio
    except ImportError as err:
        raise ImportError(
            "code_sim_backend='levenshtein' needs rapidfuzz (pip install 'kvbench[levenshtein]') "
            "or python-Levenshtein; use code_sim_backend='difflib' (the official default) otherwise"
        ) from err


def _check_backend(backend: str) -> str:
    return check_choice("metrics.code_sim_backend", backend, CODE_SIM_BACKENDS)


def fuzz_ratio(s1: str | None, s2: str | None, backend: str = DEFAULT_CODE_SIM_BACKEND) -> int:
    """``fuzzywuzzy.fuzz.ratio`` (0.18.0): 0 if either is None; 100 if equal (checked before emptiness);
    0 if either is empty; else ``int(round(100 * ratio))`` with difflib's or Levenshtein's ratio."""
    _check_backend(backend)
    if s1 is None or s2 is None:
        return 0
    if s1 == s2:
        return 100
    if len(s1) == 0 or len(s2) == 0:
        return 0
    # Python's round(): banker's rounding to an int, as fuzzywuzzy's utils.intr.
    if backend == "levenshtein":
        return round(100 * _levenshtein_ratio()(s1, s2))
    return round(100 * difflib.SequenceMatcher(None, s1, s2).ratio())


def code_sim_score(prediction: str, ground_truth: str, **kwargs: Any) -> float:
    """lcc/repobench-p: first line (after leading newlines) with no backtick, ``#`` or ``//``, else ``""``;
    ``fuzz.ratio(line, ground_truth) / 100``.  ``backend=`` selects the ratio backend (default difflib)."""
    backend = kwargs.get("backend") or DEFAULT_CODE_SIM_BACKEND
    line = ""
    for candidate in prediction.lstrip("\n").split("\n"):
        if ("`" not in candidate) and ("#" not in candidate) and ("//" not in candidate):
            line = candidate
            break
    return fuzz_ratio(line, ground_truth, backend) / 100


# ------------------------------------------------------------------------------------------------------------
# eval.py drivers
# ------------------------------------------------------------------------------------------------------------

#: The official ``dataset2metric`` (all 21 LongBench v1 datasets).
DATASET2METRIC: dict[str, Callable[..., float]] = {
    "narrativeqa": qa_f1_score,
    "qasper": qa_f1_score,
    "multifieldqa_en": qa_f1_score,
    "multifieldqa_zh": qa_f1_zh_score,
    "hotpotqa": qa_f1_score,
    "2wikimqa": qa_f1_score,
    "musique": qa_f1_score,
    "dureader": rouge_zh_score,
    "gov_report": rouge_score,
    "qmsum": rouge_score,
    "multi_news": rouge_score,
    "vcsum": rouge_zh_score,
    "trec": classification_score,
    "triviaqa": qa_f1_score,
    "samsum": rouge_score,
    "lsht": classification_score,
    "passage_retrieval_en": retrieval_score,
    "passage_count": count_score,
    "passage_retrieval_zh": retrieval_zh_score,
    "lcc": code_sim_score,
    "repobench-p": code_sim_score,
}


def _metric_for(dataset: str) -> Callable[..., float]:
    if dataset not in DATASET2METRIC:
        raise ValueError(f"unknown LongBench dataset {dataset!r}; valid datasets: {', '.join(DATASET2METRIC)}")
    return DATASET2METRIC[dataset]


def _sample_scores(
    dataset: str,
    predictions: Sequence[str],
    answers: Sequence[Sequence[str]],
    all_classes: Sequence[str] | None,
    code_sim_backend: str,
) -> list[float]:
    """Per-sample scores: first-line cut where official, then the max of the metric over the answers."""
    metric = _metric_for(dataset)
    _check_backend(code_sim_backend)
    if len(predictions) != len(answers):
        raise ValueError(f"{len(predictions)} predictions but {len(answers)} answer lists for {dataset!r}")
    if len(predictions) == 0:
        raise ValueError(f"no predictions to score for {dataset!r}")
    extra = {"backend": code_sim_backend} if metric is code_sim_score else {}
    scores = []
    for prediction, ground_truths in zip(predictions, answers, strict=True):
        score = 0.0
        if dataset in FIRST_LINE_DATASETS:
            prediction = prediction.lstrip("\n").split("\n")[0]
        for ground_truth in ground_truths:
            score = max(score, metric(prediction, ground_truth, all_classes=all_classes, **extra))
        scores.append(score)
    return scores


def scorer(
    dataset: str,
    predictions: Sequence[str],
    answers: Sequence[Sequence[str]],
    all_classes: Sequence[str] | None,
    *,
    code_sim_backend: str = DEFAULT_CODE_SIM_BACKEND,
) -> float:
    """Official ``eval.py::scorer``: ``round(100 * sum(per-sample max over answers) / n, 2)``.

    Unlike the official code (which ``zip``s silently and divides by zero), mismatched lengths or an empty list
    raise ``ValueError``.
    """
    total_score = 0.0
    for score in _sample_scores(dataset, predictions, answers, all_classes, code_sim_backend):
        total_score += score
    return round(100 * total_score / len(predictions), 2)


def scorer_e(
    dataset: str,
    predictions: Sequence[str],
    answers: Sequence[Sequence[str]],
    lengths: Sequence[int],
    all_classes: Sequence[str] | None,
    *,
    code_sim_backend: str = DEFAULT_CODE_SIM_BACKEND,
) -> dict[str, float]:
    """Official ``eval.py::scorer_e``: per-sample scores bucketed by the ``length`` field (words for English,
    characters for Chinese): ``< 4000`` -> "0-4k", ``< 8000`` -> "4-8k", else "8k+"; each bucket
    ``round(100 * mean, 2)``; an empty bucket is NaN (as ``np.mean([])``, without the warning)."""
    if len(lengths) != len(predictions):
        raise ValueError(f"{len(predictions)} predictions but {len(lengths)} lengths for {dataset!r}")
    buckets: dict[str, list[float]] = {"0-4k": [], "4-8k": [], "8k+": []}
    scores = _sample_scores(dataset, predictions, answers, all_classes, code_sim_backend)
    for score, length in zip(scores, lengths, strict=True):
        if length < 4000:
            buckets["0-4k"].append(score)
        elif length < 8000:
            buckets["4-8k"].append(score)
        else:
            buckets["8k+"].append(score)
    return {key: float(round(100 * np.mean(values), 2)) if values else float("nan") for key, values in buckets.items()}
