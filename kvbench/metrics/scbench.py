"""SCBench scorers, re-implemented from microsoft/MInference ``scbench/compute_scores.py`` and ``repo_qa_utils.py``
(commit ``fb56c91``).

``compute_scores`` maps most SCBench tasks onto InfiniteBench scorers (``Multiturnbench_to_Infinitebench``), but
SCBench's copy of ``compute_scores.py`` differs from InfiniteBench's in two of them, kept here:
``kv_retrieval`` is a substring test (``label in pred``), ``longdialogue_qa_eng`` (used for ``scbench_qa_eng`` and
``scbench_many_shot``) is true when *any* element of the label, upper-cased, is a substring of the upper-cased
prediction (a string label is iterated character by character, as the official code does).  ``scbench_vt`` is
``string_match_all`` (the fraction of references found, case-insensitive, rounded to 2 decimals).  The others are
InfiniteBench's (:mod:`kvbench.metrics.infinitebench`): ``longbook_choice_eng``, ``longbook_qa_chn``, ``passkey``,
and ``scbench_summary`` = evaluate's ``rougeLsum``; ``math_find`` is SCBench's own copy, which reads the first number
with ``int(float(number))`` for an integer label (InfiniteBench's ``int(number)`` raises on "7.0").

RepoQA (``scbench_repoqa`` and the repoqa half of ``scbench_repoqa_and_kv``): the model output is sanitised (its first
fenced code block; with tree-sitter, the first function definition tree-sitter finds in a block), compared by BLEU
(nltk ``sentence_bleu``, smoothing ``method4``, whitespace tokens) with every needle function of the same repository
among the scored rows; a row passes when the most similar needle is its own and the similarity is at least 0.8
(``pass@1`` at threshold 0.8 with one sample per question = the fraction that pass).

Aggregation (``compute_scores``): multi-turn scores each turn separately (one number per turn; the mixed tasks
one per sub-task per turn, 0 for a sub-task a turn does not have); multi-request one number over every query.
Multi-request ``scbench_repoqa_and_kv`` hands the kv sub-task's whole rows (dicts), not their predictions, to
``kv_retrieval``'s ``label in pred``: a key lookup in the row, never true for a kv value, so the official kv number is
always 0; ``fixed_scdq_kv=True`` scores the predictions' text instead (kvbench's fix: a named switch, off by default).

A prediction whose scorer raises scores 0 and is recorded (:class:`~kvbench.metrics.guard.ScoreGuard`): one bad
prediction never fails a dataset.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvbench.metrics.guard import ScoreGuard
from kvbench.metrics.infinitebench import (
    score_first_int,
    score_longbook_choice_eng,
    score_longbook_qa_chn,
    score_longbook_sum_eng,
)
from kvbench.metrics.infinitebench import score_math_find as infinitebench_math_find

#: RepoQA's function query per language (``FUNCTION_QUERY``: the first match is the extracted function).
FUNCTION_QUERY = {
    "python": "(function_definition name: (_)) @fdef",
    "java": "(method_declaration name: (_)) @fdef",
    "typescript": "(function_declaration name: (_)) @fdef",
    "rust": "(function_item name: (_)) @fdef",
    "cpp": "(function_definition declarator: (function_declarator declarator: (identifier))) @fdef",
    "go": "(function_declaration name: (_)) @fdef",
}
#: RepoQA's pass threshold on the BLEU similarity.
REPOQA_THRESHOLD = 0.8
#: How RepoQA extracts the function from an output: ``tree_sitter`` (official; needs ``tree_sitter_languages``) or
#: ``code_block`` (the first fenced block whole: what the official code returns when tree-sitter finds no function).
FUNCTION_EXTRACTIONS = ("tree_sitter", "code_block")


def score_kv(prediction: str, label: Any, model_name: str = "") -> float:
    """SCBench's ``get_score_one_kv_retrieval``: ``label in prediction``."""
    return float(label in prediction)


def score_any_upper(prediction: str, label: Any, model_name: str = "") -> float:
    """SCBench's ``get_score_one_longdialogue_qa_eng``: any label item (a string's characters), upper-cased, in the
    upper-cased stripped prediction."""
    text = prediction.strip().upper()
    return float(any(item.upper() in text for item in label))


def string_match_all(prediction: str, label: Any, model_name: str = "") -> float:
    """``string_match_all``: the fraction of references in the prediction (case-insensitive), rounded to 2 places."""
    return round(sum(1.0 if ref.lower() in prediction.lower() else 0.0 for ref in label) / len(label), 2)


def score_math_find(prediction: str, label: Any, model_name: str = "") -> float:
    """SCBench's ``get_score_one_math_find``: the first number of the prediction (``\\d+\\.\\d+|\\d+``) equals the
    label, read with ``int(float(number))`` for an integer label ("7.0" scores as 7), ``float`` for a float label."""
    return infinitebench_math_find(prediction, label, model_name, read_integer=lambda number: int(float(number)))


#: The keys of the rows ``run_scbench.py`` writes for ``scbench_repoqa_and_kv`` (``func_name`` on RepoQA turns only):
#: what multi-request ``kv_retrieval`` looks the label up in.
OFFICIAL_ROW_KEYS = frozenset({"id", "turn_idx", "prediction", "ground_truth", "task", "lang", "repo", "func_name"})


#: The scorer of each SCBench (sub)task, as ``compute_scores`` resolves it.
SCORERS = {
    "scbench_choice_eng": score_longbook_choice_eng,
    "scbench_qa_eng": score_any_upper,
    "scbench_qa_chn": score_longbook_qa_chn,
    "scbench_kv": score_kv,
    "scbench_prefix_suffix": score_kv,
    "scbench_mf": score_math_find,
    "scbench_passkey": score_first_int,
    "scbench_summary": score_longbook_sum_eng,
    "scbench_vt": string_match_all,
    "scbench_many_shot": score_any_upper,
}


@dataclass(frozen=True)
class ScoredRow:
    """One prediction as ``compute_scores`` reads it: the turn, the sub-task (mixed tasks), the label and, for RepoQA,
    the language, repository and function name."""

    turn: int
    prediction: str
    label: Any
    subtask: str | None = None
    lang: str | None = None
    repo: str | None = None
    func_name: str | None = None
    #: The sample's id (a scoring error is recorded under it).
    key: str = ""


def sanitize_output(output: str, lang: str, extraction: str) -> str:
    """RepoQA's ``sanitize_output``: the first fenced code block (the output itself when there is none); with
    ``tree_sitter``, the first function tree-sitter finds in a block, in block order."""
    output = output.strip()
    blocks = re.findall(r"^```(?:\w+)?\s*\n(.*?)(?=^```)```", output, re.DOTALL | re.MULTILINE)
    if not blocks:
        return output
    if extraction == "tree_sitter":
        from tree_sitter_languages import get_language, get_parser

        parser, query = get_parser(lang), get_language(lang).query(FUNCTION_QUERY[lang])
        for block in blocks:
            try:
                data = block.encode("utf8")
                for node, _ in query.captures(parser.parse(data).root_node):
                    return data[node.start_byte : node.end_byte].decode("utf8")
            except Exception:  # the official code skips a block tree-sitter fails on
                continue
    return blocks[0]


def function_similarity(candidate: str, reference: str) -> float:
    """BLEU of whitespace tokens, nltk smoothing ``method4`` (``compute_function_similarity``)."""
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    candidate_tokens = re.split(r"\s+", candidate.strip())
    reference_tokens = re.split(r"\s+", reference.strip())
    return float(sentence_bleu([reference_tokens], candidate_tokens, smoothing_function=SmoothingFunction().method4))


def repoqa_pass(row: ScoredRow, needles: Sequence[tuple[str, str]], extraction: str) -> float:
    """1.0 when the needle most similar to the sanitised output is the row's own function, at similarity >= 0.8;
    ``needles``: ``(function name, function text)`` of the row's repository."""
    assert row.lang is not None
    sanitized = sanitize_output(row.prediction, row.lang, extraction)
    best_name, best = None, 0.0
    for name, text in needles:
        similarity = function_similarity(sanitized, text)
        if similarity > best:
            best, best_name = similarity, name
    return float(best_name == row.func_name and best >= REPOQA_THRESHOLD)


def _needles(rows: Sequence[ScoredRow]) -> dict[str, list[tuple[str, str]]]:
    """``needle_by_repo``: every RepoQA row's label and function name, per repository (all turns)."""
    found: dict[str, list[tuple[str, str]]] = {}
    for row in rows:
        if row.func_name is not None and row.repo is not None:
            found.setdefault(row.repo, []).append((row.func_name, str(row.label)))
    return found


def subtask_score(
    subtask: str,
    rows: Sequence[ScoredRow],
    needles: dict[str, list[tuple[str, str]]],
    extraction: str,
    guard: ScoreGuard | None = None,
    whole_rows: bool = False,
) -> float:
    """Mean score (0-1) of ``rows`` under ``subtask``'s scorer; ``whole_rows``: the scorer gets the official row (its
    keys, :data:`OFFICIAL_ROW_KEYS`) instead of the prediction, as multi-request ``scbench_repoqa_and_kv``'s kv
    sub-task does; a prediction whose scorer raises scores 0 (recorded by ``guard``)."""
    guard = guard if guard is not None else ScoreGuard()
    if subtask == "scbench_repoqa":
        scores = [guard(row.key, repoqa_pass, row, needles.get(row.repo or "", []), extraction) for row in rows]
    else:
        scorer = SCORERS[subtask]
        scores = [
            guard(row.key, scorer, OFFICIAL_ROW_KEYS if whole_rows else row.prediction, row.label, "") for row in rows
        ]
    return sum(scores) / len(scores)


#: The sub-tasks of SCBench's mixed tasks, in the official order.
MIXED = {
    "scbench_summary_with_needles": ("scbench_summary", "scbench_passkey"),
    "scbench_repoqa_and_kv": ("scbench_repoqa", "scbench_kv"),
}


def official_scores(
    task: str,
    rows: Sequence[ScoredRow],
    multi_request: bool,
    extraction: str = "tree_sitter",
    fixed_scdq_kv: bool = False,
    guard: ScoreGuard | None = None,
) -> dict[str, float]:
    """``compute_scores``'s numbers (0-1): multi-turn ``{"turn_<t>": ...}`` (mixed tasks ``"turn_<t>/<subtask>"``),
    multi-request ``{"all": ...}`` (mixed ``"all/<subtask>"``); a sub-task with no row in a group is 0.
    ``fixed_scdq_kv``: multi-request ``scbench_repoqa_and_kv``'s kv sub-task scores the predictions (kvbench's fix)
    instead of the whole rows (official: always 0)."""
    needles = _needles(rows)
    groups: dict[str, list[ScoredRow]] = {}
    if multi_request:
        groups["all"] = list(rows)
    else:
        for row in rows:
            groups.setdefault(f"turn_{row.turn}", []).append(row)
    result: dict[str, float] = {}
    for key, members in groups.items():
        if task in MIXED:
            for subtask in MIXED[task]:
                chosen = [row for row in members if row.subtask == subtask]
                whole_rows = multi_request and task == "scbench_repoqa_and_kv" and subtask == "scbench_kv"
                whole_rows = whole_rows and not fixed_scdq_kv
                number = subtask_score(subtask, chosen, needles, extraction, guard, whole_rows) if chosen else 0.0
                result[f"{key}/{subtask}"] = number
        else:
            result[key] = subtask_score(task, members, needles, extraction, guard)
    return result
