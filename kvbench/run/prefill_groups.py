"""Which jobs of a sweep share each sample's prefill forward (issue #56): what splits a sweep into groups, declared.

Jobs share a prefill when they differ only in what the prefill does not compute: the method and the budget (and the
settings that change no token: results folder, tag, W&B, progress).  Everything that shapes the prefill forward or
the samples splits groups -- :data:`PREFILL_SETTINGS`, read from each job's config, and the cache layout of its
method (:func:`kvbench.inference.shared_prefill.cache_layout`: query-head storage, evictable sliding-window layers)
-- and a job whose method or settings cannot share runs alone, for the reason :func:`unshared_reason` gives.
Per dataset, the shared driver (:mod:`kvbench.run.shared_sweep`) runs alone the datasets whose generation is not
one prefill per sample (:func:`dataset_unshared_reason`).

Sharing changes no result: ``run.share_prefill`` and ``run.prefill_group_size`` are outside the config hash
(:data:`kvbench.storage.writers.NON_SEMANTIC_KEYS`); each job writes its own folder exactly as alone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

#: The settings jobs must agree on to share a prefill, with why (the model section covers its dtype, device and
#: device map, hence the cache backend: paged on CUDA, torch storage on CPU; the task section covers the question
#: mode, the samples, SCBench's context groups and the prompt format).
PREFILL_SETTINGS: dict[str, str] = {
    "model": "the weights, dtype, device and device map (hence the cache backend), tokenizer, prompt length",
    "task": "the samples, the question mode (aware / agnostic), SCBench's context groups, the prompt format",
    "seed": "the random state every job starts from",
    "run.prefill_chunk": "tokens per prefill forward",
    "run.threads": "torch threads (the process's, shared by the group)",
    "run.sample_cache": "where the samples are read from",
    "run.decode_batch": "how the jobs decode (decode_batch 1 only shares)",
}
#: The method's settings that split groups (the cache each job's layers are copied into).
METHOD_LAYOUT = ("gqa_granularity", "compress_sliding")


def unshared_reason(cfg: DictConfig, method: Any) -> str | None:
    """Why the job of ``cfg`` (its built ``method``) runs its own prefill in a sweep, ``None`` when it can share."""
    if not bool(OmegaConf.select(cfg, "run.share_prefill", default=True)):
        return "run.share_prefill=false"
    reason = method.unshared_prefill
    if reason is not None:
        return f"method {cfg.method.name}: {reason}"
    decode_batch = OmegaConf.select(cfg, "run.decode_batch", default=1)
    if decode_batch != 1:
        return f"run.decode_batch={decode_batch}: the batched decoder prefills each sample as a place frees up"
    kv_quant = OmegaConf.select(cfg, "kv_quant.scheme", default="none")
    if kv_quant not in (None, "none"):
        return f"kv_quant={cfg.kv_quant.name}: quantized storage quantizes its own prefill (not shared)"
    return None


def prefill_key(cfg: DictConfig, method: Any) -> str:
    """A digest of what the job's prefill depends on (:data:`PREFILL_SETTINGS` and the method's cache layout):
    equal keys share a prefill."""
    from kvbench.inference.shared_prefill import cache_layout

    parts = {key: OmegaConf.select(cfg, key, default=None) for key in PREFILL_SETTINGS}
    parts = {k: OmegaConf.to_container(v, resolve=True) if isinstance(v, DictConfig) else v for k, v in parts.items()}
    parts["cache_layout"] = list(cache_layout(method))
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def group_size(cfg: DictConfig) -> int | None:
    """``run.prefill_group_size``: most jobs per shared group (``None``: no limit)."""
    size = OmegaConf.select(cfg, "run.prefill_group_size", default=None)
    if size is None:
        return None
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        from kvbench.errors import KVBenchError

        raise KVBenchError(f"run.prefill_group_size={size!r}; valid: a number of jobs >= 1, or null (no limit)")
    return size


def group_jobs(keys: Sequence[str | None], size: int | None = None) -> list[list[int]]:
    """Job indices grouped by prefill key (``None``: the job runs alone), in sweep order, each group at most
    ``size`` jobs (the first job of a group decides where it runs in the sweep)."""
    by_key: dict[str, list[list[int]]] = {}
    groups: list[list[int]] = []
    for index, key in enumerate(keys):
        if key is None:
            groups.append([index])
            continue
        chunks = by_key.setdefault(key, [])
        if not chunks or (size is not None and len(chunks[-1]) >= size):
            chunks.append([])
            groups.append(chunks[-1])
        chunks[-1].append(index)
    return groups


def dataset_unshared_reason(dataset: Any) -> str | None:
    """Why a dataset's samples are generated job by job in a shared group: a dataset with its own evaluation loop
    (lm-eval), context groups (SCBench: several questions over one context, :mod:`kvbench.run.groups`), or several
    passes (a later pass's prompt is the job's own earlier text); ``None``: one shared prefill per sample."""
    if getattr(dataset, "evaluates_itself", False):
        return "the dataset runs its own evaluation loop (lm-eval)"
    if getattr(dataset, "context_groups", None) is not None:
        return "context groups (several questions over one shared context) run job by job"
    if getattr(dataset, "multi_pass", False):
        return "multi-pass dataset (a later pass's prompt holds the job's own earlier text)"
    return None
