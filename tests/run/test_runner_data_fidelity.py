"""Runner-level data fidelity: provenance in every metrics.json, stand-in warnings, no truncation where the official
harness has none, the sample cache across method runs, and the per-sample prompt hash on resume.  Cost: about 20 s."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from kvbench.app.validation import validate_run
from kvbench.config import register_configs
from kvbench.errors import KVBenchError
from kvbench.run.runner import Runner

CONF = Path(__file__).resolve().parents[2] / "conf"


def run(tmp_path: Path, *overrides: str, method: str = "snapkv"):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "model=tiny-random-llama",
                f"method={method}",
                "budget=64L",
                f"run.output_root={tmp_path / 'runs'}",
                f"run.sample_cache={tmp_path / 'samples'}",
                "run.progress=false",
                "run.print_table=false",
                *overrides,
            ],
        )
        runner = Runner(validate_run(cfg))
        return runner.folder, runner.run()


def metrics(folder: Path, dataset: str) -> dict:
    return json.loads((folder / dataset / "metrics.json").read_text())


# Two generated tokens per sample keep the runs cheap (sizing then reserves 2 tokens for the answer).
RULER = ("task=ruler", "task.length=1024", "task.num_samples=2", "task.options.max_new_tokens=2",
         "task.datasets=[niah_single_2,qa_1]")  # fmt: skip


def test_provenance_is_recorded_and_stand_ins_are_warned_about(tmp_path, caplog, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./data/ruler here
    with caplog.at_level(logging.WARNING, logger="kvbench.run.runner"):
        folder, _ = run(tmp_path, *RULER)
    essays = metrics(folder, "niah_single_2")["data_provenance"]["essays"]
    assert (
        essays["source"] == "stand-in" and essays["missing"] == "PaulGrahamEssays.json" and len(essays["sha256"]) == 64
    )
    squad = metrics(folder, "qa_1")["data_provenance"]["squad"]
    assert squad["source"] == "stand-in" and squad["missing"] == "dev-v2.0.json"
    warned = "\n".join(r.getMessage() for r in caplog.records)
    assert "niah_single_2: input 'essays' is a shipped stand-in" in warned and "PaulGrahamEssays.json" in warned
    assert "qa_1: input 'squad'" in warned and "prepare_data.py ruler" in warned

    longbench = ("task=longbench", "task.data_dir=fixtures", "task.datasets=[qasper]", "task.num_samples=1")
    folder, _ = run(tmp_path, *longbench, "task.options.max_new_tokens=2")
    assert metrics(folder, "qasper")["data_provenance"]["data"]["source"] == "stand-in"
    assert metrics(folder, "qasper")["dataset_settings"]["max_new_tokens"] == 2  # the cap is recorded


def test_official_files_are_recorded_with_their_hash(tmp_path):
    data = tmp_path / "ruler_data"
    data.mkdir()
    essay = {"text": " ".join(f"Sentence {i} is about the harbour." for i in range(600))}
    (data / "PaulGrahamEssays.json").write_text(json.dumps(essay))
    (data / "PaulGrahamEssays_URLs.txt").write_text("http://www.paulgraham.com/x.html\n")  # RULER's folder has it
    folder, _ = run(tmp_path, *RULER[:4], "task.datasets=[niah_single_2]", f"task.data_dir={data}")
    record = metrics(folder, "niah_single_2")["data_provenance"]["essays"]
    assert record["source"] == "official" and record["path"] == str(data / "PaulGrahamEssays.json")
    rows = [json.loads(x) for x in (folder / "niah_single_2" / "predictions.jsonl").read_text().splitlines()]
    assert all(len(row["prompt_sha256"]) == 64 for row in rows)


def test_ruler_prompt_longer_than_the_model_is_an_error_not_a_cut(tmp_path):
    with pytest.raises(KVBenchError, match=r"sample 'niah_single_1_2048_0': the prompt has \d+ tokens, more than "):
        run(tmp_path, "task=ruler", "task.length=2048", "task.num_samples=1", "task.datasets=[niah_single_1]",
            "model.max_input_length=1024")  # fmt: skip


def test_methods_share_the_generated_samples(tmp_path):
    run(tmp_path, *RULER)
    files = sorted((tmp_path / "samples" / "ruler").glob("*.jsonl"))
    stamps = [f.stat().st_mtime_ns for f in files]
    folder, _ = run(tmp_path, *RULER, method="streamingllm")
    assert sorted((tmp_path / "samples" / "ruler").glob("*.jsonl")) == files
    assert [f.stat().st_mtime_ns for f in files] == stamps  # read, not rewritten
    assert metrics(folder, "qa_1")["n_samples"] == 2


def test_resume_refuses_predictions_made_from_other_prompts(tmp_path):
    folder, _ = run(tmp_path, *RULER)
    predictions = folder / "qa_1" / "predictions.jsonl"
    rows = [json.loads(x) for x in predictions.read_text().splitlines()]
    rows[1]["prompt_sha256"] = "0" * 64  # as if the sample had been generated differently
    predictions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "qa_1" / "metrics.json").unlink()
    before = predictions.read_bytes()
    with pytest.raises(KVBenchError, match=r"different prompts for 1 sample\(s\) \(\['qa_1_1024_1'\]"):
        run(tmp_path, *RULER)
    assert predictions.read_bytes() == before  # nothing lost or changed
    del rows[1]["prompt_sha256"]  # rows written before hashes existed are accepted by id
    predictions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run(tmp_path, *RULER)
    assert metrics(folder, "qa_1")["n_samples"] == 2
