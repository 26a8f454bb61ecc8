"""The graders of issue #54 (item 4) against the official code, recorded in the environments the benchmarks'
repositories pin (``tests/fixtures/reference/graders/``, written by ``scripts/reference/record_graders.py``):
Qwen2.5-Math's evaluation (``run_execute``, ``math_eval.py``'s A-E clean-up, ``evaluate()``, ``math_equal`` with
antlr4 4.11.1), InfiniteBench's ``truncate_by_tokens`` and ``math_find``, SCBench's ``math_find`` and
``scbench_repoqa_and_kv`` aggregation; and a scoring error on one prediction never fails its dataset."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kvbench.metrics import infinitebench as infinitebench_metrics
from kvbench.metrics.guard import ScoreGuard, collect_scoring_errors
from kvbench.metrics.math_answer import (
    choice_from_text,
    ground_truth,
    official_prediction,
    reference_text,
    strip_string,
    word_to_num,
)
from kvbench.metrics.math_grader import choice_answer_clean, math_equal
from kvbench.metrics.scbench import ScoredRow, official_scores
from kvbench.metrics.scbench import score_math_find as scbench_math_find
from kvbench.prompting import encode_sample, truncate_prompt_joined
from kvbench.run.scoring import score_rows
from kvbench.tasks.infinitebench import VALID_OPTIONS, InfiniteBenchDataset
from kvbench.tasks.reasoning import VALID_OPTIONS as REASONING_OPTIONS
from kvbench.tasks.reasoning import ReasoningDataset

RECORDED = Path(__file__).parents[1] / "fixtures" / "reference" / "graders"
MATH = json.loads((RECORDED / "math.json").read_text(encoding="utf-8"))
INFINITEBENCH = json.loads((RECORDED / "infinitebench.json").read_text(encoding="utf-8"))
SCBENCH = json.loads((RECORDED / "scbench.json").read_text(encoding="utf-8"))


def test_math_pipeline_matches_the_official_evaluation_on_every_recorded_case():
    """gt, the graded answer (strip_string twice, A-E clean-up) and evaluate()'s verdict, case for case."""
    differ = []
    for case in MATH["cases"]:
        reference = ground_truth(case["example"], case["data_name"])
        answer = official_prediction(case["code"].strip(), case["data_name"], reference)
        verdict = answer is not None and math_equal(answer, reference)
        if (reference, answer, verdict) != (case["gt"], case["pred"], case["score"]):
            differ.append((case["code"], (reference, answer, verdict), (case["gt"], case["pred"], case["score"])))
    assert not differ
    by_code = {case["code"]: case for case in MATH["cases"]}
    # the cases of the issue are among them, with the official verdicts
    assert by_code["The count is \\boxed{\\text{eighteen}}."]["pred"] == "18"
    assert by_code["The set is \\boxed{x \\in [1,2]}."]["pred"] == "[1,2]"
    assert by_code["So \\boxed{7²}."]["pred"] == "7²" and not by_code["So \\boxed{7²}."]["score"]
    assert by_code["Options A and B fail, so the answer is E."]["score"]


def test_math_equal_strip_string_and_choice_cleaners_match_the_official_code():
    assert [p for p in MATH["math_equal"] if math_equal(p[0], p[1]) != p[2]] == []
    assert {verdict for *_, verdict in MATH["math_equal"]} == {True, False}
    twice = [(t, strip_string(t), strip_string(strip_string(t))) for t, *_ in MATH["strip_string"]]
    assert twice == [tuple(row) for row in MATH["strip_string"]]
    cleaned = [(code, choice_from_text(code), choice_answer_clean(code)) for code, *_ in MATH["choice_answer_clean"]]
    assert cleaned == [tuple(row) for row in MATH["choice_answer_clean"]]


def test_word_to_num_reads_as_word2number():
    assert word_to_num("two million three thousand") == 2004003  # word2number reads "three thousand" twice
    assert word_to_num("one point two five") == 1.25 and word_to_num("a + one") == 1
    for text in ("7²", "thousand one", "apples", "one thousand one thousand"):
        with pytest.raises((ValueError, IndexError)):
            word_to_num(text)


def test_reasoning_scores_a_unicode_superscript_without_failing(tmp_path):
    dataset = ReasoningDataset("gsm8k", data_dir="fixtures", num_samples=2, options=dict(REASONING_OPTIONS))
    samples = list(dataset.samples())
    with collect_scoring_errors() as errors:
        scores = dataset.score(["The answer is 7².", "So the total is 7.0"], samples)
    assert scores["score"] == 0.0 and errors == {}  # graded (wrong), as the official code does


@pytest.fixture(scope="module")
def tokenizers(real_tokenizer):
    return {family: real_tokenizer(family) for family in ("llama3", "qwen2")}


def test_infinitebench_truncation_decodes_as_truncate_by_tokens(tokenizers):
    """Cut or not, the prompt goes through ``tok.decode(..., skip_special_tokens=True)``: special-token text goes."""
    for key, expected in INFINITEBENCH["truncate_by_tokens"].items():
        family, length = key.split("/")
        ours = [truncate_prompt_joined(p, tokenizers[family], int(length), True) for p in INFINITEBENCH["prompts"]]
        assert ours == expected, key
    assert "<|eot_id|>" not in INFINITEBENCH["truncate_by_tokens"]["llama3/131072"][0]


def test_infinitebench_runner_encoding_drops_special_token_text(tokenizers):
    """Nothing cut, and still the special-token text of the context is gone: no ``<|eot_id|>`` id reaches the model."""
    dataset = InfiniteBenchDataset("passkey", data_dir="fixtures", num_samples=1, options=dict(VALID_OPTIONS))
    sample = dataset.samples()[0]
    special = dataclasses.replace(sample, context="Note <|eot_id|> here. " + sample.context)
    tokenizer = tokenizers["llama3"]
    encoded = encode_sample(
        tokenizer, special, max_input_length=131072, use_chat_template=False, truncation=dataset.truncation
    )
    assert tokenizer.convert_tokens_to_ids("<|eot_id|>") not in encoded.input_ids
    assert not encoded.truncated and not encoded.question_lost
    assert encoded.input_ids[0] == tokenizer.bos_token_id and encoded.input_ids.count(tokenizer.bos_token_id) == 1


def test_math_find_as_each_official_scorer():
    """InfiniteBench's ``int(number)`` raises on "7.0" (recorded: the error); SCBench's copy reads ``int(float())``."""
    for prediction, label, official in INFINITEBENCH["math_find"]:
        if isinstance(official, str):
            with pytest.raises(ValueError):
                infinitebench_metrics.score_one("math_find", prediction, label, "")
        else:
            assert infinitebench_metrics.score_one("math_find", prediction, label, "") == official
    assert [[p, label, scbench_math_find(p, label)] for p, label, _ in SCBENCH["math_find"]] == SCBENCH["math_find"]


def test_scbench_repoqa_and_kv_aggregates_as_compute_scores():
    """Multi-request scores the kv sub-task's whole rows (``label in row``: the row's keys), multi-turn its text;
    ``fixed_scdq_kv`` scores the text in both."""
    rows = [
        ScoredRow(
            r["turn_idx"], r["prediction"], r["ground_truth"], r["task"], r["lang"], r["repo"], r.get("func_name")
        )
        for r in SCBENCH["repoqa_and_kv_rows"]
    ]
    for mode, multi_request in (("multi_turn", False), ("scdq", True)):
        ours = official_scores("scbench_repoqa_and_kv", rows, multi_request, "code_block")
        assert ",".join(f"{100 * value:.3f}" for value in ours.values()) == SCBENCH["repoqa_and_kv"][mode]
    fixed = official_scores("scbench_repoqa_and_kv", rows, True, "code_block", fixed_scdq_kv=True)
    assert fixed == {"all/scbench_repoqa": 1.0, "all/scbench_kv": 1.0}


def test_a_scoring_error_is_recorded_in_the_row_and_counted_not_raised(tmp_path):
    dataset = InfiniteBenchDataset("math_find", data_dir="fixtures", num_samples=None, options=dict(VALID_OPTIONS))
    samples = list(dataset.samples())  # labels 96 and [2]
    rows = [{"id": s.id, "prediction": p} for s, p in zip(samples, ["96.0", "2"], strict=True)]
    (tmp_path / "predictions.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    scores, record = score_rows(dataset, rows, samples, tmp_path)
    assert scores["score"] == 50.0
    assert record["count"] == 1 and list(record["by_sample"]) == [samples[0].id]
    assert "ValueError" in record["by_sample"][samples[0].id]
    written = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert "scoring_error" in written[0] and "scoring_error" not in written[1]
    guard = ScoreGuard()
    assert guard("x", int, "7.0") == 0.0 and guard.errors == {
        "x": "ValueError: invalid literal for int() with base 10: '7.0'"
    }


def test_math_verify_gets_the_reference_as_written():
    """``strip_string`` mangles ``\\frac{a}{b}`` (its unit words: "a") -- what math-verify must not be handed."""
    example = {"solution": "Thus $\\boxed{\\frac{a}{b}}$."}
    assert ground_truth(example, "math") == "\\frac{}{b}"
    assert reference_text(example, "math") == "\\frac{a}{b}"
    assert reference_text({"answer": "Half of 36.\n#### 18"}, "gsm8k") == "18"


def test_math_verify_grades_against_the_reference_as_written():
    pytest.importorskip("math_verify")
    dataset = ReasoningDataset("math500", data_dir="fixtures", num_samples=1, options=dict(REASONING_OPTIONS))
    dataset.grader = "math_verify"
    assert dataset.is_correct("so \\boxed{\\frac{a}{b}}", "\\frac{}{b}", "\\frac{a}{b}")


def test_the_new_scbench_switch_off_keeps_the_hash_of_before():
    """``fixed_scdq_kv`` changes scores only: off, the config hashes as one without the option (existing runs keep
    their folders); on, it is another run."""
    from omegaconf import OmegaConf

    from kvbench.api import compose_config
    from kvbench.storage.writers import config_hash

    cfg = compose_config("snapkv", "64L", overrides=["task=scbench"])
    before = OmegaConf.to_container(cfg, resolve=True)
    del before["task"]["options"]["fixed_scdq_kv"]
    assert config_hash(cfg) == config_hash(OmegaConf.create(before))
    assert config_hash(
        compose_config("snapkv", "64L", overrides=["task=scbench", "task.options.fixed_scdq_kv=true"])
    ) != (config_hash(cfg))
