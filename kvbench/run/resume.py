"""What a run folder already holds, checked before a run adds to it: the same config (:func:`check_existing_run`),
predictions that belong to this dataset's samples and prompts (:func:`check_resumable`), and the sample extent
recorded in ``config.yaml`` (:func:`with_folder_extent`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from kvbench.errors import KVBenchError
from kvbench.sample import Sample
from kvbench.storage.writers import CONFIG_FILE, RUN_META_FILE, config_differences, holds_results, read_json, same_run


def with_folder_extent(folder: Path, cfg: DictConfig) -> DictConfig:
    """``cfg`` with ``task.num_samples`` raised to what the folder's ``config.yaml`` already covers (``None``: all
    samples), so a run that reports on fewer samples leaves the folder's recorded extent as it was."""
    path = folder / CONFIG_FILE
    if not path.exists():
        return cfg
    recorded = OmegaConf.select(OmegaConf.load(path), "task.num_samples", default=-1)
    requested = cfg.task.num_samples
    if requested is None or recorded == -1 or (recorded is not None and recorded <= requested):
        return cfg
    widened = cfg.copy()
    widened.task.num_samples = recorded
    return widened


def check_existing_run(folder: Path, cfg_hash: str, cfg: DictConfig, note_replacement: bool = True) -> None:
    """Refuse to mix two different configs in one results folder (one whose run wrote no prediction is replaced)."""
    meta_path = folder / RUN_META_FILE
    if not meta_path.exists():
        return
    existing = read_json(meta_path).get("config_hash")
    if same_run(folder, existing, cfg, cfg_hash):
        return
    if existing and not holds_results(folder):
        if not note_replacement:
            return
        print(
            f"note: {folder} held a run with another config (hash {existing}) that stopped before writing any "
            "prediction; this run replaces it.",
            file=sys.stderr,
        )
        return
    if existing:
        diffs = config_differences(folder, cfg)
        shown = "; ".join(diffs[:8]) + (" ..." if len(diffs) > 8 else "")
        raise KVBenchError(
            f"{folder} already holds a run with a different config (hash {existing} != {cfg_hash}): {shown}. "
            "Nothing was changed. Pass run.tag=<name> to store this variant separately, or remove that folder."
        )


def check_resumable(
    path: Path, done: dict[str, dict[str, Any]], samples: list[Sample], beyond_extent_ok: bool = False
) -> None:
    """Rows already in ``predictions.jsonl`` must belong to this dataset's samples, with the same prompt (rows
    written before prompt hashes were recorded are accepted by id).  ``beyond_extent_ok``: ``samples`` are the first
    N of the dataset, so rows of other ids may be later samples that an earlier, larger run made."""
    by_id = {sample.id: sample for sample in samples}
    stale = sorted(set(done) - set(by_id))
    if stale and not beyond_extent_ok:
        raise KVBenchError(
            f"{path} holds predictions for samples not in this dataset ({stale[:3]}...); "
            "the task definition changed: remove the folder or use run.tag"
        )
    changed = sorted(
        sample_id
        for sample_id, row in done.items()
        if sample_id in by_id
        and row.get("prompt_sha256") is not None
        and row["prompt_sha256"] != by_id[sample_id].prompt_sha256()
    )
    if changed:
        raise KVBenchError(
            f"{path} holds predictions made from different prompts for {len(changed)} sample(s) ({changed[:3]}...): "
            "the task data, generator or tokenizer changed since they were written. Nothing was changed; remove the "
            "folder to rerun, or use run.tag"
        )
