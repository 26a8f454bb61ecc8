"""``kvbench report``: a self-contained static results site built from the run folders.

    kvbench report [results/runs] --out results/site [--experiment X] [--title T] [--single-file]

writes ``<out>/index.html`` (the page of :mod:`kvbench.reporting.site_page` with the data embedded),
``<out>/plotly.min.js`` (Plotly's offline bundle from the installed ``plotly`` package: no CDN, the site opens from
disk on a machine without network) and ``<out>/.kvbench-site-cache.json``.  With ``single_file`` (``--single-file``)
the bundle is inlined into ``index.html`` instead (one ~5 MB file to share by mail or as a CI artifact; no
``plotly.min.js`` is written).  The cache keeps each run folder's
extras with the sizes and modification times of the files they were read from, so a rebuild reads only the run
folders that changed (:func:`kvbench.reporting.dashboard_data.load_dashboard_runs`); the bundle is copied only when
missing or from another Plotly version.

The leaderboards' rows and values are ``scripts/aggregate.py``'s ``runs_summary.csv`` (the same
:func:`~kvbench.reporting.aggregate.run_summary` of the same runs).  Bad input (no runs, a corrupt
``metrics.json``, an unknown experiment, plotly missing) raises :class:`~kvbench.errors.KVBenchError` before
anything is written.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kvbench.errors import KVBenchError
from kvbench.reporting.aggregate import run_summary, union_flags
from kvbench.reporting.breakdowns import breakdown_tables, length_charts
from kvbench.reporting.dashboard_data import (
    NO_EXPERIMENT,
    DashboardRuns,
    leaderboards,
    load_dashboard_runs,
    paper_values,
    run_id,
)
from kvbench.reporting.palette import palette
from kvbench.reporting.pivot import SMALL_N, headline, pivots
from kvbench.reporting.site_page import PAGE_TEMPLATE
from kvbench.reporting.site_views import VIEWS_SCRIPT
from kvbench.storage.writers import atomic_write_text
from kvbench.views.run_views import BROWSER_ROWS

CACHE_FILE = ".kvbench-site-cache.json"
PLOTLY_FILE = "plotly.min.js"
#: Bumped when the cached extras change shape, so an old cache is ignored (the code reading them is hashed too).
CACHE_VERSION = 1


def cache_version() -> str:
    """:data:`CACHE_VERSION` and a hash of :mod:`kvbench.views.run_views` (which computes the cached extras):
    a cache written by other code is ignored."""
    from kvbench.views import run_views

    return f"{CACHE_VERSION}-{hashlib.sha256(Path(run_views.__file__).read_bytes()).hexdigest()[:16]}"


@dataclass
class SiteResult:
    """What :func:`build_site` wrote: the page, how many runs it shows, how many came from the cache, seconds."""

    index: Path
    n_runs: int
    cache_hits: int
    seconds: float


def _plotly() -> tuple[str, Any]:
    try:
        import plotly
        from plotly.offline import get_plotlyjs
    except ImportError as err:
        raise KVBenchError(
            "kvbench report needs plotly (its offline JavaScript bundle is shipped with the site): "
            "pip install 'kvbench[site]'"
        ) from err
    return plotly.__version__, get_plotlyjs


def _read_cache(out: Path) -> dict[str, Any]:
    try:
        payload = json.loads((out / CACHE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(payload, dict) or payload.get("version") != cache_version():
        return {}
    return payload.get("runs") or {}


def run_records(runs: DashboardRuns) -> list[dict[str, Any]]:
    """One JSON-ready record per run for the page: identity, per-dataset scores with intervals, the mean (as in
    ``runs_summary.csv``), axes, flags, provenance."""
    summary = run_summary(runs.scores)
    means = {run_id({**rec, "tag": rec["tag"] or None}): rec["mean"] for rec in summary.to_dict("records")}
    records = []
    for rid, group in runs.scores.groupby(runs.scores.apply(run_id, axis=1), sort=True):
        first = group.iloc[0]
        extras = runs.extras[rid]
        per_dataset = extras.get("datasets", {})
        scores = {
            ds: {"score": float(score), "ci95": (per_dataset.get(ds) or {}).get("ci95")}
            for ds, score in zip(group["dataset"], group["score"], strict=True)
        }
        mean_ci = (extras.get("averages", {}).get("mean") or {}).get("ci95")
        flags = (["stand-in"] if extras.get("stand_in") else []) + (["synthetic"] if extras.get("synthetic") else [])
        flags += [flag for flag in union_flags(group["flags"]).split(",") if flag]
        records.append(
            {
                "run_id": rid,
                "model": first["model"],
                "task": first["task"],
                "method": first["method"],
                "budget": first["budget"],
                "tag": first["tag"],
                "question_mode": first["question_mode"],
                "family": extras.get("family"),
                "experiment": extras.get("experiment") or NO_EXPERIMENT,
                "flags": flags,
                "stand_in": extras.get("stand_in", []),
                "x": extras.get("budget_tokens_per_layer"),
                "kept_fraction": extras.get("kept_fraction"),
                "stored_fraction": extras.get("stored_fraction"),
                "cache_bytes": extras.get("cache_bytes"),
                "prefill_s": extras.get("prefill_s"),
                "decode_s": extras.get("decode_s"),
                # complete rows on disk (load_runs checks every metrics.json against its predictions.jsonl)
                "n_min": min((int(n) for n in group["n_samples"] if n == n and n is not None), default=None),
                "context_length": extras.get("context_length"),
                "scores": scores,
                "mean": {"score": float(means[rid]), "ci95": mean_ci} if rid in means else None,
                "provenance": extras.get("provenance", {}),
                "data_provenance": {ds: (d or {}).get("data_provenance") for ds, d in per_dataset.items()},
                "folder": str(Path(first["path"]).parent.parent),
            }
        )
    return records


def site_data(runs: DashboardRuns, plotly_version: str) -> dict[str, Any]:
    """The page's embedded data: runs, the pivot leaderboards and headline charts, the per-run leaderboards, needle
    grids, the predictions browser's rows, the breakdown tables and accuracy vs generated length charts
    (:mod:`kvbench.reporting.breakdowns`), the method palette, filter choices, build metadata."""
    from kvbench.version import __version__

    records = run_records(runs)
    tables = pivots(runs)
    return {
        "root": str(runs.root),
        "generated_at": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "kvbench_version": __version__,
        "plotly_version": plotly_version,
        "filters": {k: sorted({str(r[k]) for r in records}) for k in ("model", "task", "question_mode", "experiment")},
        "runs": records,
        "palette": palette(r["method"] for r in records),
        "small_n": SMALL_N,
        "browser_rows": BROWSER_ROWS,
        "pivots": tables,
        "headline": headline(tables, paper_values(runs.scores)),
        "leaderboards": leaderboards(runs),
        "predictions": {
            rid: {ds: d["predictions"] for ds, d in e.get("datasets", {}).items() if d.get("predictions")}
            for rid, e in runs.extras.items()
        },
        "needles": {rid: e["needles"] for rid, e in runs.extras.items() if e.get("needles")},
        "breakdowns": breakdown_tables(runs.scores),
        "length_charts": length_charts(runs),
    }


def _head(path: Path, n_chars: int) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read(n_chars)
    except (OSError, UnicodeDecodeError):
        return ""


def finite_json(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by ``None`` (JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def render_page(data: dict[str, Any], title: str, plotly_js: str | None = None) -> str:
    """``index.html``: the template with the title and the data (``</`` escaped so no text closes the script);
    ``plotly_js``: the bundle to inline (a single-file page), else the page loads ``plotly.min.js`` beside it."""
    payload = json.dumps(finite_json(data), ensure_ascii=False, allow_nan=False).replace("</", "<\\/")
    escaped = title.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    if plotly_js is None:
        plotly_tag = f'<script src="{PLOTLY_FILE}"></script>'
    else:
        plotly_tag = "<script>" + plotly_js.replace("</script", "<\\/script") + "</script>"
    page = PAGE_TEMPLATE.replace("__TITLE__", escaped).replace("__VIEWS__", VIEWS_SCRIPT)
    # The data and the bundle last: neither may have its own text replaced.
    head, tail = page.split("__PLOTLY__")
    return head + plotly_tag + tail.replace("__DATA__", payload)


def build_site(
    root: str | Path,
    out: str | Path,
    experiment: str | None = None,
    title: str = "kvbench results",
    single_file: bool = False,
) -> SiteResult:
    """Build (or update) the site of the runs under ``root`` in ``out``; see the module docstring."""
    start = time.perf_counter()
    out = Path(out)
    plotly_version, get_plotlyjs = _plotly()
    cache = _read_cache(out)
    runs = load_dashboard_runs(root, experiment=experiment, cache=cache)
    data = site_data(runs, plotly_version)
    page = render_page(data, title, get_plotlyjs() if single_file else None)
    out.mkdir(parents=True, exist_ok=True)
    bundle = out / PLOTLY_FILE
    stamp = f"/* plotly.js bundled by kvbench from plotly {plotly_version} */\n"
    if not single_file and _head(bundle, len(stamp)) != stamp:
        atomic_write_text(bundle, stamp + get_plotlyjs())
    atomic_write_text(out / "index.html", page)
    atomic_write_text(out / CACHE_FILE, json.dumps({"version": cache_version(), "runs": cache}))
    return SiteResult(out / "index.html", len(data["runs"]), runs.cache_hits, time.perf_counter() - start)
