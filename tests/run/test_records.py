"""The memory fields a run writes (issue #40): per dataset, the mean and peak of the stored bytes (the kept tokens'
keys and values, one meaning on every backend) and of the allocated bytes, and the stored-vs-full fraction; the one
accessor the reporting reads them through, which falls back to the field older runs wrote.  Pure Python."""

from __future__ import annotations

import math

from kvbench.reporting.aggregate import metrics_to_row
from kvbench.run.records import cache_summary
from kvbench.views.run_views import mean_stored_bytes


def _row(stored: int, allocated: int, peak_stored: int, peak_allocated: int, full: int) -> dict:
    cache = {
        "requested_per_layer": [4, 4],
        "achieved_per_layer": [4, 4],
        "requested_per_head": [[4], [4]],
        "achieved_per_head": [[4], [4]],
        "context_tokens": 16,
        "evicted": True,
        "stored_bytes": stored,
        "allocated_bytes": allocated,
        "peak_stored_bytes": peak_stored,
        "peak_allocated_bytes": peak_allocated,
        "full_cache_bytes": full,
    }
    return {"cache": cache}


def test_dataset_memory_is_mean_and_peak_of_stored_and_allocated_bytes() -> None:
    summary = cache_summary([_row(100, 160, 400, 480, 400), _row(300, 320, 900, 960, 1200)])
    assert summary["mean_stored_bytes"] == 200.0 and summary["peak_stored_bytes"] == 900
    assert summary["mean_allocated_bytes"] == 240.0 and summary["peak_allocated_bytes"] == 960
    assert summary["mean_stored_vs_full"] == 0.25  # stored bytes, never the allocated ones, over the full cache's
    assert "mean_cache_bytes" not in summary


def test_rows_written_before_the_stored_bytes_field_still_summarise() -> None:
    """A resumed or re-reported folder of an older run: its rows' ``cache_bytes`` count as stored bytes, and what
    they never recorded (allocated bytes, peaks) is null, not made up."""
    new = _row(100, 160, 400, 480, 400)
    old = {"cache": {k: v for k, v in new["cache"].items() if "stored" not in k and "allocated" not in k}}
    old["cache"]["cache_bytes"] = 300
    summary = cache_summary([new, old])
    assert summary["mean_stored_bytes"] == 200.0 and summary["peak_stored_bytes"] is None
    assert summary["mean_allocated_bytes"] is None and summary["peak_allocated_bytes"] is None


def test_reporting_reads_stored_bytes_and_older_runs_cache_bytes() -> None:
    assert mean_stored_bytes({"mean_stored_bytes": 200.0, "mean_allocated_bytes": 240.0}) == 200.0
    assert mean_stored_bytes({"mean_cache_bytes": 1024.0}) == 1024.0  # written before issue #40
    assert math.isnan(mean_stored_bytes({}))
    metrics = {"model": "m", "task": "t", "dataset": "d", "method": "x", "budget": "64L", "score": 1.0}
    row = metrics_to_row({**metrics, "cache": {"mean_stored_bytes": 200.0, "mean_stored_vs_full": 0.25}})
    assert (row["mean_stored_bytes"], row["mean_stored_vs_full"]) == (200.0, 0.25)
