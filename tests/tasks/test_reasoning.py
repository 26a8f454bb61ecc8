"""Long reasoning (``task=reasoning``) against the official QwenLM/Qwen2.5-Math evaluation (commit a45202b): prompts,
reference answers, answer extraction and ``math_equal``, compared with outputs of the official code recorded on the
shipped fixtures and on hand-written predictions (``tests/tasks/recorded/reasoning_official.json``, its ``about``
says how).  Cost: about 2 s (sympy)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kvbench.metrics.math_answer import extract_answer, strip_string, word_to_number
from kvbench.metrics.math_grader import math_equal
from kvbench.tasks.base import build_task
from kvbench.tasks.reasoning import DATASETS, prepare_reasoning, wilson_interval, write_prepared
from tests.task_config import task_config

RECORDED = json.loads((Path(__file__).parent / "recorded" / "reasoning_official.json").read_text(encoding="utf-8"))


def _datasets(**options):
    cfg = task_config("reasoning", data_dir="fixtures", options=options)
    return {dataset.name: dataset for dataset in build_task(cfg, tokenizer=None)}


def test_prompts_and_references_are_the_official_ones_byte_for_byte():
    datasets = _datasets()
    assert list(datasets) == list(DATASETS)
    for name, dataset in datasets.items():
        samples = dataset.samples()
        assert [s.context + s.question for s in samples] == RECORDED["prompts"][name]
        assert [s.answers[0] for s in samples] == RECORDED["ground_truth"][name]
        assert dataset.chat_template is False and "<|im_end|>" in dataset.stop_strings


@pytest.mark.parametrize("row", RECORDED["extract"], ids=lambda row: row[1][:30])
def test_extract_answer_matches_the_official_parser(row):
    data_name, text, official, official_stripped = row
    assert extract_answer(text, data_name) == official
    assert strip_string(official) == official_stripped


def test_math_equal_matches_the_official_grader_on_every_recorded_pair():
    differ = [(p, r, want) for p, r, want in RECORDED["equal"] if math_equal(p, r) != want]
    assert differ == []
    assert {want for _, _, want in RECORDED["equal"]} == {True, False}  # both outcomes are covered


def test_word_numbers_and_leading_zeros_normalise_as_word2number():
    assert word_to_number("049") == "49"
    assert word_to_number("twenty five") == "25"
    assert word_to_number("one thousand two hundred") == "1200"
    assert word_to_number("x+1") == "x+1"


def test_scoring_greedy_and_sampled_with_intervals():
    gsm = _datasets()["gsm8k"]
    samples = gsm.samples()
    scores = gsm.score(["The answer is 6.", "so \\boxed{1000}", "I got 85"], samples)
    assert scores["score"] == pytest.approx(200 / 3)
    assert scores["ci_low"] < scores["score"] < scores["ci_high"]
    assert scores["n_questions"] == 3
    sampled = _datasets(sampling="sampled", n_samples=2)["gsm8k"]
    draws = sampled.samples()
    assert [s.id for s in draws][:2] == ["0#0", "0#1"] and len(draws) == 6
    seeds = {sampled.sampling.for_sample(s.id).seed for s in draws}
    assert len(seeds) == 6  # every draw has its own seed
    outputs = ["\\boxed{6}", "\\boxed{7}", "\\boxed{1,000}", "\\boxed{1000}", "84", "0"]
    scores = sampled.score(outputs, draws)
    assert scores["score"] == pytest.approx(100 * (0.5 + 1 + 0.5) / 3)
    assert scores["pass_at_n"] == pytest.approx(100.0)
    assert scores["first_draw"] == pytest.approx(100.0)  # evaluate.py's acc: draw 0 of each question (all right)


def test_wilson_interval_is_a_proper_interval():
    low, high = wilson_interval(15, 30)
    assert low < 0.5 < high and math.isclose(low + high, 1.0)
    assert wilson_interval(0, 0) == (0.0, 0.0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"grader": "exact"}, "task.options.grader"),
        ({"sampling": "beam"}, "task.options.sampling"),
        ({"n_samples": 4}, "needs task.options.sampling=sampled"),
        ({"n_samples": 0, "sampling": "sampled"}, "task.options.n_samples"),
        ({"bogus": 1}, "bogus"),
        ({"sampling": "sampled", "top_p": 1.5}, "top_p"),
    ],
)
def test_bad_options_name_the_setting(options, message):
    with pytest.raises(ValueError, match=message):
        _datasets(**options)


def test_unknown_dataset_and_max_new_tokens_cap():
    with pytest.raises(ValueError, match="valid datasets: gsm8k"):
        build_task(task_config("reasoning", data_dir="fixtures", datasets=["gsm9k"]), tokenizer=None)
    capped = _datasets(max_new_tokens=64)
    assert {d.max_new_tokens for d in capped.values()} == {64}
    assert _datasets()["aime24"].max_new_tokens == 32768


def test_prepare_parses_downloads_and_manifest_guards_the_file(tmp_path, monkeypatch):
    source = Path(__file__).parents[2] / "tasks" / "reasoning" / "fixtures"

    def fake_download(url, target):
        name = next(n for n in DATASETS if n in url.lower().replace("-", ""))
        target.write_bytes((source / name / "test.jsonl").read_bytes())

    monkeypatch.setattr("kvbench.tasks.reasoning._download", fake_download)
    prepare_reasoning(tmp_path, datasets=["gsm8k", "aime24"])
    datasets = {
        d.name: d for d in build_task(task_config("reasoning", data_dir=str(tmp_path), datasets=["gsm8k"]), None)
    }
    assert [s.answers[0] for s in datasets["gsm8k"].samples()] == RECORDED["ground_truth"]["gsm8k"]
    (tmp_path / "gsm8k" / "test.jsonl").write_text('{"question": "x", "answer": "#### 1"}\n', encoding="utf-8")
    fresh = build_task(task_config("reasoning", data_dir=str(tmp_path), datasets=["gsm8k"]), None)[0]
    with pytest.raises(ValueError, match="sha256"):
        fresh.samples()
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"problem": "no answer"}\n', encoding="utf-8")
    (tmp_path / "aime25").mkdir()
    with pytest.raises(ValueError, match="missing field"):
        write_prepared(tmp_path / "aime25", broken, "aime25", "test")


def test_math_verify_grader_switch():
    from kvbench.tasks.base import task_kind

    need = task_kind("reasoning").required_packages({"options": {"grader": "math_verify"}})
    assert [n.module for n in need] == ["math_verify"] and "kvbench[reasoning]" in need[0].fix
    assert task_kind("reasoning").required_packages({"options": {}}) == []
    pytest.importorskip("math_verify")
    math500 = _datasets(grader="math_verify")["math500"]
    samples = math500.samples()
    outputs = ["so \\boxed{\\dfrac{11}{12}}", "x = \\boxed{-4.0}", "\\boxed{\\sqrt{7}}"]
    assert math500.score(outputs, samples)["score"] == pytest.approx(200 / 3)


def test_shipped_config_holds_the_builder_defaults():
    from omegaconf import OmegaConf

    from kvbench.tasks.reasoning import VALID_OPTIONS

    raw = OmegaConf.load(Path(__file__).parents[2] / "conf" / "task" / "reasoning.yaml")
    assert raw.kind == "reasoning" and OmegaConf.to_container(raw.options) == VALID_OPTIONS
