"""Damaged run-folder files are detected, never trusted: truncated, corrupted, deleted or replaced files are either
repaired by recomputing exactly what is missing (byte-identical to an undamaged run) or refused with one message
naming the file and the fix (issue #42, item 1)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from kvbench.storage.reader import SCHEMA_VERSION, DamagedFile, read_metrics, read_prediction_rows, read_run_meta
from tests.faults.conftest import DATASET, RUN, assert_one_line_error, comparable_metrics, run_job_status


def files(root: Path) -> tuple[Path, Path, Path]:
    folder = root / RUN
    return folder / DATASET / "predictions.jsonl", folder / DATASET / "metrics.json", folder / "run_meta.json"


def test_written_files_carry_the_schema_version(finished_run: Path) -> None:
    _, metrics, meta = files(finished_run)
    assert json.loads(metrics.read_text())["schema_version"] == SCHEMA_VERSION
    assert json.loads(meta.read_text())["schema_version"] == SCHEMA_VERSION


def test_unversioned_files_are_read_as_version_1_and_upgraded(damaged_root: Path) -> None:
    _, metrics, meta = files(damaged_root)
    for path, reader in ((metrics, read_metrics), (meta, read_run_meta)):
        payload = json.loads(path.read_text())
        del payload["schema_version"]
        path.write_text(json.dumps(payload))
        assert reader(path) == {"schema_version": SCHEMA_VERSION, **payload}


def test_newer_schema_version_is_refused_not_overwritten(damaged_root: Path, capsys) -> None:
    _, metrics, _ = files(damaged_root)
    payload = json.loads(metrics.read_text())
    payload["schema_version"] = SCHEMA_VERSION + 1
    metrics.write_text(json.dumps(payload))
    before = metrics.read_bytes()
    code, err = run_job_status(damaged_root, capsys)
    assert_one_line_error(code, err, str(metrics), "newer", "upgrade kvbench")
    assert metrics.read_bytes() == before


@pytest.mark.parametrize("lose", ["last_line", "torn_last_line", "file"])
def test_lost_predictions_are_regenerated_byte_for_byte(
    finished_run: Path, damaged_root: Path, capsys, caplog, lose: str
) -> None:
    """A finished dataset whose predictions.jsonl lost rows is not reported as cached: exactly the missing samples
    are regenerated and metrics.json is rewritten, identical to the undamaged run's."""
    predictions, metrics, _ = files(damaged_root)
    clean_predictions, clean_metrics, _ = files(finished_run)
    lines = predictions.read_bytes().splitlines(keepends=True)
    assert len(lines) == 2
    if lose == "last_line":
        predictions.write_bytes(lines[0])
    elif lose == "torn_last_line":
        predictions.write_bytes(lines[0] + lines[1][:40])
    else:
        predictions.unlink()
    with caplog.at_level(logging.WARNING):
        code, err = run_job_status(damaged_root, capsys)
    assert code == 0, err[-2000:]
    assert "regenerating" in caplog.text and str(predictions) in caplog.text
    assert predictions.read_bytes() == clean_predictions.read_bytes()
    assert comparable_metrics(metrics) == comparable_metrics(clean_metrics)


@pytest.mark.parametrize(
    "garbage", [b"", b"{not json", b"[1, 2]", b'{"metric": "x"}', b"\xff\xfe garbage", b'{"metric": 1, "score": 2}']
)
def test_damaged_metrics_is_recomputed_from_predictions(
    finished_run: Path, damaged_root: Path, capsys, caplog, garbage: bytes
) -> None:
    predictions, metrics, _ = files(damaged_root)
    metrics.write_bytes(garbage)
    with caplog.at_level(logging.WARNING):
        code, err = run_job_status(damaged_root, capsys)
    assert code == 0, err[-2000:]
    assert f"{metrics} is damaged" in caplog.text
    _, clean_metrics, _ = files(finished_run)
    assert comparable_metrics(metrics) == comparable_metrics(clean_metrics)
    assert predictions.read_bytes() == files(finished_run)[0].read_bytes()


def test_damaged_run_meta_is_rewritten_when_config_yaml_is_this_runs(damaged_root: Path, capsys, caplog) -> None:
    _, metrics, meta = files(damaged_root)
    meta.write_text("{garbage")
    before = metrics.read_bytes()
    with caplog.at_level(logging.WARNING):
        code, err = run_job_status(damaged_root, capsys)
    assert code == 0, err[-2000:]
    assert f"{meta} is damaged" in caplog.text
    assert read_run_meta(meta)["status"] == "complete"
    assert metrics.read_bytes() == before  # the dataset stayed cached


def test_damaged_run_meta_without_config_is_refused_naming_the_file(damaged_root: Path, capsys) -> None:
    _, _, meta = files(damaged_root)
    meta.write_text("{garbage")
    (meta.parent / "config.yaml").write_text(":\n  - [unbalanced")
    code, err = run_job_status(damaged_root, capsys)
    assert_one_line_error(code, err, str(meta), "not valid JSON", "rm -r")


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda lines: [lines[0], b"{corrupt\n"], "line 2 is not a JSON row"),
        (lambda lines: [lines[0], lines[0]], "line 2 repeats sample id"),
        (lambda lines: [b'"just a string"\n', lines[1]], "line 1 is not a prediction row"),
    ],
)
def test_corrupt_prediction_rows_are_refused_with_the_fix(damaged_root: Path, capsys, damage, why: str) -> None:
    predictions, metrics, _ = files(damaged_root)
    predictions.write_bytes(b"".join(damage(predictions.read_bytes().splitlines(keepends=True))))
    metrics.unlink()  # the run resumes from predictions.jsonl
    before = predictions.read_bytes()
    code, err = run_job_status(damaged_root, capsys)
    assert_one_line_error(code, err, str(predictions), why, "sed -i")
    assert predictions.read_bytes() == before


def test_prediction_reader_cuts_only_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "predictions.jsonl"
    path.write_text('{"id": "a", "prediction": "x"}\n{"id": "b", "pre')
    assert [row["id"] for row in read_prediction_rows(path)] == ["a"]
    assert path.read_text() == '{"id": "a", "prediction": "x"}\n'
    path.write_text('{"id": "a", "prediction": "x"}\n{"id": 3, "prediction": "y"}\n')
    with pytest.raises(DamagedFile, match="line 2"):
        read_prediction_rows(path)


def test_damaged_sample_cache_is_regenerated(tmp_path: Path, tokenizer, caplog) -> None:
    """A stored sample file with a partial last line (or garbage) is regenerated, never half-read."""
    from kvbench.sample import Sample
    from kvbench.storage.sample_cache import SampleCache, cached_samples

    cache = SampleCache(tmp_path)
    made = [Sample(id=str(i), context=f"context {i}", question="q?", answers=["a"]) for i in range(3)]
    calls = []

    def generate(count: int) -> list[Sample]:
        calls.append(count)
        return made[:count]

    assert cached_samples(cache, "b", "d", lambda: {"k": 1}, 3, generate) == made
    path = cache.path("b", "d", {"k": 1})
    assert cached_samples(cache, "b", "d", lambda: {"k": 1}, 3, generate) == made and calls == [3]
    intact = path.read_bytes()
    for damage in (intact[:-5], intact[: intact.index(b"\n") + 3], b"\x00garbage", intact.replace(b'"q?"', b"q?")):
        path.write_bytes(damage)
        with caplog.at_level(logging.WARNING):
            assert cached_samples(cache, "b", "d", lambda: {"k": 1}, 3, generate) == made
        assert path.read_bytes() == intact and str(path) in caplog.text
        caplog.clear()
    assert len(calls) == 5


def test_damaged_timings_are_skipped_not_trusted(tmp_path: Path) -> None:
    """``timings.jsonl`` is best effort (timings are not results): damaged rows are skipped, never a traceback."""
    from kvbench.storage.writers import TimingLog

    path = tmp_path / "timings.jsonl"
    path.write_bytes(b'[1]\n{"id": "a", "prefill_s": 1, "decode_s": 2}\n"x"\n{"id": "b"}\n\xff\xfe\n{"id": "c", "pre')
    assert TimingLog(path).summary() == {"n": 1, "prefill_s_mean": 1.0, "decode_s_mean": 2.0, "total_s": 3}
