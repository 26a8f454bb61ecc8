"""What the dashboards show of each run: the tidy scores of :mod:`kvbench.reporting.aggregate` plus, per run folder,
the 95 % intervals, the numeric axes, the provenance and the needle grids.

The scores come from :func:`~kvbench.reporting.aggregate.load_runs` (the same discovery and rows as
``scripts/aggregate.py``); :func:`read_run_extras` adds what a dashboard needs from the run folder itself
(``<model>/<task>/<method>/<budget>[~<tag>]/``, the parent of the datasets' folders):

* ``summary.json``: each dataset's bootstrap 95 % interval, its per-sample scores (``per_sample``, for the paired
  difference to the full cache), the paper averages with their intervals and the prefill / decode seconds per sample;
* ``config.yaml``: the experiment (``run.experiment``), the seed and the method's family;
* ``run_meta.json``: provenance (git commit, versions, device, command, status, times);
* each dataset's ``metrics.json``: the kept fraction, the stored-bytes fraction (:func:`stored_fraction`), cache
  bytes, requested tokens per layer, data provenance (a ``stand-in`` input, or a made-up ``synthetic`` run, flags
  the run on every view);
* each dataset's ``predictions.jsonl``: the mean context length, the first :data:`BROWSER_ROWS` predictions (for
  the predictions browser: id, prompt end, prediction, answers) and, where the samples carry a needle depth and
  length, the needle grid (mean score per length × depth cell, 0-100).

Every file is optional (made-up runs have only ``metrics.json``).  :func:`file_signature` lists the files read with
their size and modification time, so a caller can keep the extras of unchanged runs (the site's incremental cache).
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from kvbench.budget import BudgetError, parse_budget
from kvbench.storage.integrity import check_metrics
from kvbench.storage.writers import METRICS_FILE, PREDICTIONS_FILE, read_json

SUMMARY_FILE = "summary.json"
RUN_META_FILE = "run_meta.json"
CONFIG_FILE = "config.yaml"
#: run_meta.json fields shown as a run's provenance.
PROVENANCE_KEYS = (
    "config_hash",
    "git_commit",
    "kvbench_version",
    "torch_version",
    "transformers_version",
    "python_version",
    "device",
    "hostname",
    "command",
    "status",
    "start_time",
    "end_time",
    "slurm_job",
)
_DEPTH_KEYS = ("depth", "depth_percent", "needle_depth")
#: Predictions per dataset and run kept for the site's predictions browser (the first ones, in file order).
BROWSER_ROWS = 50
#: Characters of a prediction (and of each answer) kept for the browser.
BROWSER_CHARS = 400
_LENGTH_KEYS = ("target_length", "context_length", "length")


def run_folder_of(metrics_path: str | Path) -> Path:
    """The run folder holding a dataset's ``metrics.json`` (``<run>/<dataset>/metrics.json``)."""
    return Path(metrics_path).parent.parent


def rerun_command(folder: Path, meta: dict[str, Any]) -> str:
    """The command that reruns (resumes, completes) the run in ``folder``: its recorded command (``run_meta.json``'s
    ``command``) with ``run.output_root`` set to the root the folder is under now (a copied or moved results folder
    is rerun where it is, never in the root it was first run in)."""
    argv = [str(arg) for arg in (meta.get("command") or [])[1:] if not str(arg).startswith("run.output_root=")]
    root = folder.parents[3] if len(folder.parents) > 3 else folder.parent  # <root>/<model>/<task>/<method>/<budget>
    return shlex.join(["kvbench", *argv, f"run.output_root={root}"])


def file_signature(folder: Path, datasets: Iterable[str]) -> list[list[Any]]:
    """``[name, size, mtime_ns]`` of every file :func:`read_run_extras` reads (absent files: size -1)."""
    names = [SUMMARY_FILE, RUN_META_FILE, CONFIG_FILE]
    for dataset in sorted(datasets):
        names += [f"{dataset}/{METRICS_FILE}", f"{dataset}/{PREDICTIONS_FILE}"]
    signature = []
    for name in names:
        try:
            stat = (folder / name).stat()
            signature.append([name, stat.st_size, stat.st_mtime_ns])
        except OSError:
            signature.append([name, -1, 0])
    return signature


def _optional_json(path: Path) -> dict[str, Any]:
    try:
        payload = read_json(path)
    except (OSError, ValueError):
        return {}
    return payload if isinstance(payload, dict) else {}


def _optional_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return {}
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        payload = yaml.load(text, Loader=loader)
    except yaml.YAMLError:
        return {}
    return payload if isinstance(payload, dict) else {}


def _first(extra: dict[str, Any], keys: Iterable[str]) -> Any:
    return next((extra[k] for k in keys if extra.get(k) is not None), None)


def _sample_score(row: dict[str, Any]) -> float | None:
    """A prediction row's own score (0-100) when it records one, else RULER's ``string_match_all`` × 100."""
    extra = row.get("extra") or {}
    score = row.get("score", extra.get("score"))
    if score is not None:
        return float(score)
    answers = [str(a).lower() for a in row.get("answers") or []]
    if not answers:
        return None
    prediction = str(row.get("prediction", "")).lower()
    return 100.0 * sum(a in prediction for a in answers) / len(answers)


def stored_fraction(cache: dict[str, Any]) -> float | None:
    """:func:`mean_stored_vs_full` for the site's JSON: ``None`` where it was not recorded."""
    return finite_number(mean_stored_vs_full(cache))


def _browser_row(row: dict[str, Any]) -> dict[str, Any]:
    """What the predictions browser shows of one prediction row (long texts cut to :data:`BROWSER_CHARS`)."""
    return {
        "id": str(row.get("id", "")),
        "prompt_end": str(row.get("prompt_end") or "")[-BROWSER_CHARS:],
        "prediction": str(row.get("prediction", ""))[:BROWSER_CHARS],
        "answers": [str(a)[:BROWSER_CHARS] for a in (row.get("answers") or [])[:5]],
        "input_tokens": row.get("input_tokens"),
    }


def read_predictions_view(
    path: Path,
) -> tuple[float | None, dict[str, Any] | None, list[dict[str, Any]], float | None]:
    """The mean prompt length (``input_tokens``) of a dataset's predictions, its needle grid (if it has one), its
    first :data:`BROWSER_ROWS` rows for the predictions browser (:func:`_browser_row`) and the mean generated length
    (``new_tokens``; ``None`` where no row records it).

    The grid is ``{"lengths": [int], "depths": [float], "z": [[score or None per length] per depth]}``, each cell
    the mean score (0-100) of the samples with that context length and needle depth.  A torn last line (a killed
    run) is skipped.
    """
    lengths: list[float] = []
    generated: list[float] = []
    cells: dict[tuple[int, float], list[float]] = {}
    browser: list[dict[str, Any]] = []
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if not isinstance(row, dict):
                    continue
                if len(browser) < BROWSER_ROWS:
                    browser.append(_browser_row(row))
                if isinstance(row.get("input_tokens"), (int, float)):
                    lengths.append(float(row["input_tokens"]))
                if isinstance(row.get("new_tokens"), (int, float)):
                    generated.append(float(row["new_tokens"]))
                extra = row.get("extra") or {}
                depth, length = _first(extra, _DEPTH_KEYS), _first(extra, _LENGTH_KEYS)
                score = _sample_score(row) if depth is not None and length is not None else None
                if score is not None:
                    cells.setdefault((int(length), float(depth)), []).append(score)
    except OSError:
        return None, None, [], None
    context = _mean(lengths)
    generated_length = _mean(generated)
    if not cells:
        return context, None, browser, generated_length
    xs = sorted({k[0] for k in cells})
    ys = sorted({k[1] for k in cells})
    z = [[_mean(cells.get((x, y))) for x in xs] for y in ys]
    return context, {"lengths": xs, "depths": ys, "z": z}, browser, generated_length


def _mean(values: list[float] | None) -> float | None:
    return sum(values) / len(values) if values else None


def budget_tokens_per_layer(budget: str, context_length: float | None, requested: list[float] | None) -> float | None:
    """Tokens per layer a budget asks for: ``n`` of ``<n>L`` / ``<n>/layer``; for ``<r>x`` the mean of the run's
    requested per-layer budgets when recorded, else ``ratio × context``; the context length for ``full``; for a
    threshold ``<t>thr``, which sets no size, the run's measured mean per layer (what the threshold kept, recorded as
    its requested size), else ``None``: a threshold run is placed by what it stored, never by ``t``."""
    try:
        parsed = parse_budget(budget)
    except BudgetError:
        return float(sum(requested) / len(requested)) if requested else None
    if parsed.is_threshold:
        return float(sum(requested) / len(requested)) if requested else None
    if parsed.follows_context and requested:
        return float(sum(requested) / len(requested))
    if parsed.is_full or parsed.follows_context:
        return None if context_length is None else float(parsed.mean_per_layer(round(context_length)))
    return float(parsed.value)


def mean_stored_bytes(cache: dict[str, Any]) -> float:
    """A dataset's mean stored bytes (the kept tokens' keys and values, the same on every backend) from its
    ``metrics.json`` ``cache``: the one accessor every memory column and view reads (NaN when not recorded).

    Runs written before ``mean_stored_bytes`` existed have ``mean_cache_bytes``: the stored bytes on the torch
    backend, the page pool on the paged backend (docs/results.md)."""
    return _number(cache.get("mean_stored_bytes", cache.get("mean_cache_bytes")))


def mean_stored_vs_full(cache: dict[str, Any]) -> float:
    """A dataset's stored bytes over a full cache's for the same tokens (the stored-bytes fraction beside tokens
    kept: query-head storage holds more than its token budget suggests; NaN when not recorded)."""
    return _number(cache.get("mean_stored_vs_full"))


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def finite_number(value: Any) -> float | None:
    """``value`` as a finite float, or None (not a number, NaN, infinite)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def read_run_extras(folder: Path, datasets: Iterable[str]) -> dict[str, Any]:
    """Everything a dashboard shows of one run folder beyond its tidy scores (see the module docstring).

    Returns a JSON-ready dict: ``experiment``, ``family``, ``seed``, ``provenance``, ``stand_in`` (names of stand-in
    inputs), ``synthetic``, ``context_length``, ``budget_tokens_per_layer``, ``kept_fraction``, ``stored_fraction``,
    ``cache_bytes`` (means over the datasets), ``prefill_s`` / ``decode_s`` (seconds per sample, summary.json),
    ``datasets`` (per dataset: ``ci95``, ``n_samples``, ``per_sample`` (ids and scores, or ``None``), ``predictions``
    (the browser's rows, with each sample's ``score`` where known), ``prefill_s``, ``decode_s``,
    ``stored_fraction``, ``kept_fraction``, ``cache_bytes``, ``context_length``, ``generated_length`` (mean
    ``new_tokens``), ``data_provenance``), ``averages``
    (summary.json's paper averages with their ``ci95``) and ``needles`` (dataset -> grid, see
    :func:`read_predictions_view`).
    """
    summary = _optional_json(folder / SUMMARY_FILE)
    meta = _optional_json(folder / RUN_META_FILE) or dict(summary.get("run") or {})
    config = _optional_yaml(folder / CONFIG_FILE)
    summary_rows = [row for row in summary.get("datasets") or [] if isinstance(row, dict)]
    intervals = {row.get("dataset"): row.get("ci95") for row in summary_rows}
    per_sample = {row.get("dataset"): row.get("per_sample") for row in summary_rows}
    per_dataset: dict[str, dict[str, Any]] = {}
    needles: dict[str, Any] = {}
    stand_in: list[str] = []
    synthetic = False
    family = None
    requested: list[float] = []
    budget = str(meta.get("budget") or "")
    for dataset in sorted(datasets):
        metrics = _optional_json(folder / dataset / METRICS_FILE)
        budget = budget or str(metrics.get("budget") or "")
        cache = metrics.get("cache") or {}
        provenance = metrics.get("data_provenance") or {}
        synthetic = synthetic or bool(metrics.get("synthetic", False))
        family = family or (metrics.get("settings") or {}).get("method_family")
        stand_in += [f"{dataset}: {name}" for name, p in provenance.items() if (p or {}).get("source") == "stand-in"]
        requested += [float(v) for v in cache.get("mean_requested_per_layer") or []]
        context, grid, browser, generated_length = read_predictions_view(folder / dataset / PREDICTIONS_FILE)
        if grid is not None:
            needles[dataset] = grid
        samples = per_sample.get(dataset) or {}
        scores_by_id = dict(zip(samples.get("ids") or [], samples.get("scores") or [], strict=False))
        for row in browser:
            row["score"] = scores_by_id.get(row["id"])
        timing = metrics.get("timing") or {}
        per_dataset[dataset] = {
            "ci95": intervals.get(dataset),
            # the complete rows on disk that metrics.json counts (issue #55), not its own claim
            "n_samples": check_metrics(metrics, folder / dataset / PREDICTIONS_FILE)[0] if metrics else None,
            "per_sample": samples if scores_by_id else None,
            "predictions": browser,
            "prefill_s": finite_number(timing.get("prefill_s_mean")),
            "decode_s": finite_number(timing.get("decode_s_mean")),
            "stored_fraction": stored_fraction(cache),
            "kept_fraction": finite_number(cache.get("mean_kept_fraction")),
            "cache_bytes": finite_number(mean_stored_bytes(cache)),
            "context_length": context,
            "generated_length": generated_length,
            "data_provenance": provenance,
        }
    run_cfg = config.get("run") or {}
    method_cfg = config.get("method") or {}
    contexts = [d["context_length"] for d in per_dataset.values() if d["context_length"] is not None]
    context_length = sum(contexts) / len(contexts) if contexts else None
    kept = [d["kept_fraction"] for d in per_dataset.values() if d["kept_fraction"] is not None]
    stored = [d["stored_fraction"] for d in per_dataset.values() if d["stored_fraction"] is not None]
    cache_bytes = [d["cache_bytes"] for d in per_dataset.values() if d["cache_bytes"] is not None]
    timing = summary.get("timing") or {}
    return {
        "experiment": run_cfg.get("experiment") or None,
        "family": family or method_cfg.get("family") or None,
        "provenance": {
            **{k: meta.get(k) for k in PROVENANCE_KEYS if k in meta},
            **({"rerun_command": rerun_command(folder, meta)} if meta.get("command") else {}),
        },
        "stand_in": stand_in,
        "synthetic": synthetic,
        "context_length": context_length,
        "budget_tokens_per_layer": budget_tokens_per_layer(budget, context_length, requested),
        "kept_fraction": sum(kept) / len(kept) if kept else None,
        "stored_fraction": sum(stored) / len(stored) if stored else None,
        "cache_bytes": sum(cache_bytes) / len(cache_bytes) if cache_bytes else None,
        "seed": config.get("seed"),
        "prefill_s": finite_number(timing.get("prefill_s_mean")),
        "decode_s": finite_number(timing.get("decode_s_mean")),
        "datasets": per_dataset,
        "averages": summary.get("averages") or {},
        "needles": needles,
    }
