"""NeedleBench v1: sizes and needle placement with a real (in-code) tokenizer, prompts, determinism, scoring."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from kvbench.metrics.synthetic import (
    levenshtein,
    needlebench_multi_reasoning_score,
    needlebench_overall,
    needlebench_parallel_scores,
    needlebench_single_score,
    needlebench_summary,
)
from kvbench.tasks.base import build_task, data_preparers
from kvbench.tasks.needlebench import DEPTHS_11, DEPTHS_20, SIZES, build_needlebench, synthetic_reasoning_records
from tests.task_config import task_config

REPO = Path(__file__).resolve().parents[2]


def _cfg(**overrides):
    return task_config(
        "needlebench",
        **{
            "lengths": [1500, 3000],
            "depths": [0, 30, 70, 100],
            "options": {"size": "4k", "repeats": 2, "needle_counts": [2, 3]},
            **overrides,
        },
    )


def _document(sample) -> str:
    """The haystack (needles included) between the prompt head and the question."""
    marker = (
        "用户现在给你的文档是"
        if "用户现在给你的文档是" in sample.context
        else "The document given to you by the user is "
    )
    return sample.context.split(marker, 1)[1][: -len("\n\n")]


def _ntok(tokenizer, text: str) -> int:
    return len(tokenizer.tokenize(text))


# ------------------------------------------------------------------------------------------------ generation


@pytest.mark.parametrize("fit_length", [False, True])
def test_datasets_and_sizes(tokenizer, fit_length):
    options = {"size": "4k", "repeats": 2, "needle_counts": [2, 3], "fit_length": fit_length}
    datasets = build_needlebench(_cfg(options=options), tokenizer)
    assert [d.name for d in datasets] == [
        "single_retrieval_en",
        "single_retrieval_zh",
        "multi_retrieval_en",
        "multi_retrieval_zh",
        "multi_reasoning_en",
        "multi_reasoning_zh",
    ]
    buffers = {d.name: d.buffer for d in datasets}
    assert buffers == {
        "single_retrieval_en": 600,
        "multi_retrieval_en": 1000,
        "multi_reasoning_en": 600,
        "single_retrieval_zh": 200,
        "multi_retrieval_zh": 200,
        "multi_reasoning_zh": 200,
    }
    counts = {d.name: len(d.samples()) for d in datasets}
    assert counts["single_retrieval_en"] == 2 * 2 * 4  # repeats x lengths x depths
    assert counts["multi_retrieval_zh"] == 2 * 2  # repeats x lengths (all depths in one context)
    assert counts["multi_reasoning_en"] == 2 * 2 * 4 * 2  # ... x needle counts
    for ds in datasets:
        for sample in ds.samples():
            length, trimmed = sample.extra["context_length"], sample.extra["haystack_trimmed"]
            doc_tokens = _ntok(tokenizer, _document(sample))
            # re-tokenising decoded text (cut CJK bytes, merges across the needle borders) moves a few tokens
            assert abs(doc_tokens - sample.extra["haystack_tokens"]) <= 5 + 0.01 * length, (ds.name, doc_tokens)
            # the shipped Chinese corpus is short: OpenCompass's haystack stops at its end (no cycling)
            assert sample.extra["haystack_tokens"] <= length - ds.buffer - trimmed
            if not fit_length:  # OpenCompass never trims: the prompt may overshoot its nominal length
                assert trimmed == 0
                continue
            # fit_length: the whole prompt fits its length, the haystack trimmed only where the buffer falls short
            assert len(tokenizer(sample.context + sample.question).input_ids) <= length
            assert trimmed == 0 or ds.name == "multi_retrieval_zh", ds.name


def test_single_needle_at_requested_depth(tokenizer):
    (ds,) = build_needlebench(_cfg(datasets=["single_retrieval_en"]), tokenizer)
    for sample in ds.samples():
        doc = _document(sample)
        needle = sample.extra["needle"]
        assert doc.count(needle.strip()) == 1 and sample.answers == [sample.extra["keyword"]]
        needle_tokens = _ntok(tokenizer, needle)
        expected = int((sample.extra["haystack_tokens"] - needle_tokens) * sample.extra["depth"] / 100)
        assert sample.extra["needle_token_starts"] == [expected]
        before = _ntok(tokenizer, doc[: doc.index(needle)])
        assert abs(before - expected) <= 2
        assert sample.question.startswith("Now, the question is: ")
        assert "Before answering, please consider what in the document is most relevant to this question." in (
            sample.question
        )
        assert sample.question.endswith("______.'")


def test_multi_retrieval_places_one_needle_per_depth(tokenizer):
    (ds,) = build_needlebench(_cfg(datasets=["multi_retrieval_en"], lengths=[2500]), tokenizer)
    for sample in ds.samples():
        doc = _document(sample)
        keywords = sample.extra["keywords"]
        assert len(keywords) == 4 == len(set(keywords)) and sample.extra["depths"] == [0, 30, 70, 100]
        positions = [doc.index(k) for k in keywords]
        assert positions == sorted(positions)  # needle i at depth i
        fractions = [_ntok(tokenizer, doc[:p]) / _ntok(tokenizer, doc) for p in positions]
        for fraction, depth in zip(fractions, [0, 30, 70, 100], strict=True):
            assert abs(fraction - depth / 100) < 0.08
        assert sample.question.startswith("Now, the questions are: ") and sample.question.endswith("'\n")
        assert sample.question.count("、") == 6  # questions and formats joined with the Chinese comma
        assert "Please answer in the format of 'The" in sample.question


def test_multi_reasoning_needles_are_spaced(tokenizer):
    # cycle_haystack: the shipped Chinese corpus is shorter than 2,000 tokens of this tokenizer
    options = {"size": "4k", "repeats": 2, "needle_counts": [2, 3], "cycle_haystack": True}
    cfg = _cfg(datasets=["multi_reasoning_zh"], lengths=[3000], depths=[20], options=options)
    (ds,) = build_needlebench(cfg, tokenizer)
    for sample in ds.samples():
        starts = sample.extra["needle_token_starts"]
        assert len(starts) == sample.extra["num_needles"]
        total = sample.extra["haystack_tokens"]
        assert starts[0] >= int(0.2 * 2000) - 1
        gaps = [b - a for a, b in itertools.pairwise(starts)]
        assert all(g >= 0.1 * 2000 for g in gaps)  # next needle 10 % of the context further
        assert starts[-1] < total
        assert sample.question.startswith("现在请问：") and sample.question.endswith(
            "在回答之前，请思考文档中与此问题最相关的内容是什么。"
        )
        assert sample.answers[0] in sample.context


def test_chinese_prompts(tokenizer):
    datasets = {d.name: d for d in build_needlebench(_cfg(language="zh", lengths=[1200]), tokenizer)}
    assert set(datasets) == {"single_retrieval_zh", "multi_retrieval_zh", "multi_reasoning_zh"}
    single = datasets["single_retrieval_zh"].samples()[0]
    assert single.context.startswith("你是一个善于回答用户问题的智能AI助手\n请保持你的回答简洁清楚。")
    assert "在回答之前，请思考文档中与此问题最相关的内容是什么。请按照'" in single.question
    parallel = datasets["multi_retrieval_zh"].samples()[0]
    assert "请先仔细阅读下面的文档再依次回答最后提出的问题\n用户现在给你的文档是" in parallel.context
    assert parallel.question.endswith("'的格式回答。\n")


def test_deterministic_for_a_seed(tokenizer):
    def build(seed):
        return [[s.prompt for s in d.samples()] for d in build_needlebench(_cfg(seed=seed, lengths=[1500]), tokenizer)]

    first = build(42)
    assert first == build(42)
    assert first != build(43)


def test_data_dir_inputs(tokenizer, tmp_path):
    (tmp_path / "PaulGrahamEssays.jsonl").write_text(
        "\n".join(json.dumps({"text": f"Essay number {i} talks about rivers. " * 60}) for i in range(5))
    )
    needle = {
        "needle": "The secret fruit of Lake Orin is the golden quince.",
        "retrieval_question": "What is the secret fruit of Lake Orin? Please answer in the format "
        "'The secret fruit of Lake Orin is ______.'",
        "arg1": "Lake Orin",
        "arg2": "golden quince",
        "language": "English",
    }
    (tmp_path / "needles.jsonl").write_text(json.dumps(needle) + "\n")
    (ds,) = build_needlebench(_cfg(data_dir=str(tmp_path), datasets=["single_retrieval_en"]), tokenizer)
    sample = ds.samples()[0]
    assert "Essay number" in sample.context and "golden quince" in sample.context
    assert sample.answers == ["golden quince"]
    record = ds.provenance()["needles"]
    assert record["source"] == "official" and record["path"] == str(tmp_path / "needles.jsonl")


def test_configs_and_validation(tokenizer):
    assert DEPTHS_20 == [0, 5, 10, 15, 21, 26, 31, 36, 42, 47, 52, 57, 63, 68, 73, 78, 84, 89, 94, 100]
    assert SIZES["32k"].lengths == (9000, 13000, 17000, 21000, 25000, 29000, 31000, 32000)
    assert SIZES["128k"].lengths[-1] == 128000 and SIZES["128k"].depths == tuple(DEPTHS_11)
    default = build_needlebench(_cfg(lengths=None, depths=None, options={}), tokenizer)
    assert default[0].lengths == [1000, 2000, 3000, 4000] and default[0].repeats == 10
    assert {d.name: d.repeats for d in default}["multi_retrieval_en"] == 25
    with pytest.raises(ValueError, match="valid keys"):
        build_needlebench(_cfg(options={"sizes": "4k"}), tokenizer)
    with pytest.raises(ValueError, match="size"):
        build_needlebench(_cfg(options={"size": "16k"}), tokenizer)
    with pytest.raises(ValueError, match="language"):
        build_needlebench(_cfg(language="fr"), tokenizer)
    with pytest.raises(ValueError, match="valid datasets"):
        build_needlebench(_cfg(datasets=["single_retrieval"]), tokenizer)
    assert "needlebench" in data_preparers()

    from omegaconf import OmegaConf

    from kvbench.config import TaskConfig

    raw = OmegaConf.load(REPO / "conf" / "task" / "needlebench.yaml")
    raw.pop("defaults")
    cfg = OmegaConf.merge(OmegaConf.structured(TaskConfig), raw)
    datasets = build_task(cfg, tokenizer)
    assert len(datasets) == 6 and datasets[0].lengths == list(SIZES["32k"].lengths)


def test_synthetic_reasoning_records():
    records = synthetic_reasoning_records("en", [2, 5], per_count=3)
    assert [r["derivation_count"] for r in records] == [2, 2, 2, 5, 5, 5]
    for record in records:
        assert len(record["derivations"]) == record["derivation_count"]
        assert record["answer"] in " ".join(record["derivations"])
    assert records == synthetic_reasoning_records("en", [2, 5], per_count=3)


# ------------------------------------------------------------------------------------------------ scoring


def test_scorers_golden():
    needle = "\nHidden on Emerald Island is the legendary Stardust Shard.\n"
    assert needlebench_single_score("The legendary item is Stardust Shard.", needle, "Stardust Shard") == 100.0
    # spec example: 0.2 x 23.08 = 4.62
    pred = "The legendary item hidden on the Emerald Island is Moon Pearl."
    assert needlebench_single_score(pred, needle, "Stardust Shard") == pytest.approx(0.2 * 23.0769, abs=1e-3)
    assert needlebench_single_score("stardust shard", needle, "Stardust Shard") < 100  # case-sensitive keyword
    assert levenshtein("kitten", "sitting") == 3 and levenshtein("", "abc") == 3

    parallel = needlebench_parallel_scores(["A and B", "only A"], [["A", "B"], ["A", "B"]], [0, 50])
    assert parallel == {"Depth0": 100.0, "Depth50": 50.0, "average_score": 75.0}

    assert needlebench_multi_reasoning_score("I think it is abigail.", "Abigail Brown") == 50.0
    assert needlebench_multi_reasoning_score("ABIGAIL BROWN", "Abigail Brown") == 100.0


def test_overall_matches_cake_table():
    # CAKE Table 10, Mistral-7B-Instruct-v0.3, full cache: ZH/EN per subtask -> Overall 78.28
    scores = {
        "single_retrieval_zh": 91.72,
        "single_retrieval_en": 83.01,
        "multi_retrieval_zh": 90.36,
        "multi_retrieval_en": 96.95,
        "multi_reasoning_zh": 55.64,
        "multi_reasoning_en": 45.89,
    }
    summary = needlebench_summary(scores)
    assert summary["single_retrieval"] == pytest.approx(87.365)
    assert summary["overall"] == pytest.approx(78.28, abs=0.01)  # the table rounds the group scores first
    rounded = {"single_retrieval": 87.37, "multi_retrieval": 93.66, "multi_reasoning": 50.77}
    assert round(needlebench_overall(rounded), 2) == 78.28
    assert needlebench_overall({"single_retrieval": 100, "multi_retrieval": 0, "multi_reasoning": 0}) == 40.0
    equal = {"single_retrieval": 1 / 3, "multi_retrieval": 1 / 3, "multi_reasoning": 1 / 3}
    assert needlebench_overall({"single_retrieval": 90, "multi_retrieval": 60, "multi_reasoning": 30}, equal) == 60.0
    assert "overall" not in needlebench_summary({"single_retrieval_en": 50.0})
    with pytest.raises(ValueError):
        needlebench_summary({"longbench_en": 1.0})


def test_dataset_scores(tokenizer):
    datasets = {d.name: d for d in build_needlebench(_cfg(language="en", lengths=[1500]), tokenizer)}
    single = datasets["single_retrieval_en"]
    samples = single.samples()
    preds = [s.answers[0] if i % 2 == 0 else "" for i, s in enumerate(samples)]
    per = [100.0 if i % 2 == 0 else needlebench_single_score("", s.extra["needle"], "x") for i, s in enumerate(samples)]
    result = single.score(preds, samples)
    assert result["score"] == pytest.approx(sum(per) / len(per))
    assert set(result) >= {"length_1500", "depth_0", "depth_100"}

    parallel = datasets["multi_retrieval_en"]
    samples = parallel.samples()
    preds = [" ".join(s.extra["keywords"][:2]) for s in samples]  # the two shallowest needles found
    result = parallel.score(preds, samples)
    assert result["score"] == pytest.approx(50.0)
    assert result["depth_0"] == 100.0 and result["depth_100"] == 0.0

    reasoning = datasets["multi_reasoning_en"]
    samples = reasoning.samples()
    result = reasoning.score([s.answers[0] for s in samples], samples)
    assert result["score"] == 100.0 and result["needles_2"] == 100.0


# ------------------------------------------------------------------------------------------ OpenCompass seeding


def _opencompass_choices(counters, pool, base, haystack_size):
    """The random choices of OpenCompass's loaders (HEAD, 2024-07 on), replayed on the global ``random`` module:
    per counter ``random.seed(counter); random.shuffle(lines)``, then M-RS ``random.seed(counter);
    random.choice(records)`` and M-RT ``random.seed(counter); random.shuffle(needles.copy())``."""
    import random

    state = random.getstate()
    lines, records, orders = list(range(haystack_size)), [], []
    try:
        for counter in counters:
            random.seed(counter)
            random.shuffle(lines)
            random.seed(counter)
            records.append(random.choice(pool))
            needles = list(base)
            random.seed(counter)
            random.shuffle(needles)
            orders.append(needles)
    finally:
        random.setstate(state)
    return records, orders


def test_multi_reasoning_and_multi_retrieval_reseed_per_counter(tokenizer):
    import random

    from kvbench.tasks.needlebench import unique_needles

    cfg = _cfg(
        datasets=["multi_reasoning_en", "multi_retrieval_en"],
        lengths=[1500],
        depths=[20, 60],
        options={"size": "4k", "repeats": 8, "needle_counts": [2]},
    )
    reasoning, retrieval = build_needlebench(cfg, tokenizer)
    pool = [r for r in reasoning.inputs.reasoning("en", [2]) if r["derivation_count"] == 2]
    base = unique_needles(retrieval.inputs.all_needles(), 2, random.Random(42), "en")
    records, orders = _opencompass_choices(range(8), pool, base, len(reasoning.inputs.haystack("en")))
    by_counter = {s.extra["counter"]: s for s in reasoning.samples() if s.extra["depth"] == 20}
    assert [by_counter[c].answers[0] for c in range(8)] == [r["answer"] for r in records]
    assert [s.extra["keywords"] for s in retrieval.samples()] == [[n["arg2"] for n in order] for order in orders]
    assert len({tuple(k) for k in (s.extra["keywords"] for s in retrieval.samples())}) > 1  # the order does vary


def test_unique_needles_shuffle_the_whole_file_then_keep_the_language():
    import random

    from kvbench.tasks.needlebench import unique_needles

    needles = [{"arg1": f"a{i}", "arg2": f"b{i}", "language": "English" if i % 2 else "Chinese"} for i in range(20)]
    shuffled = list(needles)
    random.Random(3).shuffle(shuffled)
    expected = [n for n in shuffled if n["language"] == "English"][:4]
    assert unique_needles(needles, 4, random.Random(3), "en") == expected


@pytest.mark.parametrize("cycle", [False, True])
def test_short_corpus_stops_at_its_end_unless_cycled(tokenizer, cycle):
    """OpenCompass appends records until the target and stops at the corpus end (a shorter haystack); the named
    deviation ``cycle_haystack`` repeats the records instead."""
    options = {"size": "4k", "repeats": 1, "cycle_haystack": cycle}
    (ds,) = build_needlebench(
        _cfg(lengths=[20000], depths=[50], datasets=["single_retrieval_zh"], options=options), tokenizer
    )
    corpus = sum(len(ds.inputs.record_tokens("zh", i)) for i in range(len(ds.inputs.haystack("zh"))))
    (sample,) = ds.samples()
    needle = len(ds.tok.encode(sample.extra["needle"]))
    expected = 20000 - ds.buffer if cycle else corpus + needle
    assert sample.extra["haystack_tokens"] == expected
