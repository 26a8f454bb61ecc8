"""A result is what it says it is (issue #55 items 1-2): a resume whose data, method files or method source changed
under the same config is refused, with what changed and the two ways on (recompute; or keep the rows, recorded as
predating the change); a ``metrics.json`` is checked against its rows and rewritten from them when it disagrees;
rows of another configuration are never adopted.  Every refused or repaired resume leaves the predictions byte for
byte as they were."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import kvbench.run.fingerprints as fingerprints
from kvbench.resources import shipped_root
from kvbench.run.fingerprints import changes, method_files
from tests.faults.conftest import DATASET, RUN, assert_one_line_error, comparable_metrics, run_job_status

#: A file-based data set: LongBench's qasper from a copy of the shipped fixtures, one sample, two new tokens.
LONGBENCH = ("task=longbench", "task.datasets=[qasper]", "task.num_samples=1", "task.options.max_new_tokens=2")


def test_a_data_set_re_prepared_in_place_is_never_served_cached(tmp_path: Path, capsys) -> None:
    data = tmp_path / "longbench"
    shutil.copytree(shipped_root() / "tasks" / "longbench" / "fixtures", data)
    args = (*LONGBENCH, f"task.data_dir={data}")
    code, stderr = run_job_status(tmp_path / "runs", capsys, *args)
    assert code == 0, stderr[-2000:]
    (folder,) = (tmp_path / "runs").glob("*/longbench/*/*")
    predictions = folder / "qasper" / "predictions.jsonl"
    before = predictions.read_bytes()
    rows = (data / "qasper.jsonl").read_text().splitlines()
    later = json.loads(rows[-1])
    later["input"] = (
        "A question prepared again. " + later["input"]
    )  # a later sample: the first one's prompt is unchanged
    (data / "qasper.jsonl").write_text("\n".join([*rows[:-1], json.dumps(later)]) + "\n")

    code, stderr = run_job_status(tmp_path / "runs", capsys, *args)
    assert_one_line_error(code, stderr, "data input", "qasper", "run.changed_inputs=recompute", "changed_inputs=keep")
    assert predictions.read_bytes() == before

    code, stderr = run_job_status(tmp_path / "runs", capsys, *args, "run.changed_inputs=keep")
    assert code == 0, stderr[-2000:]
    stale = json.loads((folder / "run_meta.json").read_text())["stale_rows"]["qasper"]
    assert len(stale) == 1 and any(line.startswith("data input") for line in stale[0]["changed"])
    assert predictions.read_bytes() == before
    code, stderr = run_job_status(tmp_path / "runs", capsys, *args)  # kept once: not refused again
    assert code == 0, stderr[-2000:]


def test_an_edited_method_source_is_never_served_cached(damaged_root: Path, capsys, monkeypatch) -> None:
    """As if the method's own module (SnapKV's: kvbench/methods/snapkv.py) had been edited: the bytes its
    digest reads differ."""
    predictions = damaged_root / RUN / DATASET / "predictions.jsonl"
    before = predictions.read_bytes()
    recorded = json.loads((damaged_root / RUN / "run_meta.json").read_text())["inputs"][DATASET]["details"]
    edited = [name for name in recorded["method_source"] if name.endswith(".py")]
    assert edited, recorded["method_source"]
    real = fingerprints.file_sha256
    monkeypatch.setattr(fingerprints, "file_sha256", lambda p: "0" * 64 if str(p).endswith(edited[0]) else real(p))

    code, stderr = run_job_status(damaged_root, capsys)
    assert_one_line_error(code, stderr, f"method source {edited[0]}", "run.changed_inputs=recompute")
    assert "(cached)" not in stderr
    assert predictions.read_bytes() == before

    code, stderr = run_job_status(damaged_root, capsys, "run.changed_inputs=recompute")
    assert code == 0, stderr[-2000:]
    (aside,) = predictions.parent.glob("predictions.jsonl.stale-*")  # the old rows: set aside, not deleted
    assert aside.read_bytes() == before and len(list(predictions.parent.glob("metrics.json.stale-*"))) == 1
    meta = json.loads((damaged_root / RUN / "run_meta.json").read_text())
    rows = [json.loads(line) for line in predictions.read_text().splitlines()]
    assert len(rows) == 2 and {row["inputs"] for row in rows} == {meta["inputs"][DATASET]["digest"]}
    assert "recomputed_rows" in meta and "stale_rows" not in meta


def test_a_method_file_replaced_in_place_changes_its_fingerprint(tmp_path: Path) -> None:
    pattern = tmp_path / "pattern"
    pattern.mkdir()
    (pattern / "full_attention_heads.tsv").write_text("0.5\t0.5\n")
    (tmp_path / "stats.safetensors").write_bytes(b"first")
    params = {"pattern": str(pattern), "stats": str(tmp_path / "stats.safetensors"), "gamma": 2.0, "pooling": "max"}
    first = method_files(params)
    assert set(first) == {"method.params.pattern", "method.params.stats"}
    (tmp_path / "stats.safetensors").write_bytes(b"second")
    (pattern / "full_attention_heads.tsv").write_text("0.5\t0.25\n")
    second = method_files(params)
    inputs = fingerprints.Inputs(data={}, method_files=second, method_source={})
    said = changes({"data": {}, "method_files": first, "method_source": {}}, inputs)
    assert [line.split(":")[0] for line in said] == [
        "method file method.params.pattern",
        "method file method.params.stats",
    ]


def test_an_edited_metrics_score_is_rewritten_from_the_rows(
    finished_run: Path, damaged_root: Path, capsys, caplog
) -> None:
    metrics = damaged_root / RUN / DATASET / "metrics.json"
    payload = json.loads(metrics.read_text())
    payload["score"] = 99.0
    metrics.write_text(json.dumps(payload))
    code, stderr = run_job_status(damaged_root, capsys)
    assert code == 0, stderr[-2000:]
    (warning,) = [r.getMessage() for r in caplog.records if "disagrees with its predictions.jsonl" in r.getMessage()]
    assert "score 99.0 != 100.0" in warning and "rewriting it from the rows" in warning
    assert comparable_metrics(metrics) == comparable_metrics(finished_run / RUN / DATASET / "metrics.json")
    predictions = RUN / DATASET / "predictions.jsonl"
    assert (damaged_root / predictions).read_bytes() == (finished_run / predictions).read_bytes()


def test_a_folder_holding_another_methods_rows_is_refused(finished_run: Path, tmp_path: Path, capsys) -> None:
    other = tmp_path / "runs" / RUN.parent.parent / "streamingllm" / RUN.name / DATASET
    other.mkdir(parents=True)
    shutil.copy(finished_run / RUN / DATASET / "predictions.jsonl", other / "predictions.jsonl")
    before = (other / "predictions.jsonl").read_bytes()
    code, stderr = run_job_status(tmp_path / "runs", capsys, "method=streamingllm")
    assert_one_line_error(code, stderr, "another configuration", "run.tag")
    assert (other / "predictions.jsonl").read_bytes() == before


@pytest.mark.parametrize("field", ["config_hash", "inputs", "code"])
def test_every_row_records_what_it_was_computed_from(finished_run: Path, field: str) -> None:
    rows = [json.loads(line) for line in (finished_run / RUN / DATASET / "predictions.jsonl").read_text().splitlines()]
    meta = json.loads((finished_run / RUN / "run_meta.json").read_text())
    expected = {
        "config_hash": meta["config_hash"],
        "inputs": meta["inputs"][DATASET]["digest"],
        "code": meta["kvbench_source"],
    }[field]
    assert [row[field] for row in rows] == [expected] * len(rows)


def test_a_plugins_source_is_every_module_of_its_package(tmp_path: Path, monkeypatch) -> None:
    """An editable plug-in keeps its version while its code changes: its fingerprint covers its package's files."""
    import importlib

    package = tmp_path / "kvb_plugin_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "scoring.py").write_text("def helper():\n    return 1\n")
    (package / "method.py").write_text("from kvb_plugin_pkg.scoring import helper\n\nclass Mine:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mine = importlib.import_module("kvb_plugin_pkg.method").Mine
    before = {path.name: fingerprints.file_sha256(path) for path in fingerprints._module_files(mine)}
    assert set(before) == {"__init__.py", "scoring.py", "method.py"}
    (package / "scoring.py").write_text("def helper():\n    return 2\n")  # the score's helper edited in place
    after = {path.name: fingerprints.file_sha256(path) for path in fingerprints._module_files(mine)}
    assert after["scoring.py"] != before["scoring.py"] and after["method.py"] == before["method.py"]


def test_an_unknown_changed_inputs_choice_is_refused(tmp_path: Path, capsys) -> None:
    code, stderr = run_job_status(tmp_path / "runs", capsys, "run.changed_inputs=maybe")
    assert_one_line_error(code, stderr, "run.changed_inputs='maybe' is not valid", "refuse, recompute, keep")


def test_a_shared_piece_is_fingerprinted_by_its_class_alone() -> None:
    """Editing shared machinery around a method (a move, another class in the same module) refuses no resume; the
    method's own module and each piece's class source are what count."""
    from kvbench.eviction.base import build_method

    record = fingerprints.method_source("snapkv", build_method({"name": "snapkv", "family": "snapkv"}))
    files = [name for name in record if name.endswith(".py")]
    assert files == ["kvbench/methods/snapkv.py"]  # SnapKV's class is its scorer
    assert "UniformLayerAllocator (class)" in record and "UniformHeadAllocator (class)" in record
    assert method_files({"pooling": "max", "gqa_agg": "mean", "dot": "."}) == {}  # bare words and "." name no file
