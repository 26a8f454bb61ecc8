"""LongBench v2 against the official THUDM/LongBench ``pred.py`` / ``result.py`` (commit 2e00731): prompts, truncation,
the chain-of-thought answer prompt, answer extraction and the accuracy table, compared with outputs of the official
code recorded on the shipped fixtures (``tests/tasks/recorded/longbench_v2_official.json``, its ``about`` says how).
Cost: about 10 s (two tokenizers)."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest

from kvbench.metrics.longbench_v2 import extract_answer, result_row
from kvbench.prompting import encode_sample, truncate_prompt_joined
from kvbench.tasks.base import build_task
from kvbench.tasks.longbench_v2 import FIXTURES_DIR, LongBenchV2Dataset, load_data_file, prepare_longbench_v2
from tests.task_config import task_config

RECORDED = json.loads((Path(__file__).parent / "recorded" / "longbench_v2_official.json").read_text(encoding="utf-8"))
FAMILIES = {"llama3": "llama3.1", "mistral-v1": "mistral-v0.2"}


@pytest.fixture(scope="module")
def tokenizers(real_tokenizer):
    return {family: real_tokenizer(family, template) for family, template in FAMILIES.items()}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _official_user_texts(dataset: LongBenchV2Dataset, tokenizer, max_len: int, cot_outputs: list[str] | None):
    """What kvbench sends as the user message, pass by pass, in the official call order."""
    texts = []
    for index, sample in enumerate(dataset.samples()):
        texts.append(truncate_prompt_joined(sample.context + sample.question, tokenizer, max_len))
        if cot_outputs is not None:
            follow = dataset.follow_up(sample, cot_outputs[index], 1)
            if follow is not None:
                texts.append(truncate_prompt_joined(follow[0].context + follow[0].question, tokenizer, max_len))
    return texts


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("max_len", [120000, 1001, 1000, 333])
def test_prompts_match_the_official_pred_py(tokenizers, family, max_len):
    zero_shot = LongBenchV2Dataset(data_dir="fixtures")
    cot = LongBenchV2Dataset(data_dir="fixtures", prompt="cot")
    for name, dataset, outputs in (("0shot", zero_shot, None), ("cot", cot, RECORDED["canned_outputs"]["cot"])):
        recorded = RECORDED["prompts"][f"{family}/{max_len}/{name}"]
        ours = _official_user_texts(dataset, tokenizers[family], max_len, outputs)
        assert [_sha(text) for text in ours] == [call["sha256"] for call in recorded], (family, max_len, name)
        for text, call in zip(ours, recorded, strict=True):
            if "text" in call:
                assert text == call["text"]
        # Generation limits: 128 (0-shot), 1024 then 128 (chain of thought).
        limits = [dataset.max_new_tokens]
        if outputs is not None:
            limits.append(dataset.answer_max_new_tokens)
        assert {call["max_tokens"] for call in recorded} == set(limits)


def test_no_context_prompt_matches_and_everything_is_question(tokenizers):
    dataset = LongBenchV2Dataset(data_dir="fixtures", prompt="no_context")
    recorded = RECORDED["prompts"]["llama3/120000/no_context"]
    assert [_sha(s.context + s.question) for s in dataset.samples()] == [c["sha256"] for c in recorded]
    assert all(s.context == "" for s in dataset.samples())


def test_encoded_prompt_is_the_chat_template_of_the_truncated_official_text(tokenizers):
    """The runner's ids (truncation ``middle_joined``, then the chat template) equal the official message rendered
    by the model's chat template, as the chat server does; the context/question split falls at the question."""
    tokenizer = tokenizers["llama3"]
    dataset = LongBenchV2Dataset(data_dir="fixtures")
    recorded = RECORDED["prompts"]["llama3/333/0shot"]
    for sample, call in zip(dataset.samples(), recorded, strict=True):
        encoded = encode_sample(
            tokenizer,
            sample,
            max_input_length=333,
            use_chat_template=True,
            truncation=dataset.truncation,
            bos=dataset.bos,
        )
        expected = tokenizer.apply_chat_template(
            [{"role": "user", "content": call["text"]}], add_generation_prompt=True, tokenize=False
        )
        assert encoded.input_ids == tokenizer(expected, add_special_tokens=False).input_ids
        assert tokenizer.decode(encoded.question_ids).startswith("What is the correct answer")
    # Short documents are not truncated: the context is the document prompt, the question the rest.
    first = dataset.samples()[0]
    assert first.context.endswith("</text>\n\n") and first.question.startswith("What is the correct answer")


def test_placeholders_in_fields_follow_the_official_replace_order():
    """Fixture 0005's document holds the text ``$C_A$``: ``pred.py`` replaces it with choice A (``$DOC$`` goes
    first); the question segment still splits off."""
    sample = LongBenchV2Dataset(data_dir="fixtures").samples()[4]
    assert "$C_A$" not in sample.context and "harbour is a literal note" in sample.context
    assert sample.question.startswith("What is the correct answer")


@pytest.mark.parametrize("key", ["llama3/120000/0shot", "llama3/120000/cot", "mistral-v1/333/0shot"])
def test_answer_extraction_matches_the_official_predictions(key):
    for line in RECORDED["predictions"][key]:
        assert extract_answer(line["response"]) == line["pred"]
        assert (line["pred"] == line["answer"]) == line["judge"]


@pytest.mark.parametrize("compensated", [False, True])
def test_result_table_matches_the_official_result_py(compensated):
    table = RECORDED["result_py"][f"compensated={compensated}"]
    for name, key in RECORDED["result_py_files"].items():
        assert result_row(RECORDED["predictions"][key], compensated=compensated) == table[name], name


@pytest.mark.parametrize("prompt", ["0shot", "cot"])
def test_dataset_score_reproduces_result_py_from_raw_outputs(prompt):
    """The dataset's scorer on the raw outputs (empty ones included: skipped as pred.py does) gives result.py's row."""
    dataset = LongBenchV2Dataset(data_dir="fixtures", prompt=prompt)
    canned = RECORDED["canned_outputs"]
    if prompt == "0shot":
        raw = canned["0shot"]
    else:  # the final text: the answer pass's, or "" when the reasoning was empty (no answer pass)
        raw = ["" if cot == "" else answer for cot, answer in zip(canned["cot"], canned["cot_answer"], strict=True)]
    scores = dataset.score(raw, dataset.samples())
    expected = RECORDED["result_py"]["compensated=False"]["zeroshot" if prompt == "0shot" else "cot"]
    names = ["score", "easy", "hard", "short", "medium", "long"]
    assert [round(scores[name], 1) for name in names] == expected
    wrong = LongBenchV2Dataset(data_dir="fixtures", prompt=prompt, empty_response="wrong").score(raw, dataset.samples())
    assert wrong["n_scored"] == 6 and wrong["score"] < scores["score"]


def test_options_are_checked_and_sampling_is_the_official_temperature():
    with pytest.raises(ValueError, match=r"task\.options\.prompt='rag' is not valid; valid: 0shot, cot, no_context"):
        build_task(task_config("longbench_v2", data_dir="fixtures", options={"prompt": "rag"}), None)
    with pytest.raises(ValueError, match=r"unknown task.options key\(s\) \['temp'\]"):
        build_task(task_config("longbench_v2", data_dir="fixtures", options={"temp": 1}), None)
    greedy = build_task(task_config("longbench_v2", data_dir="fixtures"), None)[0]
    assert greedy.sampling is None and greedy.describe()["decoding"] == "greedy"
    sampled = build_task(task_config("longbench_v2", data_dir="fixtures", options={"sampling": "official"}), None)[0]
    assert sampled.describe()["decoding"] == {"temperature": 0.1, "top_p": 1.0, "seed": 0}
    assert sampled.sampling.for_sample("a").seed != sampled.sampling.for_sample("b").seed


def test_prepared_data_is_verified_against_its_manifest(tmp_path, monkeypatch):
    from kvbench.tasks import provenance

    monkeypatch.setattr(provenance, "hub_dataset_file", lambda *args: (FIXTURES_DIR / "data.json", "abc123"))
    prepare_longbench_v2(tmp_path)
    manifest = json.loads((tmp_path / "MANIFEST.json").read_text())
    assert manifest["commit"] == "abc123" and manifest["files"]["data.json"]["lines"] == 6
    dataset = LongBenchV2Dataset(data_dir=str(tmp_path))
    assert len(dataset.samples()) == 6 and dataset.provenance()["data"]["source"] == "official"
    (tmp_path / "data.json").write_text(json.dumps(load_data_file(FIXTURES_DIR / "data.json")[:2]))
    with pytest.raises(ValueError, match=r"sha256 \w+ differs from"):
        LongBenchV2Dataset(data_dir=str(tmp_path)).samples()
    (tmp_path / "MANIFEST.json").unlink()
    (tmp_path / "data.json").write_text('[{"_id": "x"}]')
    with pytest.raises(ValueError, match=r"data.json\[0\]: field 'domain' must be a string"):
        LongBenchV2Dataset(data_dir=str(tmp_path)).samples()
    assert math.isnan(
        LongBenchV2Dataset(data_dir="fixtures").score([""], [LongBenchV2Dataset(data_dir="fixtures").samples()[0]])[
            "score"
        ]
    )
