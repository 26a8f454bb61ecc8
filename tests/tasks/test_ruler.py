"""RULER generators and scorers: length fitting with a real (in-code) tokenizer, templates, determinism, scoring."""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from kvbench.metrics.synthetic import ruler_average, ruler_postprocess, string_match_all, string_match_part
from kvbench.tasks.base import build_task, data_preparers
from kvbench.tasks.ruler import MAX_NEW_TOKENS, TASKS, build_ruler
from tests.task_config import task_config

REPO = Path(__file__).resolve().parents[2]


def _cfg(**overrides):
    return task_config("ruler", **{"num_samples": 2, "length": 1024, **overrides})


def _ntok(tokenizer, text: str) -> int:
    return len(tokenizer.tokenize(text))


# ------------------------------------------------------------------------------------------------ length fitting


@pytest.mark.parametrize("length", [1024, 2048])
def test_all_tasks_fit_target_length(tokenizer, length):
    datasets = build_ruler(_cfg(length=length), tokenizer)
    assert [d.name for d in datasets] == list(TASKS)
    for ds in datasets:
        for sample in ds.samples():
            used = _ntok(tokenizer, sample.prompt) + ds.max_new_tokens
            assert used <= length, (ds.name, used)
            assert used > 0.45 * length, (ds.name, used)  # the size search fills the budget
            assert sample.extra["prompt_tokens"] == _ntok(tokenizer, sample.prompt)
            assert sample.extra["target_length"] == length


def test_fits_4096_tightly(tokenizer):
    names = ["niah_single_1", "niah_single_2", "niah_multikey_2", "vt", "cwe", "fwe", "qa_1"]
    for ds in build_ruler(_cfg(length=4096, datasets=names, num_samples=1), tokenizer):
        (sample,) = ds.samples()
        used = _ntok(tokenizer, sample.prompt) + ds.max_new_tokens
        assert 0.75 * 4096 < used <= 4096, (ds.name, used)


def test_several_lengths_get_suffixed_names(tokenizer):
    datasets = build_ruler(_cfg(lengths=[1024, 2048], datasets=["niah_single_1"], num_samples=1), tokenizer)
    assert [d.name for d in datasets] == ["niah_single_1_1024", "niah_single_1_2048"]
    assert [d.length for d in datasets] == [1024, 2048]


# ------------------------------------------------------------------------------------------------ task content


def test_niah_needles_and_singular_template(tokenizer):
    (ds,) = build_ruler(_cfg(datasets=["niah_single_1"]), tokenizer)
    for sample in ds.samples():
        (key,) = sample.extra["query_keys"]
        (value,) = sample.answers
        assert re.fullmatch(r"\d{7}", value)
        assert re.fullmatch(r"[a-z]+-[a-z]+", key)
        assert f"One of the special magic numbers for {key} is: {value}." in sample.context
        assert sample.context.startswith("A special magic number is hidden within the following text.")
        assert "The grass is green. The sky is blue." in sample.context
        assert sample.question == f"What is the special magic number for {key} mentioned in the provided text?"
        assert sample.answer_prefix == f" The special magic number for {key} mentioned in the provided text is"
        assert 0 <= sample.extra["depth"] <= 100


def test_niah_multi_variants(tokenizer):
    names = ["niah_multikey_1", "niah_multikey_3", "niah_multivalue", "niah_multiquery"]
    ds = {d.name: d for d in build_ruler(_cfg(datasets=names, length=2048), tokenizer)}
    mk1 = ds["niah_multikey_1"].samples()[0]
    assert len(mk1.extra["needles"]) == 4 and len(mk1.answers) == 1
    mk3 = ds["niah_multikey_3"].samples()[0]
    uuid_re = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
    assert re.fullmatch(uuid_re, mk3.answers[0]) and re.fullmatch(uuid_re, mk3.extra["query_keys"][0])
    assert mk3.context.count("One of the special magic uuids for") > 10  # needle haystack = distractor needles
    mv = ds["niah_multivalue"].samples()[0]
    assert len(mv.answers) == 4 and mv.context.startswith("Some special magic numbers are hidden")
    assert mv.question.startswith("What are all the special magic numbers for")
    mq = ds["niah_multiquery"].samples()[0]
    keys = mq.extra["query_keys"]
    assert len(keys) == 4 and len(mq.answers) == 4
    assert f"for {keys[0]}, {keys[1]}, {keys[2]}, and {keys[3]} mentioned" in mq.question
    for sample in (mk1, mk3, mv, mq):
        assert all(answer in sample.context for answer in sample.answers)


def test_variable_tracking_chain_and_icl(tokenizer):
    (ds,) = build_ruler(_cfg(datasets=["vt"], length=2048), tokenizer)
    sample = ds.samples()[0]
    names = sample.answers
    assert len(names) == 5 and all(re.fullmatch(r"[A-Z]{5}", n) for n in names)
    value = re.search(r"assigned the value (\d{5}) in the text above", sample.question).group(1)
    assert sample.answer_prefix.endswith(f"5 variables are assigned the value {value}, they are: ")
    assert f"VAR {names[0]} = {value}" in sample.context
    for prev, nxt in itertools.pairwise(names):
        assert f"VAR {nxt} = VAR {prev}" in sample.context
    # one-shot example (3-letter names, randomised value) precedes the task instruction
    instruction = "Memorize and track the chain(s) of variable assignment hidden in the following text."
    assert sample.context.count(instruction) == 2
    icl = sample.context.split(instruction)[1]
    assert re.search(r"they are: +[A-Z]{3} [A-Z]{3} [A-Z]{3} [A-Z]{3} [A-Z]{3}\n", icl)
    assert "12345" not in sample.context


def test_cwe_answers_are_the_most_common_words(tokenizer):
    (ds,) = build_ruler(_cfg(datasets=["cwe"], length=2048), tokenizer)
    for sample in ds.samples():
        main = sample.context.split("\n")[-2]  # the numbered list of the real question
        ((shot_user, shot_reply),) = sample.shots  # the worked example: a complete turn of its own
        assert shot_user.startswith("Below is a numbered list of words.") and shot_user.endswith("above list?")
        assert shot_reply.startswith(" Answer: The top 10 words that appear most often in the list are: 1. ")
        words = re.findall(r"\d+\. (\S+)", main)
        counts = Counter(words)
        assert len(sample.answers) == 10
        least_common_answer = min(counts[w] for w in sample.answers)
        others = [c for w, c in counts.items() if w not in sample.answers]
        assert least_common_answer > max(others)
        assert sample.context.count("Question: What are the 10 most common words in the above list?") == 0
        assert sample.question.startswith("Question: What are the 10 most common words")


def test_fwe_answers_are_the_most_frequent_coded_words(tokenizer):
    (ds,) = build_ruler(_cfg(datasets=["fwe"], length=2048), tokenizer)
    for sample in ds.samples():
        counts = Counter(sample.context.split("Find the three most frequently appeared coded words. ")[1].split())
        ranked = [w for w, _ in counts.most_common() if w != "..."]
        assert sample.answers == ranked[:3]
        assert counts["..."] > counts[ranked[0]]  # the noise word "..." is the most frequent of all


def test_qa_uses_data_dir_and_includes_gold(tokenizer, tmp_path):
    squad = {
        "data": [
            {
                "title": "T",
                "paragraphs": [
                    {
                        "context": f"Paragraph {i} says the code word is word{i}.",
                        "qas": [
                            {
                                "question": f"What is the code word of paragraph {i}?",
                                "is_impossible": False,
                                "answers": [{"text": f"word{i}"}],
                            }
                        ],
                    }
                    for i in range(30)
                ],
            }
        ]
    }
    (tmp_path / "dev-v2.0.json").write_text(json.dumps(squad))
    (ds,) = build_ruler(_cfg(datasets=["qa_1"], data_dir=str(tmp_path), num_samples=3), tokenizer)
    samples = ds.samples()
    assert len(samples) == 3 and ds.metric_name == "string_match_part"
    for i, sample in enumerate(samples):
        assert sample.answers == [f"word{i}"]
        assert f"Paragraph {i} says the code word is word{i}." in sample.context
        assert "Document 1:\n" in sample.context
        assert sample.question.endswith(f"Question: What is the code word of paragraph {i}?")
        assert sample.answer_prefix == " Answer:"
    record = ds.provenance()["squad"]
    assert record["source"] == "official" and record["path"] == str(tmp_path / "dev-v2.0.json")


def test_qa_shipped_fixtures(tokenizer):
    datasets = build_ruler(_cfg(datasets=["qa_1", "qa_2"], num_samples=100), tokenizer)
    for ds in datasets:
        samples = ds.samples()
        assert 0 < len(samples) < 100  # capped at the fixture's questions
        corpus = ds.inputs.qa_corpus(ds.task.args["dataset"])
        for sample in samples:
            record = corpus.questions[sample.extra["question_index"]]
            assert sample.answers == record["outputs"]
            assert all(corpus.docs[i] in sample.context for i in record["context"])  # gold documents present


# ------------------------------------------------------------------------------------------------ determinism


def test_generation_is_deterministic_for_a_seed(tokenizer):
    names = ["niah_single_2", "niah_multikey_2", "vt", "cwe", "fwe", "qa_2"]

    def build(seed):
        return [
            [(s.context, s.question, s.answers) for s in d.samples()]
            for d in build_ruler(_cfg(datasets=names, seed=seed), tokenizer)
        ]

    first, second, other = build(42), build(42), build(7)
    assert first == second
    assert first != other


# ------------------------------------------------------------------------------------------------ settings


def test_max_new_tokens_metrics_and_prefix_modes(tokenizer):
    datasets = {d.name: d for d in build_ruler(_cfg(), tokenizer)}
    expected = {"niah_single_1": 128, "vt": 30, "cwe": 120, "fwe": 50, "qa_1": 32}
    assert {n: datasets[n].max_new_tokens for n in expected} == expected
    assert {d.metric_name for n, d in datasets.items() if not n.startswith("qa")} == {"string_match_all"}
    assert set(MAX_NEW_TOKENS) == {"niah", "vt", "cwe", "fwe", "qa"}

    (override,) = build_ruler(_cfg(datasets=["cwe"], options={"max_new_tokens": 64}), tokenizer)
    assert override.max_new_tokens == 64

    prefix = " Answer: According to the coded text above, the three most frequently appeared words are:"
    (official,) = build_ruler(_cfg(datasets=["fwe"]), tokenizer)
    sample = official.samples()[0]
    assert sample.answer_prefix == prefix and not sample.question.endswith(prefix)
    (inline,) = build_ruler(_cfg(datasets=["fwe"], options={"answer_prefix": "user"}), tokenizer)
    sample = inline.samples()[0]
    assert sample.answer_prefix == "" and sample.question.endswith(prefix)
    for retired in ("extra", "question"):  # "extra" used to drop the prefix silently
        with pytest.raises(ValueError, match=r"answer_prefix=.* is not valid; valid: assistant, user"):
            build_ruler(_cfg(datasets=["fwe"], options={"answer_prefix": retired}), tokenizer)


def test_invalid_options_and_datasets_are_rejected(tokenizer):
    with pytest.raises(ValueError, match=r"valid keys: .*answer_prefix"):
        build_ruler(_cfg(options={"bogus": 1}), tokenizer)
    with pytest.raises(ValueError, match="valid datasets"):
        build_ruler(_cfg(datasets=["niah_single_9"]), tokenizer)


def test_registered_and_yaml_composes(tokenizer):
    from omegaconf import OmegaConf

    from kvbench.config import TaskConfig

    raw = OmegaConf.load(REPO / "conf" / "task" / "ruler.yaml")
    raw.pop("defaults")
    cfg = OmegaConf.merge(OmegaConf.structured(TaskConfig), raw)
    assert cfg.length == 4096
    cfg.length, cfg.num_samples, cfg.datasets = 1024, 1, ["niah_single_1"]
    (ds,) = build_task(cfg, tokenizer)
    assert ds.name == "niah_single_1" and len(ds.samples()) == 1
    assert "ruler" in data_preparers()


# ------------------------------------------------------------------------------------------------ scoring


def test_string_match_golden():
    preds = ["The numbers are 123 and 456.", "nothing here", "ABC"]
    refs = [["123", "456", "789"], ["x"], ["abc"]]
    assert string_match_all(preds, refs) == round((2 / 3 + 0 + 1) / 3 * 100, 2) == 55.56
    assert string_match_part(preds, refs) == round(2 / 3 * 100, 2) == 66.67
    assert string_match_all([], []) == 0.0
    with pytest.raises(ValueError):
        string_match_all(["a"], [])
    assert ruler_postprocess("  1234\x00567\t8 \n") == "1234\n567\n8"
    assert ruler_average({"a": 80.0, "b": 90.0}) == 85.0


def test_dataset_score(tokenizer):
    (ds,) = build_ruler(_cfg(datasets=["niah_multivalue"], length=2048), tokenizer)
    samples = ds.samples()
    good = " ".join(samples[0].answers)
    half = " ".join(samples[1].answers[:2])
    preds = [ds.postprocess(f"  {good}\x01"), ds.postprocess(half)]
    assert ds.score(preds, samples) == {"score": 75.0, "nulls": 0.0}
    assert ds.score(["", ""], samples) == {"score": 0.0, "nulls": 2.0}


def test_essay_haystack_from_data_dir(tokenizer, tmp_path):
    text = " ".join(f"Sentence number {i} is about the quiet harbour." for i in range(400))
    (tmp_path / "PaulGrahamEssays.json").write_text(json.dumps({"text": text}))
    (ds,) = build_ruler(_cfg(datasets=["niah_single_2"], data_dir=str(tmp_path), num_samples=1), tokenizer)
    (sample,) = ds.samples()
    assert sample.context.startswith(
        "A special magic number is hidden within the following text. Make sure to memorize it. "
        "I will quiz you about the number afterwards.\nSentence number 0 is about the quiet harbour."
    )
    record = ds.provenance()["essays"]
    assert record["source"] == "official" and record["path"] == str(tmp_path / "PaulGrahamEssays.json")
    assert len(record["sha256"]) == 64
    assert sample.answers[0] in sample.context
    with pytest.raises(FileNotFoundError):
        build_ruler(_cfg(data_dir=str(tmp_path / "missing")), tokenizer)
