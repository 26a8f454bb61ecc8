"""A run's own files, written when the runner claims its folder: ``config.yaml`` (the resolved config) and
``run_meta.json`` (provenance: git commit, versions, device, host, command, times, status), see
:mod:`kvbench.storage.writers`.  The runner updates ``run_meta.json``'s status and end time when the run stops."""

from __future__ import annotations

import platform
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import transformers
from omegaconf import DictConfig, OmegaConf

from kvbench.eviction.plugins import PLUGIN_PACKAGES
from kvbench.kernels.paths import capability_summary
from kvbench.run.fingerprints import Inputs, kvbench_source_digest
from kvbench.run.resume import previous_run_meta, with_folder_extent
from kvbench.storage.provenance import device_name, git_commit, now, slurm_job_id
from kvbench.storage.reader import SCHEMA_VERSION
from kvbench.storage.writers import (
    CONFIG_FILE,
    RUN_META_FILE,
    atomic_write_json,
    atomic_write_text,
)
from kvbench.version import __version__


def write_run_files(
    folder: Path,
    cfg: DictConfig,
    cfg_hash: str,
    inputs: Mapping[str, Inputs] | None = None,
    stale_rows: Mapping[str, list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """Write ``folder``'s ``config.yaml`` and ``run_meta.json`` (status ``running``) for the run of ``cfg``; returns
    the ``run_meta.json`` payload.  A folder resumed by the same run keeps its ``first_start_time``, the inputs
    recorded for its other datasets and the rows kept from changed inputs (``stale_rows``, plus this run's); one
    whose run was replaced starts afresh.  ``inputs``: what each dataset's rows are computed from
    (:mod:`kvbench.run.fingerprints`), recorded per dataset with kvbench's source digest (``kvbench_source``)."""
    atomic_write_text(folder / CONFIG_FILE, OmegaConf.to_yaml(with_folder_extent(folder, cfg), resolve=True))
    meta_path = folder / RUN_META_FILE
    meta = previous_run_meta(folder, cfg, cfg_hash)  # verified; {} for a replaced run (it starts afresh)
    meta.update(
        {
            "schema_version": SCHEMA_VERSION,
            "config_hash": cfg_hash,
            "model": cfg.model.name,
            "task": cfg.task.name,
            "method": cfg.method.name,
            "budget": cfg.budget.name,
            "tag": cfg.run.tag,
            "git_commit": git_commit(),
            "kvbench_version": __version__,
            "torch_version": torch.__version__,
            "transformers_version": transformers.__version__,
            "python_version": platform.python_version(),
            "device": device_name(cfg.model.device),
            "device_map": OmegaConf.to_container(cfg.model.device_map)
            if isinstance(cfg.model.get("device_map"), DictConfig)
            else cfg.model.get("device_map"),
            "hostname": platform.node(),
            "command": sys.argv,
            "start_time": now(),
            "end_time": None,
            "status": "running",
            "slurm_job": slurm_job_id(),
            "attention_capability": capability_summary(),
            "decode_batch": cfg.run.decode_batch,
        }
    )
    if str(cfg.method.family) in PLUGIN_PACKAGES:  # another package's method (entry-point group kvbench.methods)
        meta["method_package"] = PLUGIN_PACKAGES[str(cfg.method.family)]
    meta.setdefault("first_start_time", meta["start_time"])
    meta["kvbench_source"] = kvbench_source_digest()
    recorded = meta.setdefault("inputs", {})
    recorded.update({name: {"digest": i.digest, "details": i.details} for name, i in (inputs or {}).items()})
    for dataset, records in (stale_rows or {}).items():  # kept (flagged by the views) or set aside (recomputed)
        for record in records:
            key = "stale_rows" if "kept_at" in record else "recomputed_rows"
            meta.setdefault(key, {}).setdefault(dataset, []).append(record)
    atomic_write_json(meta_path, meta)
    return meta
