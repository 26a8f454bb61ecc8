"""What a run folder already holds, checked before a run adds to it: the same config (:func:`check_existing_run`),
rows of this configuration computed from today's data, method files and method source
(:func:`check_inputs_unchanged`), predictions that belong to this dataset's samples and prompts
(:func:`check_resumable`), a ``metrics.json`` that agrees with its rows (:func:`scores_disagree`), and the sample
extent recorded in ``config.yaml`` (:func:`with_folder_extent`)."""

from __future__ import annotations

import logging
import math
import os
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from kvbench.errors import KVBenchError
from kvbench.run.fingerprints import Inputs, changes
from kvbench.sample import Sample
from kvbench.storage.integrity import check_metrics
from kvbench.storage.provenance import now
from kvbench.storage.reader import DamagedFile, read_config_yaml, read_metrics, read_run_meta
from kvbench.storage.writers import (
    CONFIG_FILE,
    METRICS_FILE,
    PREDICTIONS_FILE,
    RUN_META_FILE,
    TIMINGS_FILE,
    PredictionLog,
    config_differences,
    holds_results,
    same_run,
)

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


def _recorded_metrics(path: Path) -> dict[str, Any]:
    """A dataset's ``metrics.json`` for the checks below; ``{}`` when absent or damaged (the run recomputes it)."""
    try:
        return read_metrics(path) if path.exists() else {}
    except DamagedFile:
        return {}


def check_rows_belong(folder: Path, rows: list[dict[str, Any]], hashes: set[str]) -> None:
    """Refuse rows of another configuration: a row records the config hash it was computed under
    (``config_hash``), which must be one of ``hashes`` (this run's; the folder's recorded one, which
    :func:`check_existing_run` found to be this run).  Rows written before hashes were recorded are accepted when
    the run folder records its own config (``run_meta.json`` or ``config.yaml``), and refused in a folder that
    records none: nothing says which configuration wrote them."""
    path = folder / PREDICTIONS_FILE
    foreign = sorted({str(row["config_hash"]) for row in rows if row.get("config_hash") not in (None, *hashes)})
    run = folder.parent
    unknown = any("config_hash" not in row for row in rows) and not (
        (run / RUN_META_FILE).exists() or (run / CONFIG_FILE).exists()
    )
    if not foreign and not unknown:
        return
    whose = f"another configuration (config hash {', '.join(foreign)})" if foreign else "an unknown configuration"
    raise KVBenchError(
        f"{path} holds prediction rows of {whose}, not of this run ({sorted(hashes)[0]}): they are not this run's "
        f"results. Nothing was changed. Move that file (or {folder}) away to run this configuration here, or store "
        "this run apart with run.tag=<name>"
    )


def check_inputs_unchanged(
    folder: Path, current: dict[str, Inputs], cfg_hash: str, on_change: str = "refuse"
) -> dict[str, list[dict[str, Any]]]:
    r"""The one check of a resume against what its rows were computed from (issue #55 item 1): per dataset of
    ``current`` (dataset -> this run's :class:`~kvbench.run.fingerprints.Inputs`), the ``inputs`` digest of each row
    of ``predictions.jsonl`` and of ``metrics.json`` must be today's, or one that an earlier run kept
    (``run_meta.json``'s ``stale_rows``).  Rows from changed data, method files or method source are, by
    ``on_change`` (``run.changed_inputs``): ``refuse``\ d (the default), naming what changed and the two ways on;
    ``recompute``\ d (the dataset's files are set aside as ``<file>.stale-<time>``, nothing deleted, and the run
    computes them again); or ``keep``\ t, recorded as predating the change (every view flags the dataset).  Returns
    what to record in ``run_meta.json``: dataset -> ``[{"inputs": digest, "changed": [...], "kept_at" or
    "set_aside_at": time}]``.  Also refuses rows of another configuration (:func:`check_rows_belong`).  Records
    without a digest (written before issue #55) pass.

    A folder whose config changed is another matter (:func:`check_existing_run`): this is the case of a folder
    whose run is the same configuration, computed from inputs that changed under it."""
    meta = _recorded_run_meta(folder)
    records: dict[str, list[dict[str, Any]]] = {}
    refused = []
    hashes = {cfg_hash, *([meta["config_hash"]] if meta.get("config_hash") else [])}
    for dataset, inputs in current.items():
        metrics = _recorded_metrics(folder / dataset / METRICS_FILE)
        log = folder / dataset / PREDICTIONS_FILE
        rows = PredictionLog(log).load() if log.exists() else []
        check_rows_belong(folder / dataset, rows, hashes)
        accepted = {record.get("inputs") for record in (meta.get("stale_rows") or {}).get(dataset, [])}
        recorded = {row["inputs"] for row in rows if row.get("inputs")}
        if isinstance(metrics.get("inputs"), dict) and metrics["inputs"].get("digest"):
            recorded.add(metrics["inputs"]["digest"])
        stale = sorted(recorded - {inputs.digest} - accepted)
        changed = [changes(_details_of(digest, dataset, metrics, meta), inputs) for digest in stale]
        if stale and on_change == "refuse":
            refused.append(f"{folder / dataset}: " + "; ".join(line for lines in changed for line in lines))
        elif stale:
            when = now()
            if on_change == "recompute":
                set_aside(folder / dataset, when)
            key = "kept_at" if on_change == "keep" else "set_aside_at"
            records[dataset] = [{"inputs": d, "changed": c, key: when} for d, c in zip(stale, changed, strict=True)]
    if refused:
        raise KVBenchError(
            "this run's rows were computed from other inputs than today's (the config is the same; what it reads "
            f"changed): {' | '.join(refused)}. Nothing was changed. To compute them again (the old files are kept "
            "beside them as <file>.stale-<time>), run again with run.changed_inputs=recompute; to keep them and "
            "record that they predate the change, run again with run.changed_inputs=keep"
        )
    return records


def set_aside(folder: Path, when: str) -> None:
    """Rename a dataset folder's result files to ``<name>.stale-<when>`` (nothing deleted; no view reads them)."""
    stamp = when.replace(":", "").replace("+0000", "Z")
    for name in (PREDICTIONS_FILE, METRICS_FILE, TIMINGS_FILE):
        if (folder / name).exists():
            os.replace(folder / name, folder / f"{name}.stale-{stamp}")


def _recorded_run_meta(folder: Path) -> dict[str, Any]:
    try:
        return read_run_meta(folder / RUN_META_FILE) if (folder / RUN_META_FILE).exists() else {}
    except DamagedFile:
        return {}


def _details_of(stale: str, dataset: str, metrics: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any] | None:
    """The recorded details of inputs digest ``stale``: ``metrics.json``'s, or ``run_meta.json``'s for the dataset."""
    for record in (metrics.get("inputs"), (meta.get("inputs") or {}).get(dataset)):
        if isinstance(record, dict) and record.get("digest") == stale:
            return record.get("details")
    return None


def metrics_disagree(
    path: Path, metrics: dict[str, Any], rows: list[dict[str, Any]], dataset: Any, samples: list[Sample]
) -> bool:
    """Whether a finished dataset's ``metrics.json`` (``path``, payload ``metrics``) disagrees with its rows (one per
    sample, in sample order): its score is re-computed by the dataset's scorer and compared, field by field, with
    ``score``, ``scores`` and ``n_samples``; and its ``rows`` record is checked
    (:func:`kvbench.storage.integrity.check_metrics`).  If so, warns naming the file and what differs: the run
    rewrites it from ``predictions.jsonl`` (rows untouched, nothing regenerated)."""
    scores = dataset.score([row["prediction"] for row in rows], samples)
    why = _scores_disagree(metrics, rows, scores)
    problems = ([why] if why else []) + check_metrics(metrics, path.with_name(PREDICTIONS_FILE))[1]
    if not problems:
        return False
    LOG.warning("%s disagrees with its predictions.jsonl (%s): rewriting it from the rows", path, "; ".join(problems))
    return True


def _scores_disagree(metrics: dict[str, Any], rows: list[dict[str, Any]], scores: dict[str, Any]) -> str | None:
    """Why ``metrics`` does not match what its rows score (``scores``), or ``None`` when it does."""
    if metrics.get("n_samples") != len(rows):
        return f"n_samples {metrics.get('n_samples')} != {len(rows)} complete rows in predictions.jsonl"
    recorded = {**(metrics.get("scores") or {}), "score": metrics.get("score")}
    for name, value in scores.items():
        if name in recorded and not _same_number(recorded[name], value):
            return f"{name} {recorded[name]} != {value} computed from predictions.jsonl"
    return None


def _same_number(recorded: Any, computed: Any) -> bool:
    try:
        a, b = float(recorded) if recorded is not None else math.nan, float(computed)
    except (TypeError, ValueError):
        return bool(recorded == computed)
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
