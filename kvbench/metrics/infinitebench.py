"""InfiniteBench scorers, re-implemented from OpenBMB/InfiniteBench ``src/compute_scores.py`` at ``88b3daa``.

One function per task, each ``score_one(prediction, label, model_name) -> float`` with the official rules (the
label exactly as the official ``get_answer`` returns it: a string, a number, or a list), and
:func:`task_score`, the official ``get_score``: the mean over samples (0-1; the task reports it x100).

Official quirks kept: ``kv_retrieval`` looks for the label itself among the words of the prediction, so a label
stored as a list (the hub's data) never matches (``fixed_kv_label=True`` compares its first element, as the
unmerged InfiniteBench PR #23 proposed: a named switch, off by default); ``math_calc`` drops the first predicted number
for ``model_name == "gpt4"``; ``longbook_sum_eng`` is the ``rougeLsum`` F-measure of Hugging Face ``evaluate``'s
``rouge`` metric (``rouge_score``'s scorer, no stemmer; several references: ``score_multi``).  The SQuAD
normalisation and token F1 are LongBench's (:mod:`kvbench.metrics.longbench`): the official code is the same.
A prediction whose scorer raises (``math_find``'s ``int("7.0")``, which stops the official ``compute_scores``) scores
0 and is recorded (:mod:`kvbench.metrics.guard`) instead of failing the task.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

from kvbench.metrics.guard import ScoreGuard
from kvbench.metrics.longbench import f1_score, normalize_answer, normalize_zh_answer


def qa_f1_score(prediction: str, ground_truths: Sequence[str]) -> float:
    """Max token F1 over the references, after :func:`normalize_answer`."""
    tokens = normalize_answer(prediction).split()
    return max([f1_score(tokens, normalize_answer(g).split()) for g in ground_truths] + [0])


def qa_f1_score_zh(prediction: str, ground_truths: Sequence[str]) -> float:
    """Max character F1 over the references, after :func:`normalize_zh_answer`."""
    chars = list(normalize_zh_answer(prediction))
    return max([f1_score(chars, list(normalize_zh_answer(g))) for g in ground_truths] + [0])


def first_int(prediction: str) -> str:
    """The first run of digits in ``prediction`` ("" when none)."""
    return next((item for item in re.split("[^0-9]", prediction) if item != ""), "")


def _words(prediction: str, separators: str) -> list[str]:
    for char in separators:
        prediction = prediction.replace(char, " ")
    return prediction.split()


def _first(label: Any) -> Any:
    return label[0] if isinstance(label, list) else label


def score_kv_retrieval(prediction: str, label: Any, model_name: str, fixed_kv_label: bool = False) -> float:
    target = _first(label) if fixed_kv_label else label
    return float(target in _words(prediction, "\n:\"'.,?!{}"))


def score_first_int(prediction: str, label: Any, model_name: str) -> float:
    """passkey and number_string: the first digit run equals the label."""
    return float(_first(label) == first_int(prediction))


def score_code_run(prediction: str, label: Any, model_name: str) -> float:
    words = _words(prediction.strip(), "\n.`'\":")
    if not words:
        return 0.0
    try:
        return float(_first(label) == int(words[-1]))
    except ValueError:
        return 0.0


def _collapse(text: str, separators: Sequence[str]) -> str:
    for sep in separators:
        text = text.replace(sep, " ")
    while "  " in text:
        text = text.replace("  ", " ")
    return text


def score_code_debug(prediction: str, label: Any, model_name: str) -> float:
    """``label`` = ``[function name, option letter]``."""
    prediction = prediction.strip()
    letter, name = label[1], label[0]
    if prediction[:2] in (f"{letter}.", f"{letter}:"):
        return 1.0
    prediction = _collapse(prediction.strip(), ["\n", "`", "'", '"', "-", "*", "Option", "option"])
    for prefix in ("answer is:", "is:", "answer:", "correct option is:"):
        index = prediction.find(prefix)
        if index == -1:
            continue
        if len(prediction) < index + len(prefix) + 1:
            return 0.0
        rest = prediction[index + len(prefix) + 1 :]
        return float(any(rest.startswith(s) for s in (letter, name)))
    return 0.0


def score_math_find(prediction: str, label: Any, model_name: str, read_integer: Callable[[str], int] = int) -> float:
    """InfiniteBench's ``get_score_one_math_find``: the first number of the prediction (``\\d+\\.\\d+|\\d+``)
    equals the label, read with ``read_integer`` for an integer label (the official ``int``: "7.0" raises, which
    the dataset's :class:`~kvbench.metrics.guard.ScoreGuard` records), ``float`` for a float label."""
    label = _first(label)
    if not isinstance(label, int | float):
        raise TypeError(f"Expected int or float, got {type(label)}")
    found = re.search(r"\d+\.\d+|\d+", prediction)
    if found is None:
        return 0.0
    number = found.group(0).strip()
    return float(read_integer(number) == label) if isinstance(label, int) else float(float(number) == label)


def score_longdialogue_qa_eng(prediction: str, label: Any, model_name: str) -> float:
    words = [word.upper() for word in _words(prediction.strip(), "\n:\"'.,?!{}")]
    return float(label[0] in words)


def score_longbook_choice_eng(prediction: str, label: Any, model_name: str) -> float:
    """``label`` = ``[option text, letter]`` (or a list of acceptable strings)."""
    prediction = prediction.strip()
    if prediction == "":
        return 0.0
    if prediction[0] in "ABCD":
        return float(prediction[0] in label)
    if prediction in label:
        return 1.0
    prediction = _collapse(prediction, ["\n", '"', "'", ".", ",", "?", "!", "{", "}"])
    for prefix in ("answer is:", "answer:", "answer is", "option is"):
        index = prediction.find(prefix)
        if index == -1:
            continue
        if len(prediction) < index + len(prefix) + 1:
            return 0.0
        after = prediction[index + len(prefix) + 1 :]
        return float(any(after.startswith(s) for s in label))
    for word in prediction.split():
        if word in "ABCD":  # a substring test, as the official code: "" and "AB" count too
            return float(word in label)
    return 0.0


def score_longbook_qa_eng(prediction: str, label: Any, model_name: str) -> float:
    return qa_f1_score(prediction, label)


def score_longbook_qa_chn(prediction: str, label: Any, model_name: str) -> float:
    return qa_f1_score_zh(prediction, label)


@lru_cache(maxsize=1)
def _rouge_lsum_scorer() -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(rouge_types=["rougeLsum"], use_stemmer=False)


def score_longbook_sum_eng(prediction: str, label: Any, model_name: str) -> float:
    """``rougeLsum`` F-measure (``rouge_score``, no stemmer); a list label is several references (best one)."""
    scorer = _rouge_lsum_scorer()
    score = scorer.score_multi(label, prediction) if isinstance(label, list) else scorer.score(label, prediction)
    return float(score["rougeLsum"].fmeasure)


def score_math_calc(prediction: str, label: Any, model_name: str) -> float:
    """Fraction of the leading intermediate values predicted in order (digits only: signs are dropped)."""
    if not isinstance(label, list):
        raise TypeError(f"Expected list, got {type(label)}")
    if label and isinstance(label[0], list):
        label = label[0]
    numbers = [int(item) for item in re.split("[^0-9]", prediction) if item != ""]
    if model_name == "gpt4":
        numbers = numbers[1:]
    correct = 0
    for index, value in enumerate(label):
        if index >= len(numbers) or value != numbers[index]:
            break
        correct += 1
    return correct / len(label)


SCORERS: dict[str, Callable[..., float]] = {
    "passkey": score_first_int,
    "number_string": score_first_int,
    "kv_retrieval": score_kv_retrieval,
    "longbook_sum_eng": score_longbook_sum_eng,
    "longbook_choice_eng": score_longbook_choice_eng,
    "longbook_qa_eng": score_longbook_qa_eng,
    "longbook_qa_chn": score_longbook_qa_chn,
    "longdialogue_qa_eng": score_longdialogue_qa_eng,
    "math_find": score_math_find,
    "math_calc": score_math_calc,
    "code_run": score_code_run,
    "code_debug": score_code_debug,
}


def score_one(task: str, prediction: str, label: Any, model_name: str, fixed_kv_label: bool = False) -> float:
    """The official ``get_score_one``."""
    if task == "kv_retrieval":
        return score_kv_retrieval(prediction, label, model_name, fixed_kv_label)
    return float(SCORERS[task](prediction, label, model_name))


def task_score(
    task: str,
    predictions: Sequence[str],
    labels: Sequence[Any],
    model_name: str,
    keys: Sequence[str] | None = None,
    guard: ScoreGuard | None = None,
    **kwargs: Any,
) -> float:
    """The official ``get_score``: the mean of :func:`score_one` (0-1).  A prediction whose scorer raises (the
    official code stops there: ``math_find`` on "7.0") scores 0, recorded by ``guard`` under its key (``keys``:
    the samples' ids; default their positions)."""
    if len(predictions) != len(labels):
        raise ValueError(f"{len(predictions)} predictions for {len(labels)} labels")
    guard = guard if guard is not None else ScoreGuard()
    keys = [str(index) for index in range(len(labels))] if keys is None else keys
    scores = [
        guard(key, score_one, task, p, label, model_name, **kwargs)
        for key, p, label in zip(keys, predictions, labels, strict=True)
    ]
    return sum(scores) / len(scores)
