"""What a run records per dataset, written by one writer: the ``metrics.json`` payload (:func:`metrics_record`,
with the settings record :func:`settings_record` and the cache summary :func:`cache_summary`), written atomically
with the dataset's other files by :func:`write_metrics`, and the :class:`DatasetResult` a run returns.

Both evaluation loops use it: kvbench's own (:class:`kvbench.run.runner.Runner`) and lm-eval's
(:meth:`kvbench.lmeval.runner.LMEvalDataset.evaluate`), so their ``metrics.json`` share one shape.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from kvbench.eviction.base import EvictionMethod
from kvbench.eviction.knobs import recorded_knobs, session_fields
from kvbench.run.summary import DatasetScores
from kvbench.storage.reader import SCHEMA_VERSION
from kvbench.storage.termination import TERMINATION
from kvbench.storage.writers import METRICS_FILE, atomic_write_json

LOG = logging.getLogger(__name__)


@dataclass
class DatasetResult:
    """One dataset's outcome, for the summary table (``interval``: bootstrap 95 % interval of the score, ``None``
    when the score is not a mean over samples; ``details``: what :mod:`kvbench.run.summary` reads)."""

    dataset: str
    metric: str
    score: float
    n_samples: int
    mean_kept_fraction: float
    skipped: bool
    interval: tuple[float, float] | None = None
    details: DatasetScores | None = None
    #: Set when the folder holds more samples than the run asked for: how many (the score covers the first
    #: ``n_samples``; the folder's ``metrics.json`` and ``summary.json`` keep covering all ``first_of``).
    first_of: int | None = None


def prediction_row(sample: Any, dataset: Any, output: Any, encoded: Any) -> dict[str, Any]:
    """A sample's ``predictions.jsonl`` row from its generation ``output`` and its ``encoded`` prompt."""
    record = output.record
    row = {
        "id": sample.id,
        "prompt_sha256": sample.prompt_sha256(),
        "prediction": dataset.postprocess(output.final_text),
        "raw_prediction": output.final_text,
        "answers": list(sample.answers),
        "all_classes": sample.all_classes,
        "length": sample.length,
        "extra": sample.extra,
        "prompt_end": sample.prompt_end(),
        "input_tokens": len(encoded.input_ids),
        "context_tokens": len(encoded.context_ids),
        "question_tokens": len(encoded.question_ids),
        "truncated": encoded.truncated,
        "question_lost": encoded.question_lost,
        "new_tokens": len(output.token_ids),
        "stop_reason": output.stop_reason,
        "cache": record.to_json(),
    }
    if output.later_passes:  # a multi-pass dataset: the fields above describe the first pass (the document's)
        row["first_pass_text"] = output.text
        row["later_passes"] = output.later_passes
    return row


def cache_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean requested/achieved per-layer lengths and kept fraction over a dataset's rows."""
    if not rows:
        return {}
    requested = torch.tensor([r["cache"]["requested_per_layer"] for r in rows], dtype=torch.float64)
    achieved = torch.tensor([r["cache"]["achieved_per_layer"] for r in rows], dtype=torch.float64)
    contexts = torch.tensor([max(r["cache"]["context_tokens"], 1) for r in rows], dtype=torch.float64)
    kept_fraction = (achieved.mean(dim=1) / contexts).mean()
    return {
        "mean_requested_per_layer": [round(v, 2) for v in requested.mean(dim=0).tolist()],
        "mean_achieved_per_layer": [round(v, 2) for v in achieved.mean(dim=0).tolist()],
        "mean_kept_fraction": round(float(kept_fraction), 4),
        # Memory beside accuracy, the same on every backend: the kept tokens' key + value bytes after the prefill
        # (mean over samples, and the largest any sample stored at any point); what the backend allocated for them.
        **byte_summary(rows),
        # Stored bytes / the full cache's bytes for the same tokens (> 1: query-head storage).
        "mean_stored_vs_full": round(
            sum(row_stored_bytes(r) / max(r["cache"].get("full_cache_bytes", 0), 1) for r in rows) / len(rows), 4
        )
        if all(r["cache"].get("full_cache_bytes") for r in rows)
        else None,
        "samples_exceeding_full_cache": sum(1 for r in rows if r["cache"].get("exceeds_full_cache")),
        "budget_exact": bool(torch.equal(requested, achieved)),
        # Every head kept what the method allocated it (Ada-KV's per-head rounding may drift from the layer budget).
        "allocation_exact": all(r["cache"]["requested_per_head"] == r["cache"]["achieved_per_head"] for r in rows),
        "samples_evicted": sum(1 for r in rows if r["cache"]["evicted"]),
        # The learned weights that scored the samples (KVzap's, Fast KVzip's; kvbench's own CPU-trained checkpoints
        # say so in their "training"), each distinct one once; omitted for methods without any.
        **learned_weights_summary(rows),
    }


def learned_weights_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"learned_weights": [distinct records]}`` of the rows' ``cache.learned_weights``, or ``{}`` when none."""
    distinct: dict[str, Any] = {}
    for row in rows:
        weights = row["cache"].get("learned_weights")
        if weights is not None:
            distinct.setdefault(json.dumps(weights, sort_keys=True), weights)
    return {"learned_weights": list(distinct.values())} if distinct else {}


_WARNED: set[tuple[str, str]] = set()


def method_knobs(cfg: DictConfig) -> Any:
    """The method's class made from ``cfg.method.params`` (every knob at its value: the session knobs too)."""
    from kvbench.eviction.family import family_class

    method_class = family_class(str(cfg.method.family))
    return None if method_class is None else method_class.from_params(cfg.method.params)


def recorded_params(cfg: DictConfig) -> dict[str, Any]:
    """``method.params`` as ``metrics.json`` records it: the session knobs aside (recorded beside it, as before issue
    #57 moved them into ``params``)."""
    params = OmegaConf.to_container(cfg.method.params, resolve=True)
    knobs = method_knobs(cfg)
    session = set(session_fields(type(knobs)) if knobs is not None else ())
    return {key: value for key, value in (params or {}).items() if key not in session}  # type: ignore[union-attr]


def keeps_window(cfg: DictConfig) -> bool:
    """Whether the method protects an observation window: the paper families do; a one-class method only with
    ``method.params.keep_window`` (its class default otherwise: off, e.g. KVzip, which has no window at all)."""
    return bool(getattr(method_knobs(cfg), "keep_window", True))


def warn_if_not_as_asked(cache: Mapping[str, Any], cfg: DictConfig) -> None:
    """Warn once per run (model x method x budget) when a sample could not run what the budget asked: a budget at or
    above its context (nothing evicted: the full cache; ``requested_per_layer`` records the context length actually
    used, ``evicted`` false, and the run keeps its own folder, never the full cache's), or an observation window
    wider than the per-layer budget (``cache``: a prediction row's ``cache`` record)."""
    run = f"{cfg.model.name}/{cfg.method.name}/{cfg.budget.name}"
    requested = list(cache.get("requested_per_layer") or [])
    evicting = str(cfg.budget.spec).strip() != "full" and cfg.method.family != "full"
    if evicting and not cache.get("evicted") and (run, "budget") not in _WARNED:
        _WARNED.add((run, "budget"))
        LOG.warning(
            "budget %s is at or above the context (%s tokens): nothing was evicted, so this sample ran with the full "
            "cache; recorded as such (requested_per_layer = the context length, evicted = false) under budget %s",
            cfg.budget.spec,
            cache.get("context_tokens"),
            cfg.budget.name,
        )
    knobs = method_knobs(cfg)
    window = int(getattr(knobs, "window", 0)) if keeps_window(cfg) else 0
    in_budget = bool(getattr(knobs, "window_in_budget", True))
    smallest = min(requested) if requested else None
    if evicting and in_budget and smallest is not None and window > smallest and (run, "window") not in _WARNED:
        _WARNED.add((run, "window"))
        LOG.warning(
            "method.params.window=%d is wider than the per-layer budget (%d tokens at its smallest): a layer cannot "
            "keep its "
            "whole observation window, so this is not %s at window %d; achieved_per_layer in predictions.jsonl "
            "records what each layer kept. Set method.params.window <= %d, or a larger budget.",
            window,
            smallest,
            cfg.method.name,
            window,
            smallest,
        )


#: Per-sample byte fields of a ``predictions.jsonl`` row's ``cache`` -> the dataset's ``metrics.json`` fields
#: (``mean_`` over samples of the value after the prefill; ``peak_``: the largest over samples of the sample's peak).
BYTE_FIELDS = {"stored_bytes": "peak_stored_bytes", "allocated_bytes": "peak_allocated_bytes"}


def row_stored_bytes(row: dict[str, Any]) -> int:
    """A prediction row's stored bytes; a row written before issue #40 has ``cache_bytes`` instead (the stored bytes
    on the torch backend, the page pool on the paged one: docs/results.md)."""
    cache = row["cache"]
    return cache["stored_bytes"] if "stored_bytes" in cache else cache["cache_bytes"]


def byte_summary(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """``mean_stored_bytes``, ``peak_stored_bytes``, ``mean_allocated_bytes``, ``peak_allocated_bytes`` of a
    dataset's rows (module docstring of :mod:`kvbench.storage.writers`); ``None`` for a field some rows lack (rows
    written before issue #40 have no allocated bytes and no peaks)."""
    summary: dict[str, float | None] = {"mean_stored_bytes": round(sum(map(row_stored_bytes, rows)) / len(rows), 1)}
    for field, peak in BYTE_FIELDS.items():
        if field != "stored_bytes":
            known = all(field in r["cache"] for r in rows)
            summary[f"mean_{field}"] = round(sum(r["cache"][field] for r in rows) / len(rows), 1) if known else None
        summary[peak] = max(r["cache"][peak] for r in rows) if all(peak in r["cache"] for r in rows) else None
    return summary


def json_number(value: Any) -> float | None:
    """A score as strict JSON: NaN (e.g. an empty LongBench-E bucket) becomes null."""
    number = float(value)
    return None if math.isnan(number) else number


def settings_record(
    cfg: DictConfig,
    method: EvictionMethod,
    model_settings: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``metrics.json``'s ``settings``: the method family, budget, the common knobs the method uses, its params,
    resolved settings and reference, then ``model_settings``, the model's dtype and ``extra``; with quantized KV
    storage (``kv_quant`` not ``none``) also ``kv_quant``, its settings."""
    quant = kv_quant_settings(cfg)
    return {
        "method_family": cfg.method.family,
        "budget_spec": cfg.budget.spec,
        **recorded_knobs(method_knobs(cfg), method),
        "params": recorded_params(cfg),
        "resolved": dict(method.settings),
        "reference": OmegaConf.to_container(cfg.method.reference, resolve=True),
        **(model_settings or {}),
        "dtype": cfg.model.dtype,
        **({"kv_quant": quant} if quant else {}),
        **(extra or {}),
    }


def kv_quant_settings(cfg: DictConfig) -> dict[str, Any] | None:
    """The run's ``kv_quant`` node as a plain dict, ``None`` when the storage is not quantized (no node, or scheme
    ``none``: such runs' files are as they were before issue #59)."""
    node = OmegaConf.select(cfg, "kv_quant")
    if node is None or node.get("scheme", "none") == "none":
        return None
    return OmegaConf.to_container(node, resolve=True)  # type: ignore[return-value]


def metrics_record(
    cfg: DictConfig,
    cfg_hash: str,
    dataset: Any,
    *,
    score: float,
    scores: Mapping[str, Any],
    n_samples: int,
    provenance: Mapping[str, Any],
    cache: Mapping[str, Any],
    settings: Mapping[str, Any],
    timing: Mapping[str, Any],
    record_extent: bool = True,
    **extra: Any,
) -> dict[str, Any]:
    """One dataset's ``metrics.json`` payload (``dataset``: a :class:`~kvbench.tasks.base.TaskDataset`).

    ``record_extent``: record ``num_samples_requested`` (kvbench's loop; lm-eval's results do not); ``extra``:
    further sections, after ``timing`` (``attention``; ``lm_eval``).  ``kv_quant``: the preset name, only when the
    KV storage is quantized."""
    quant = kv_quant_settings(cfg)
    record: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "model": cfg.model.name,
        "task": cfg.task.name,
        "dataset": dataset.name,
        "method": cfg.method.name,
        "budget": cfg.budget.name,
        "tag": cfg.run.tag,
        **({"kv_quant": quant["name"]} if quant else {}),
        "metric": dataset.metric_name,
        "score": float(score),
        "scores": dict(scores),
        "n_samples": n_samples,
    }
    if record_extent:
        record["num_samples_requested"] = cfg.task.num_samples
    record.update(
        {
            "config_hash": cfg_hash,
            "question_mode": cfg.task.question_mode,
            "dataset_settings": dataset.describe(),
            "data_provenance": dict(provenance),
            "cache": dict(cache),
            "settings": dict(settings),
            "timing": dict(timing),
            **extra,
        }
    )
    return record


def write_metrics(folder: Path, metrics: Mapping[str, Any], write_first: Callable[[], None] | None = None) -> None:
    """Write ``folder/metrics.json`` atomically, after ``write_first`` (the dataset's other files), all in one
    SIGTERM-deferred section (:data:`kvbench.storage.termination.TERMINATION`): the dataset's files are complete or
    absent as a set.  ``metrics.json`` is written last, since it marks the dataset as done."""
    with TERMINATION.critical():
        if write_first is not None:
            write_first()
        atomic_write_json(folder / METRICS_FILE, metrics)
