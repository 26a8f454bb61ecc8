"""SCBench against the official microsoft/MInference ``scbench/`` (commit fb56c91): prompts of every task in both modes,
raw and chat-templated (Llama-3.1 and Qwen2 templates), the token ids the official ``GreedySearch`` feeds, labels and
``compute_scores`` per turn / over all queries, compared with outputs of the official code recorded on the shipped
fixtures (``tests/tasks/recorded/scbench_official.json``; its ``about`` says how)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from kvbench.prompting import encode_sample
from kvbench.run.groups import context_groups, encode_group
from kvbench.tasks.base import build_task
from kvbench.tasks.scbench import (
    FIXTURES_DIR,
    VALID_OPTIONS,
    SCBenchDataset,
    load_task_file,
    prepare_scbench,
    task_names,
)
from kvbench.tasks.scbench_prompts import multi_request_prompts, multi_turn_prompts, templates
from tests.task_config import task_config

RECORDED = json.loads((Path(__file__).parent / "recorded" / "scbench_official.json").read_text(encoding="utf-8"))
FAMILIES = {"llama3": "llama3.1", "qwen2": "qwen2"}


@pytest.fixture(scope="module")
def tokenizers(real_tokenizer):
    return {family: real_tokenizer(family, template) for family, template in FAMILIES.items()}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _ids_sha(ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()


def _examples(task: str) -> list[dict]:
    return load_task_file(FIXTURES_DIR / f"{task}.jsonl")


def _dataset(task: str, tokenizer, mode: str = "multi_turn", chat: bool = True, **options) -> SCBenchDataset:
    options = {**VALID_OPTIONS, "mode": mode, "chat_template": chat, **options}
    return SCBenchDataset(
        task, data_dir="fixtures", num_samples=None, options=options, tokenizer=tokenizer, chat_template=True
    )


def test_templates_and_limits_are_the_official_ones():
    assert len(task_names()) == 12 and set(task_names()) <= set(RECORDED["max_new_tokens"])
    assert templates()["max_new_tokens"] == {task: RECORDED["max_new_tokens"][task] for task in task_names()}


@pytest.mark.parametrize("mode", ["multi_turn", "multi_request"])
def test_prompts_match_the_official_code(tokenizers, mode):
    build = multi_turn_prompts if mode == "multi_turn" else multi_request_prompts
    checked = 0
    for task in task_names():
        for family in ("raw", *FAMILIES):
            recorded = RECORDED["prompts"][f"{task}/{mode}/{family}"]
            tokenizer = tokenizers.get(family)
            for example, expected in zip(_examples(task), recorded, strict=True):
                ours = build(task, example, tokenizer, family != "raw")
                assert [_sha(p) for p in ours] == [r["sha256"] for r in expected], (task, family, example["id"])
                checked += len(ours)
    assert checked > 100


@pytest.mark.parametrize("mode", ["multi_turn", "multi_request"])
def test_samples_and_token_ids_are_what_the_official_code_feeds(tokenizers, mode):
    """The runner's group encoding (first prompt with special tokens, double BOS with a chat template that writes one;
    later prompts alone without) gives the official ids; a sample's context + question is the official text."""
    for family, tokenizer in tokenizers.items():
        for task in task_names():
            dataset = _dataset(task, tokenizer, mode)
            groups = context_groups(dataset.samples())
            recorded_ids = RECORDED["ids"][f"{task}/{mode}/{family}"]
            recorded_prompts = RECORDED["prompts"][f"{task}/{mode}/{family}"]
            for group, ids, prompts in zip(groups, recorded_ids, recorded_prompts, strict=True):

                def encode(sample, tokenizer=tokenizer, dataset=dataset):
                    return encode_sample(
                        tokenizer,
                        sample,
                        max_input_length=10**6,
                        use_chat_template=False,
                        truncation=dataset.truncation,
                        bos=dataset.bos,
                    )

                context_ids, turns = encode_group(tokenizer, group, mode, encode)
                first = context_ids + (turns[0].question_ids if mode == "multi_turn" else [])
                assert _ids_sha(first) == ids["first"], (family, task)
                later = turns[1:] if mode == "multi_turn" else turns
                assert [_ids_sha(t.question_ids) for t in later] == ids["rest"], (family, task)
                texts = [group[0].context + group[0].question] if mode == "multi_turn" else [group[0].context]
                texts += [s.question for s in (group[1:] if mode == "multi_turn" else group)]
                assert [_sha(t) for t in texts] == [r["sha256"] for r in prompts]


def test_labels_are_get_ground_truth(tokenizers):
    for task in task_names():
        samples = _dataset(task, tokenizers["llama3"]).samples()
        labels = [[s.extra["label"] for s in group] for group in context_groups(samples)]
        assert labels == RECORDED["labels"][task], task


@pytest.mark.parametrize("mode", ["multi_turn", "multi_request"])
def test_compute_scores_reproduced_on_recorded_predictions(tokenizers, mode):
    """Every recorded case: the per-turn (multi-turn) or overall (multi-request) numbers of compute_scores."""
    try:
        import tree_sitter_languages  # noqa: F401
    except ImportError:  # the official RepoQA extraction needs it (CI: the code_block fallback's test below)
        skipped = ("scbench_repoqa", "scbench_repoqa_and_kv")
    else:
        skipped = ()
    for task in [t for t in task_names() if t not in skipped]:
        dataset = _dataset(task, tokenizers["llama3"], mode, repoqa_extraction="tree_sitter")
        samples = list(dataset.samples())
        numbers = dataset.per_turn(RECORDED["predictions"][task], samples)
        official = [float(x) for x in RECORDED["scores"][f"{task}/{mode}"].split(",")]
        ours = [numbers[key] for key in sorted(numbers, key=_official_order)]
        assert ours == pytest.approx(official, abs=5e-4), task


def _official_order(key: str) -> tuple[int, int]:
    head, _, subtask = key.partition("/")
    turn = 0 if head == "all" else int(head.split("_")[1])
    return turn, 0 if subtask in ("", "scbench_summary", "scbench_repoqa") else 1


def test_repoqa_without_tree_sitter_uses_the_first_code_block(tokenizers):
    """The documented fallback: on these fixtures (one function per block) it scores as the official code."""
    dataset = _dataset("scbench_repoqa", tokenizers["llama3"], repoqa_extraction="code_block")
    numbers = dataset.per_turn(RECORDED["predictions"]["scbench_repoqa"], list(dataset.samples()))
    official = [float(x) for x in RECORDED["scores"]["scbench_repoqa/multi_turn"].split(",")]
    assert [numbers[f"turn_{t}"] for t in range(3)] == pytest.approx(official, abs=5e-4)
    assert dataset.describe()["repoqa_extraction"] == "code_block"


def test_mixed_tasks_give_per_turn_limits_and_headline(tokenizers):
    dataset = _dataset("scbench_summary_with_needles", tokenizers["llama3"])
    samples = list(dataset.samples())
    assert [s.extra["max_new_tokens"] for s in samples[:2]] == [800, 15]
    scores = dataset.score(RECORDED["predictions"]["scbench_summary_with_needles"], samples)
    # headline: turn 0's summary and turn 1's passkey (the sub-tasks the turns have), not the official zeros.
    assert scores["score"] == pytest.approx((scores["turn_0/scbench_summary"] + scores["turn_1/scbench_passkey"]) / 2)


def test_build_from_config_and_bad_options(tokenizers):
    cfg = task_config("scbench", data_dir="fixtures", datasets=["scbench_kv"], num_samples=1)
    (dataset,) = build_task(cfg, tokenizers["llama3"], chat_template=True)
    samples = dataset.samples()
    assert [s.id for s in samples] == ["scbench_kv-0#t0", "scbench_kv-0#t1", "scbench_kv-0#t2"]
    assert dataset.context_groups == "multi_turn" and dataset.describe()["mode"] == "multi_turn"
    bad = task_config("scbench", data_dir="fixtures", options={"mode": "both"})
    with pytest.raises(ValueError, match="multi_request"):
        build_task(bad, tokenizers["llama3"])
    with pytest.raises(ValueError, match="max_turns"):
        build_task(task_config("scbench", options={"max_turns": 0}), tokenizers["llama3"])


def test_preparer_writes_files_and_manifest(tmp_path):
    """Parse-tested offline: the preparer fed the fixtures' rows (a stand-in for load_dataset) writes files that load
    and verify; a corrupted file then fails its checksum."""
    prepare_scbench(tmp_path, loader=_examples)
    manifest = json.loads((tmp_path / "MANIFEST.json").read_text(encoding="utf-8"))
    assert sorted(manifest["files"]) == sorted(f"{t}.jsonl" for t in task_names())
    dataset = SCBenchDataset(
        "scbench_kv",
        data_dir=str(tmp_path),
        num_samples=None,
        options={**VALID_OPTIONS, "chat_template": False},
        tokenizer=None,
        chat_template=False,
    )
    assert len(dataset.samples()) == 6
    with (tmp_path / "scbench_kv.jsonl").open("a", encoding="utf-8") as handle:
        handle.write("\n")
    with pytest.raises(ValueError, match="sha256"):
        SCBenchDataset(
            "scbench_kv",
            data_dir=str(tmp_path),
            num_samples=None,
            options=VALID_OPTIONS,
            tokenizer=None,
            chat_template=False,
        ).samples()
