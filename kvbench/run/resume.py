"""What a run folder already holds, checked before a run adds to it: the same config (:func:`check_existing_run`),
predictions that belong to this dataset's samples and prompts (:func:`check_resumable`), and the sample extent
recorded in ``config.yaml`` (:func:`with_folder_extent`)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from kvbench.errors import KVBenchError
from kvbench.sample import Sample
from kvbench.storage.reader import DamagedFile, read_config_yaml, read_metrics, read_run_meta
from kvbench.storage.writers import CONFIG_FILE, RUN_META_FILE, config_differences, holds_results, same_run

LOG = logging.getLogger(__name__)


def with_folder_extent(folder: Path, cfg: DictConfig) -> DictConfig:
    """``cfg`` with ``task.num_samples`` raised to what the folder's ``config.yaml`` already covers (``None``: all
    samples), so a run that reports on fewer samples leaves the folder's recorded extent as it was."""
    path = folder / CONFIG_FILE
    if not path.exists():
        return cfg
    stored = read_config_yaml(path)
    if stored is None:  # damaged: the run rewrites it (check_existing_run decided it is this run)
        return cfg
    recorded = OmegaConf.select(stored, "task.num_samples", default=-1)
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
    try:
        existing = read_run_meta(meta_path)["config_hash"]
    except DamagedFile as err:
        if not holds_results(folder):
            return  # nothing worth keeping: the run replaces the folder's files
        if read_config_yaml(folder / CONFIG_FILE) is not None and not config_differences(folder, cfg):
            if note_replacement:
                LOG.warning("%s; its config.yaml is this run's, so this run rewrites run_meta.json", err.reason_line)
            return
        raise
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
            "Nothing was changed. Another process started that run in this folder after this one chose it: run the "
            "command again and it takes a folder of its own (run.tag=<name> names one yourself)."
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


def previous_run_meta(folder: Path, cfg: DictConfig, cfg_hash: str) -> dict[str, Any]:
    """The folder's ``run_meta.json`` when it records this run (its provenance is carried on), else ``{}``: absent,
    another config's run being replaced, or damaged (:func:`check_existing_run` found ``config.yaml`` to be this
    run's, so it is rewritten)."""
    path = folder / RUN_META_FILE
    try:
        meta = read_run_meta(path) if path.exists() else {}
    except DamagedFile:
        return {}
    return meta if same_run(folder, meta.get("config_hash"), cfg, cfg_hash) else {}


def trusted_metrics(path: Path) -> dict[str, Any] | None:
    """A dataset's ``metrics.json`` (:func:`kvbench.storage.reader.read_metrics`), or ``None`` with a warning naming
    the file when it is damaged: the run then recomputes it from ``predictions.jsonl`` (regenerating only the
    samples that lack a row).  A file of a newer schema version is refused, never overwritten."""
    try:
        return read_metrics(path)
    except DamagedFile as err:
        LOG.warning("%s; recomputing it from predictions.jsonl", err.reason_line)
        return None


def lost_predictions(path: Path, rows: dict[str, dict[str, Any]], samples: list[Sample], claimed: int) -> bool:
    """Whether a finished dataset's ``predictions.jsonl`` lost rows its ``metrics.json`` counted (``claimed``); if
    so, warns naming the file: the run regenerates exactly the missing samples and rewrites ``metrics.json``."""
    missing = [sample.id for sample in samples if sample.id not in rows]
    if not missing:
        return False
    LOG.warning(
        "%s lacks %d of the %d samples its metrics.json counts (%s): regenerating them and rewriting metrics.json",
        path,
        len(missing),
        claimed,
        ", ".join(missing[:3]) + (" ..." if len(missing) > 3 else ""),
    )
    return True
