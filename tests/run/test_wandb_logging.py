"""W&B logging: offline mode writes the run (group, name, per-dataset table, summary) with no network or API key."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
FAST = ["model=tiny", "task=tiny_niah", "task.lengths=[1024]", "task.num_samples=2", "run.progress=false"]
DATASETS = ["niah_single_1k", "niah_multikey_1k", "niah_multivalue_1k"]


def read_wandb_records(path: Path) -> list[Any]:
    """Decode a ``run-<id>.wandb`` file: a 7-byte header, then 32 KiB blocks of chunks, each with a 7-byte header
    (crc32, little-endian length, chunk type: 1 full, 2 first, 3 middle, 4 last) holding protobuf ``Record``s."""
    from wandb.proto import wandb_internal_pb2

    raw = path.read_bytes()
    assert raw[:4] == b":W&B", "not a W&B transaction log"
    block, pos, pending, records = 32768, 7, b"", []
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # too little room left for a chunk header: the rest of the block is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        pending += raw[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def run_cli(args: list[str], env_extra: dict[str, str], home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(
        {
            "OMP_NUM_THREADS": "1",
            "HF_HUB_OFFLINE": "1",
            "HOME": str(home),  # no ~/.netrc or W&B settings from the machine
            "WANDB_BASE_URL": "http://127.0.0.1:9",  # a closed port: any network attempt would fail
            **env_extra,
        }
    )
    return subprocess.run(
        [sys.executable, "run.py", *args], cwd=REPO, capture_output=True, text=True, timeout=600, env=env
    )


def test_offline_mode_logs_group_name_table_and_summary(tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    root = tmp_path / "runs"
    result = run_cli([*FAST, f"run.output_root={root}", "run.experiment=table_x"], {"WANDB_MODE": "offline"}, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    folder = root / "tiny" / "tiny_niah" / "snapkv" / "64L"
    metrics = {name: json.loads((folder / name / "metrics.json").read_text()) for name in DATASETS}

    offline = sorted((folder / "wandb").glob("offline-run-*"))
    assert len(offline) == 1, offline
    run_file = next(offline[0].glob("run-*.wandb"))
    records = read_wandb_records(run_file)
    kinds = [r.WhichOneof("record_type") for r in records]
    assert "exit" in kinds, "the run was not finished"

    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert run.run_group == "table_x"
    assert run.display_name == "tiny-snapkv-64L-tiny_niah"
    assert run.job_type == "tiny_niah"
    assert run.project == "kvbench"
    assert list(run.tags) == ["tiny", "snapkv", "64L"]
    assert run.run_id == json.loads((folder / "run_meta.json").read_text())["config_hash"]

    summary: dict[str, Any] = {}
    for record in records:
        if record.WhichOneof("record_type") == "summary":
            for item in record.summary.update:
                if item.key:
                    summary[item.key] = json.loads(item.value_json)
    scores = [metrics[name]["score"] for name in DATASETS]
    for name in DATASETS:
        assert summary[f"tiny_niah/{name}"] == pytest.approx(metrics[name]["score"])
    assert summary["tiny_niah/avg"] == pytest.approx(sum(scores) / 3)
    assert summary["avg"] == pytest.approx(sum(scores) / 3)
    assert summary["n_datasets"] == 3
    kept = [metrics[name]["cache"]["mean_kept_fraction"] for name in DATASETS]
    assert summary["kept_fraction"] == pytest.approx(sum(kept) / 3)

    # What the report's panels read (issue #35): config panel.*, intervals and averages in the summary, one history
    # row with the numeric axes and the scores, and a needle heatmap image per dataset.
    config: dict[str, Any] = {}
    history: dict[tuple[str, ...], Any] = {}
    bands: dict[str, list[float]] = {}  # every value of a band series, in the order of the history rows
    for record in records:
        if record.WhichOneof("record_type") == "config":
            config.update({item.key: json.loads(item.value_json) for item in record.config.update if item.key})
        if record.WhichOneof("record_type") == "history":
            history.update({tuple(item.nested_key): json.loads(item.value_json) for item in record.history.item})
            for item in record.history.item:
                if item.nested_key and item.nested_key[0].endswith("/interval"):
                    bands.setdefault(item.nested_key[0], []).append(json.loads(item.value_json))
    run_summary = json.loads((folder / "summary.json").read_text())
    panel = config["panel"]
    assert {k: panel[k] for k in ("method", "family", "model", "task", "question_mode", "experiment", "budget")} == {
        "method": "snapkv",
        "family": "snapkv",
        "model": "tiny",
        "task": "tiny_niah",
        "question_mode": "aware",
        "experiment": "table_x",
        "budget": "64L",
    }
    assert panel["budget_tokens_per_layer"] == 64.0
    assert panel["kept_fraction"] == pytest.approx(sum(kept) / 3)
    assert panel["group"] == "snapkv · aware" and panel["tag"] == ""  # one line per method and question mode
    assert panel["stored_fraction"] > panel["kept_fraction"]  # SnapKV stores a cache per query head
    predictions = [json.loads(line) for name in DATASETS for line in (folder / name / "predictions.jsonl").open()]
    context = {name: [] for name in DATASETS}
    for row in predictions:
        context[row["id"].rsplit("-", 1)[0]].append(row["input_tokens"])
    mean_context = sum(sum(v) / len(v) for v in context.values()) / 3
    assert panel["context_length"] == pytest.approx(mean_context)
    for row in run_summary["datasets"]:
        low, high = row["ci95"]
        assert summary[f"tiny_niah/{row['dataset']}/ci95_low"] == pytest.approx(low)
        assert summary[f"tiny_niah/{row['dataset']}/ci95_high"] == pytest.approx(high)
    mean = run_summary["averages"]["mean"]
    assert summary["tiny_niah/avg/mean"] == pytest.approx(mean["score"])
    assert [summary["tiny_niah/avg/mean/ci95_low"], summary["tiny_niah/avg/mean/ci95_high"]] == pytest.approx(
        mean["ci95"]
    )
    assert history[("budget_tokens_per_layer",)] == 64
    assert history[("kept_fraction",)] == pytest.approx(sum(kept) / 3)
    for row in run_summary["datasets"]:  # the intervals in the history row too: the panels draw them
        assert history[(f"tiny_niah/{row['dataset']}/ci95_low",)] == pytest.approx(row["ci95"][0])
        # The report's band: three rows at the run's budget, the low end, the score, the high end.
        low, high = row["ci95"]
        assert bands[f"tiny_niah/{row['dataset']}/interval"] == pytest.approx([low, row["score"], high])
    assert bands["tiny_niah/avg/mean/interval"] == pytest.approx([mean["ci95"][0], mean["score"], mean["ci95"][1]])
    for name in DATASETS:
        assert history[(f"tiny_niah/{name}",)] == pytest.approx(metrics[name]["score"])
        assert history[(f"needle/{name}", "_type")] == "image-file"
        assert (offline[0] / "files" / history[(f"needle/{name}", "path")]).stat().st_size > 1000

    # The per-dataset table: logged in history and stored as a table file, one row per dataset.
    logged = [
        item
        for record in records
        if record.WhichOneof("record_type") == "history"
        for item in record.history.item
        if list(item.nested_key) == ["scores", "path"]
    ]
    assert len(logged) == 1
    table = json.loads((offline[0] / "files" / json.loads(logged[0].value_json)).read_text())
    assert table["columns"] == [
        "model",
        "method",
        "budget",
        "task",
        "dataset",
        "metric",
        "score",
        "n_samples",
        "kept_fraction",
    ]
    rows = {row[4]: row for row in table["data"]}
    assert sorted(rows) == sorted(DATASETS)
    for name in DATASETS:
        assert rows[name][:4] == ["tiny", "snapkv", "64L", "tiny_niah"]
        assert rows[name][5:] == [
            metrics[name]["metric"],
            pytest.approx(metrics[name]["score"]),
            2,
            pytest.approx(metrics[name]["cache"]["mean_kept_fraction"]),
        ]


def test_disabled_mode_writes_nothing_for_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``WANDB_MODE=disabled`` in the environment run.py composes its config in (``wandb.mode`` reads it), the job run
    in process as run.py runs it (:func:`kvbench.app.cli.run_job`; the offline test above goes through run.py itself):
    nothing W&B-related in the run folder or under the (temporary) home folder."""
    import kvbench
    from kvbench.app.cli import run_job

    for key in [key for key in os.environ if key.startswith("WANDB_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc or W&B settings from the machine
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # a closed port: any network attempt would fail
    monkeypatch.setenv("WANDB_MODE", "disabled")
    root = tmp_path / "runs"
    overrides = [*FAST[2:], "task.datasets=[niah_single_1k]", f"run.output_root={root}", "run.print_table=false"]
    cfg = kvbench.compose_config(model="tiny", task="tiny_niah", overrides=overrides)
    assert cfg.wandb.mode == "disabled"
    run_job(cfg)
    folder = root / "tiny" / "tiny_niah" / "snapkv" / "64L"
    assert (folder / "niah_single_1k" / "metrics.json").exists()
    assert not (folder / "wandb").exists()
    assert not list(tmp_path.rglob("offline-run-*"))


def test_summary_values_and_run_name() -> None:
    from omegaconf import OmegaConf

    from kvbench.run.runner import DatasetResult
    from kvbench.run.wandb_logging import run_name, summary_values

    results = [
        DatasetResult("a", "f1", 40.0, 10, 0.2, skipped=False),
        DatasetResult("b", "rouge", 20.0, 10, 0.4, skipped=True),
    ]
    values = summary_values("longbench", results)
    assert values == {
        "longbench/a": 40.0,
        "longbench/b": 20.0,
        "n_datasets": 2,
        "longbench/avg": 30.0,
        "avg": 30.0,
        "kept_fraction": pytest.approx(0.3),
    }
    assert summary_values("longbench", []) == {"n_datasets": 0}
    cfg = OmegaConf.create(
        {"model": {"name": "m"}, "method": {"name": "snapkv"}, "budget": {"name": "128L"}, "task": {"name": "t"}}
    )
    cfg.run = {"tag": None}
    assert run_name(cfg) == "m-snapkv-128L-t"
    cfg.run.tag = "v2"
    assert run_name(cfg) == "m-snapkv-128L-t~v2"
