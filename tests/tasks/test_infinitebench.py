"""InfiniteBench against the official OpenBMB/InfiniteBench ``src/`` (commit 88b3daa): prompts of every task and
template, truncation, labels and the ``compute_scores.py`` scorers, compared with outputs of the official code recorded
on the shipped fixtures (``tests/tasks/recorded/infinitebench_official.json``; its ``about`` says how)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from kvbench.metrics.infinitebench import score_one
from kvbench.prompting import encode_sample, truncate_prompt_joined
from kvbench.tasks.base import build_task
from kvbench.tasks.infinitebench import (
    FIXTURES_DIR,
    VALID_OPTIONS,
    InfiniteBenchDataset,
    prepare_infinitebench,
    task_names,
)
from tests.task_config import task_config

RECORDED = json.loads((Path(__file__).parent / "recorded" / "infinitebench_official.json").read_text(encoding="utf-8"))
FAMILIES = {"llama3": "llama3.1", "mistral-v1": "mistral-v0.2"}


@pytest.fixture(scope="module")
def tokenizers(real_tokenizer):
    return {family: real_tokenizer(family, template) for family, template in FAMILIES.items()}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _dataset(task: str, **options) -> InfiniteBenchDataset:
    return InfiniteBenchDataset(task, data_dir="fixtures", num_samples=None, options={**VALID_OPTIONS, **options})


@pytest.mark.parametrize("template", ["yarn-mistral", "gpt4", "claude2"])
def test_prompts_match_create_prompt_for_every_task(template):
    for task in task_names():
        recorded = RECORDED["prompts"][f"{template}/{task}/raw"]
        if "error" in recorded:  # claude2's longbook_qa_eng template names {input}: the official code fails too
            with pytest.raises(ValueError, match="needs field 'input'"):
                _dataset(task, template=template).samples()
            continue
        ours = [s.context + s.question for s in _dataset(task, template=template).samples()]
        assert [_sha(text) for text in ours] == [r["sha256"] for r in recorded], (template, task)


def test_truncation_matches_truncate_by_tokens(tokenizers):
    for task in task_names():
        samples = _dataset(task).samples()
        for family, tokenizer in tokenizers.items():
            for max_len in (131072, 301, 300):
                recorded = RECORDED["prompts"][f"yarn-mistral/{task}/{family}/{max_len}"]
                ours = [
                    truncate_prompt_joined(s.context + s.question, tokenizer, max_len, equal_halves=True)
                    for s in samples
                ]
                assert [_sha(text) for text in ours] == [r["sha256"] for r in recorded], (task, family, max_len)
                for text, record in zip(ours, recorded, strict=True):
                    if "text" in record:
                        assert text == record["text"]


def test_runner_encoding_is_the_raw_truncated_prompt(tokenizers):
    """No chat template (official): the ids are the truncated text tokenised with special tokens, as the official
    scripts re-tokenise it; the question segment is what follows the context."""
    tokenizer = tokenizers["llama3"]
    dataset = _dataset("passkey")
    for sample, record in zip(dataset.samples(), RECORDED["prompts"]["yarn-mistral/passkey/llama3/300"], strict=True):
        encoded = encode_sample(
            tokenizer,
            sample,
            max_input_length=300,
            use_chat_template=dataset.chat_template,
            truncation=dataset.truncation,
        )
        assert _sha(tokenizer.decode(encoded.input_ids, skip_special_tokens=True)) == record["sha256"]
        assert tokenizer.decode(encoded.question_ids).endswith("The pass key is")


def test_labels_are_get_answer():
    for task in task_names():
        labels = [s.extra["label"] for s in _dataset(task).samples()]
        assert labels == RECORDED["labels"][task], task


@pytest.mark.parametrize("model_name", ["yarn-mistral", "gpt4"])
def test_scorers_match_compute_scores(model_name):
    for task in task_names():
        predictions = RECORDED["predictions"][task]
        expected = RECORDED["scores"][f"{model_name}/{task}"]
        for label, row in zip(RECORDED["labels"][task], expected, strict=True):
            assert [score_one(task, p, label, model_name) for p in predictions] == row, (task, label)


def test_dataset_score_is_the_official_mean_times_100_and_kv_fix_is_a_switch():
    dataset = _dataset("kv_retrieval")
    samples = dataset.samples()
    predictions = RECORDED["predictions"]["kv_retrieval"][:2]
    official = RECORDED["scores"]["yarn-mistral/kv_retrieval"]
    assert dataset.score(predictions, samples)["score"] == 100 * (official[0][0] + official[1][1]) / 2
    # The first fixture stores its label as a list (as the hub does): the official scorer never matches it.
    assert official[0][0] == 0.0
    fixed = _dataset("kv_retrieval", fixed_kv_label=True)
    assert fixed.score(predictions, fixed.samples())["score"] == 100.0


def test_auto_template_reads_the_model_preset(tokenizers):
    from types import SimpleNamespace

    from kvbench.tasks.infinitebench import auto_template

    assert auto_template(SimpleNamespace(name_or_path="mistralai/Mistral-7B-Instruct-v0.2")) == (
        "yarn-mistral",
        "official (yarn-mistral)",
    )
    template, rule = auto_template(tokenizers["llama3"])
    assert template == "yarn-mistral" and rule.startswith("fallback")
    dataset = build_task(task_config("infinitebench", data_dir="fixtures", datasets=["passkey"]), tokenizers["llama3"])[
        0
    ]
    assert dataset.describe()["template_rule"].startswith("fallback")


def test_options_data_and_preparer(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"task\.options\.template='kimi' is not valid"):
        build_task(task_config("infinitebench", data_dir="fixtures", options={"template": "kimi"}), None)
    datasets = build_task(task_config("infinitebench", data_dir="fixtures", options={"max_new_tokens": 8}), None)
    assert [d.name for d in datasets] == task_names() and max(d.max_new_tokens for d in datasets) == 8
    assert not datasets[0].chat_template and datasets[0].truncation == "middle_joined_half"
    from kvbench.tasks import provenance

    monkeypatch.setattr(provenance, "hub_dataset_file", lambda _b, _r, name, _v, _h: (FIXTURES_DIR / name, "c0ffee"))
    prepare_infinitebench(tmp_path)
    dataset = InfiniteBenchDataset("passkey", data_dir=str(tmp_path), num_samples=1, options=dict(VALID_OPTIONS))
    assert len(dataset.samples()) == 1 and dataset.provenance()["data"]["source"] == "official"
    (tmp_path / "passkey.jsonl").write_text('{"context": "x", "input": "y", "answer": ["1"]}\n')
    with pytest.raises(ValueError, match=r"sha256 \w+ differs"):
        InfiniteBenchDataset("passkey", data_dir=str(tmp_path), num_samples=None, options=dict(VALID_OPTIONS)).samples()
