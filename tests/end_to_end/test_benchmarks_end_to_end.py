"""Each benchmark end to end through the runner with the embedded model, on shipped fixtures / small lengths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from kvbench.app.validation import validate_run
from kvbench.config import register_configs
from kvbench.run.runner import Runner

CONF = Path(__file__).resolve().parents[2] / "conf"
# One LongBench dataset per metric family (qa_f1, rouge, classification, count, retrieval, code, zh f1, zh rouge,
# samsum's newline stop).
LONGBENCH_SUBSET = "[qasper,gov_report,trec,passage_count,passage_retrieval_en,lcc,multifieldqa_zh,dureader,samsum]"


def run(tmp_path: Path, *overrides: str) -> tuple[Path, list]:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "model=tiny-random-llama",  # byte-level tokenizer for any text (the tiny default is word-level)
                "method=snapkv",
                "budget=64L",
                f"run.output_root={tmp_path}",
                "run.progress=false",
                "run.print_table=false",
                *overrides,
            ],
        )
        results = Runner(validate_run(cfg)).run()
        folder = tmp_path / cfg.model.name / cfg.task.name / "snapkv" / "64L"
        return folder, results


def rows(folder: Path, dataset: str) -> list[dict]:
    return [json.loads(line) for line in (folder / dataset / "predictions.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("mode", ["aware", "agnostic"])
def test_longbench_fixtures_end_to_end(tmp_path: Path, mode: str) -> None:
    folder, results = run(
        tmp_path,
        "task=longbench_full",
        "task.data_dir=fixtures",
        f"task.datasets={LONGBENCH_SUBSET}",
        "task.num_samples=1",
        f"task.question_mode={mode}",
    )
    assert len(results) == 9
    for result in results:
        metrics = json.loads((folder / result.dataset / "metrics.json").read_text())
        assert 0.0 <= metrics["score"] <= 100.0
        assert metrics["question_mode"] == mode
        assert metrics["cache"]["budget_exact"]
        row = rows(folder, result.dataset)[0]
        if mode == "agnostic":
            assert row["question_tokens"] > 0, result.dataset  # the question is fed after compression
        else:
            assert row["question_tokens"] > 0 and row["cache"]["context_tokens"] == row["input_tokens"]
    lcc = json.loads((folder / "lcc" / "metrics.json").read_text())
    assert "difflib" in json.dumps(lcc["dataset_settings"])  # code-similarity backend recorded
    samsum = rows(folder, "samsum")[0]
    assert "\n" not in samsum["raw_prediction"]  # newline stop


def test_longbench_e_end_to_end(tmp_path: Path) -> None:
    folder, _results = run(
        tmp_path, "task=longbench_e", "task.data_dir=fixtures", "task.datasets=[qasper]", "task.num_samples=3"
    )
    metrics = json.loads((folder / "qasper" / "metrics.json").read_text())
    assert {"0-4k", "4-8k", "8k+"} <= set(metrics["scores"])


def test_ruler_end_to_end(tmp_path: Path) -> None:
    folder, results = run(
        tmp_path, "task=ruler", "task.length=2048", "task.num_samples=1", "task.datasets=[niah_single_1,vt,cwe,qa_1]"
    )
    assert [r.dataset for r in results] == ["niah_single_1", "vt", "cwe", "qa_1"]
    for result in results:
        row = rows(folder, result.dataset)[0]
        assert 0.6 * 2048 <= row["input_tokens"] <= 2048 + 64
        assert row["cache"]["achieved_per_layer"] == [64] * 4


def test_needlebench_end_to_end(tmp_path: Path) -> None:
    _folder, results = run(
        tmp_path,
        "task=needlebench",
        "task.lengths=[1300]",
        "task.depths=[50]",
        "task.options.repeats=1",
        "task.options.size=4k",
        "task.options.needle_counts=[2]",
        "task.datasets=[single_retrieval_en,multi_retrieval_en,multi_reasoning_en]",
    )
    assert len(results) == 3 and all(0 <= r.score <= 100 for r in results)


def test_needle_grid_end_to_end_writes_heatmap(tmp_path: Path) -> None:
    folder, results = run(tmp_path, "task=needle_grid", "task.lengths=[400,700]", "task.depths=[0,50,100]")
    assert results[0].n_samples == 6
    heatmap = folder / "needle_grid" / "heatmap.png"
    assert heatmap.exists() and heatmap.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_longbench_v2_chain_of_thought_sampled_end_to_end(tmp_path: Path) -> None:
    """LongBench v2's two passes through the runner (question-agnostic, official sampling): the row keeps the
    reasoning pass (document prompt, compressed) and the answer pass (built from the reasoning's text).  (Seeded draws
    are reproducible and batch-independent: tests/inference/test_sampling.py.)"""
    overrides = (
        "task=longbench_v2",
        "task.data_dir=fixtures",
        "task.num_samples=2",
        "task.options.prompt=cot",
        "task.options.sampling=official",
        "task.options.max_new_tokens=3",
        "task.question_mode=agnostic",
    )
    folder, _ = run(tmp_path, *overrides)
    for row in rows(folder, "longbench_v2"):
        answer_pass = row["later_passes"][0]
        assert row["new_tokens"] == 3 and answer_pass["new_tokens"] <= 3
        assert row["raw_prediction"] == answer_pass["text"] and "first_pass_text" in row
        assert row["cache"]["evicted"] and answer_pass["input_tokens"] < row["input_tokens"]
    metrics = json.loads((folder / "longbench_v2" / "metrics.json").read_text())
    assert metrics["dataset_settings"]["decoding"] == {"temperature": 0.1, "top_p": 1.0, "seed": 0}
    assert set(metrics["scores"]) >= {"score", "easy", "hard", "short", "medium", "long"}
    table = (folder / "longbench_v2" / "result.tsv").read_text().splitlines()
    assert table[0] == "Model\tOverall\tEasy\tHard\tShort\tMedium\tLong" and len(table[1].split("\t")) == 7


def test_infinitebench_fixtures_end_to_end(tmp_path: Path) -> None:
    """Two InfiniteBench tasks through the runner, question-agnostic: raw prompts (no chat template), the task's
    generation limit, scores on the official scale."""
    folder, results = run(
        tmp_path,
        "task=infinitebench",
        "task.data_dir=fixtures",
        "task.datasets=[passkey,code_debug]",
        "task.num_samples=1",
        "task.question_mode=agnostic",
    )
    assert [r.dataset for r in results] == ["passkey", "code_debug"]
    for result in results:
        metrics = json.loads((folder / result.dataset / "metrics.json").read_text())
        assert 0.0 <= metrics["score"] <= 100.0 and metrics["dataset_settings"]["template"] == "yarn-mistral"
        row = rows(folder, result.dataset)[0]
        assert row["question_tokens"] > 0 and row["new_tokens"] <= {"passkey": 6, "code_debug": 5}[result.dataset]


@pytest.mark.parametrize("mode", ["multi_turn", "multi_request"])
def test_scbench_fixtures_end_to_end_and_resume(tmp_path: Path, mode: str) -> None:
    """SCBench through the runner's compress-once-ask-many mode: one row per turn (keyed by sample and turn), every
    turn of a group carrying the same compression fingerprint, scores per turn; a run killed after some groups (the
    last group's rows and metrics.json gone) resumes to the same rows."""
    overrides = (
        "task=scbench",
        "task.data_dir=fixtures",
        "task.datasets=[scbench_kv]",
        "task.options.max_new_tokens=3",
        f"task.options.mode={mode}",
    )
    folder, _results = run(tmp_path, *overrides)
    written = rows(folder, "scbench_kv")
    assert [(r["extra"]["group"], r["extra"]["turn"]) for r in written] == [
        (f"scbench_kv-{g}", t) for g in range(2) for t in range(3)
    ]
    for group in range(2):
        fingerprints = {r["cache"]["group_fingerprint"] for r in written[3 * group : 3 * group + 3]}
        assert len(fingerprints) == 1
    metrics = json.loads((folder / "scbench_kv" / "metrics.json").read_text())
    turn_keys = {"turn_0", "turn_1", "turn_2"} if mode == "multi_turn" else {"all"}
    assert turn_keys <= set(metrics["scores"]) and metrics["dataset_settings"]["context_groups"] == mode
    # Kill after the first group and one turn of the second (as if the write had been cut): resume.
    lines = (folder / "scbench_kv" / "predictions.jsonl").read_text().splitlines(keepends=True)
    (folder / "scbench_kv" / "predictions.jsonl").write_text("".join(lines[:4]))
    (folder / "scbench_kv" / "metrics.json").unlink()
    run(tmp_path, *overrides)
    resumed = rows(folder, "scbench_kv")
    assert [r["id"] for r in resumed] == [r["id"] for r in written]
    assert [r["prediction"] for r in resumed] == [r["prediction"] for r in written]


def test_scbench_num_samples_counts_context_groups(tmp_path: Path) -> None:
    """``task.num_samples`` keeps whole groups: one example, all its turns."""
    folder, _results = run(
        tmp_path,
        "task=scbench",
        "task.data_dir=fixtures",
        "task.datasets=[scbench_qa_eng]",
        "task.num_samples=1",
        "task.options.max_new_tokens=2",
    )
    assert [r["id"] for r in rows(folder, "scbench_qa_eng")] == [f"scbench_qa_eng-0#t{t}" for t in range(3)]


def test_reasoning_sampled_decode_time_budget_end_to_end(tmp_path: Path) -> None:
    """GSM8K fixtures under H2O's decode-time eviction with a budget above the prompt: the cache grows to the budget
    during generation and is held there; two seeded draws per question, each with its own row, generated length and
    cache record; accuracy with its interval over questions."""
    _, results = run(
        tmp_path,
        "task=reasoning",
        "task.data_dir=fixtures",
        "task.datasets=[gsm8k]",
        "task.num_samples=2",  # rows: one question x two draws
        "task.options.sampling=sampled",
        "task.options.n_samples=2",
        "task.options.max_new_tokens=40",
        "method=h2o",
        "budget.spec=270L",
    )
    folder = next(tmp_path.glob("*/reasoning/h2o/270L"))
    draws = rows(folder, "gsm8k")
    assert [row["id"] for row in draws] == ["0#0", "0#1"] and results[0].dataset == "gsm8k"
    for row in draws:
        cache = row["cache"]
        assert row["input_tokens"] < 270 < row["input_tokens"] + row["new_tokens"]
        assert set(cache["decode_cap_per_layer"]) == {270} and set(cache["final_per_layer"]) == {270}
    assert draws[0]["raw_prediction"] != draws[1]["raw_prediction"]  # separately seeded draws
    metrics = json.loads((folder / "gsm8k" / "metrics.json").read_text())
    assert metrics["dataset_settings"]["decoding"] == {"temperature": 0.6, "top_p": 0.95, "seed": 0}
    assert metrics["scores"]["ci_low"] <= metrics["score"] <= metrics["scores"]["ci_high"]
