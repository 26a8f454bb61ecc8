"""The one manifest check every prepared benchmark folder goes through (kvbench.tasks.provenance)."""

from __future__ import annotations

import json

import pytest

from kvbench.tasks import provenance

HOW = "python scripts/prepare_data.py demo"


def test_manifest_round_trip_and_tampering(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"x": 1}\n{"x": 2}\n')
    provenance.write_manifest(tmp_path, {"hub_repo": "org/demo"}, {"a.jsonl": 2})
    manifest = json.loads((tmp_path / provenance.MANIFEST_FILE).read_text())
    assert manifest["hub_repo"] == "org/demo" and manifest["files"]["a.jsonl"]["lines"] == 2
    provenance.verify_prepared(tmp_path, "a.jsonl", HOW)  # intact: no error
    (tmp_path / "a.jsonl").write_text('{"x": 1}\n')
    with pytest.raises(ValueError, match=r"a\.jsonl: sha256 \w+ differs from .*MANIFEST\.json.*prepare_data\.py demo"):
        provenance.verify_prepared(tmp_path, "a.jsonl", HOW)


def test_damaged_manifest_is_an_error_and_old_layout_is_read(tmp_path):
    (tmp_path / "test.jsonl").write_text("{}\n")
    (tmp_path / provenance.MANIFEST_FILE).write_text('{"files": {"test.jsonl": ')  # truncated write
    with pytest.raises(ValueError, match=r"MANIFEST\.json: damaged \(not JSON"):
        provenance.verify_prepared(tmp_path, "test.jsonl", HOW)
    # The one-file layout written by the reasoning preparer before the shared writer: a top-level sha256.
    (tmp_path / provenance.MANIFEST_FILE).write_text(json.dumps({"source": "x", "sha256": "0" * 64, "lines": 1}))
    with pytest.raises(ValueError, match="differs from"):
        provenance.verify_prepared(tmp_path, "test.jsonl", HOW)
    sha = provenance.file_sha256(tmp_path / "test.jsonl")
    (tmp_path / provenance.MANIFEST_FILE).write_text(json.dumps({"source": "x", "sha256": sha, "lines": 1}))
    provenance.verify_prepared(tmp_path, "test.jsonl", HOW)


def test_a_file_the_manifest_omits_is_recorded_unverified_with_a_warning(tmp_path, caplog):
    """Issue #55 item 3: every data file is listed and checked, or recorded as unverified (never "official" and
    silently trusted)."""
    (tmp_path / "a.jsonl").write_text('{"x": 1}\n')
    provenance.write_manifest(tmp_path, {"hub_repo": "org/demo"}, {"a.jsonl": 1})
    (tmp_path / "b.jsonl").write_text('{"x": 2}\n')  # added by hand after the preparer ran
    assert provenance.verify_prepared(tmp_path, "a.jsonl", HOW) is True
    assert provenance.official(tmp_path / "a.jsonl")["verified"] is True
    with caplog.at_level("WARNING", logger="kvbench.tasks.provenance"):
        assert provenance.verify_prepared(tmp_path, "b.jsonl", HOW) is False
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "b.jsonl is not listed" in warning and "prepare_data.py demo" in warning
    record = provenance.official(tmp_path / "b.jsonl")
    assert record["verified"] is False and record["source"] == "official"
    (tmp_path / "a.jsonl").write_text('{"x": 3}\n')  # changed after it was verified: the new bytes are not
    assert provenance.official(tmp_path / "a.jsonl")["verified"] is False
