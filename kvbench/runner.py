"""The runner: one model x method x budget x task run, resumable and idempotent.

Order of work (nothing is written under ``results/`` until every input has been validated, the data checked and
the model loaded):

1. validate the config, the environment (model, data folder, packages), method, budget and task kind
   (:mod:`kvbench.validation`);
2. load the tokenizer, build the task's datasets and load and check every sample of every selected dataset, then
   load the model's weights;
3. claim the run folder (:mod:`kvbench.run_folder`): create it and take its lock (``.kvbench.lock``: two processes
   never work in one run folder at once; the second fails clearly, or waits up to ``$KVBENCH_LOCK_WAIT``
   seconds), check that an existing run there has the same config (else refuse, naming the differences and
   ``run.tag``; a folder whose run wrote no prediction is replaced, with a note), write ``config.yaml`` and
   ``run_meta.json``.  If the run fails before the folder holds any prediction, what it wrote is removed again;
4. per dataset: skip it if its ``metrics.json`` exists for this config; otherwise resume ``predictions.jsonl``
   (samples already there are not re-run), append each new prediction as soon as it exists, then score and write
   ``metrics.json`` atomically;
5. print the score table; log to W&B when enabled.

SIGTERM (SLURM preemption or time limit) raises :class:`Interrupted` at once while a sample is being generated,
but never while a prediction row or ``metrics.json`` is being written: those writes finish first.  The run then
records ``status: interrupted`` in ``run_meta.json`` and exits; the same command resumes it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import platform
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import transformers
from omegaconf import DictConfig, OmegaConf

from kvbench import __version__
from kvbench.errors import Interrupted, KVBenchError
from kvbench.generation import generate, last_token_ids
from kvbench.methods.base import RECORDED_KNOBS
from kvbench.models import LoadedModel, load_model, load_tokenizer, resolve_device, stop_token_ids
from kvbench.prompting import encode_sample
from kvbench.results import (
    CONFIG_FILE,
    METRICS_FILE,
    PREDICTIONS_FILE,
    RUN_META_FILE,
    TIMINGS_FILE,
    PredictionLog,
    TimingLog,
    atomic_write_json,
    atomic_write_text,
    holds_results,
    read_json,
    run_dir,
)
from kvbench.run_folder import claim_run_folder
from kvbench.sample_cache import SampleCache
from kvbench.tasks.base import Sample, TaskDataset, build_task
from kvbench.tasks.provenance import stand_in_warnings
from kvbench.validation import check_environment, check_samples, validate

LOG = logging.getLogger(__name__)

#: Config keys that do not change results (excluded from the config hash).
NON_SEMANTIC_KEYS = (
    "wandb",
    "run.progress",
    "run.print_table",
    "run.threads",
    "run.output_root",
    "run.experiment",
    "run.sample_cache",
)


@dataclass
class DatasetResult:
    """One dataset's outcome, for the summary table."""

    dataset: str
    metric: str
    score: float
    n_samples: int
    mean_kept_fraction: float
    skipped: bool


def config_hash(cfg: DictConfig) -> str:
    """SHA-256 (first 16 hex) of the resolved config without the non-semantic keys."""
    container = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(container, dict)
    for dotted in NON_SEMANTIC_KEYS:
        node: Any = container
        *parents, leaf = dotted.split(".")
        for parent in parents:
            node = node.get(parent, {})
        if isinstance(node, dict):
            node.pop(leaf, None)
    blob = json.dumps(container, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def git_commit() -> str | None:
    """The repository's HEAD commit (with ``-dirty`` when there are uncommitted changes), if available."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("-dirty" if dirty else "")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class _Termination:
    """SIGTERM -> :class:`Interrupted`, deferred while a result file is being written (a critical section)."""

    def __init__(self) -> None:
        self.depth = 0
        self.pending: int | None = None
        self.fired = False

    def handler(self, signum: int, frame: Any) -> None:
        if self.fired:  # already stopping (e.g. SLURM signals both the batch shell and the runner): ignore
            return
        if self.depth > 0:
            self.pending = signum
            return
        self.fired = True
        raise Interrupted(f"received signal {signum}")

    @contextmanager
    def critical(self, raise_pending: bool = True) -> Iterator[None]:
        """Writes inside finish even if SIGTERM arrives meanwhile; the signal takes effect right after (unless
        ``raise_pending`` is false: the final bookkeeping write, after which the process exits anyway)."""
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
        if raise_pending and self.depth == 0 and self.pending is not None and not self.fired:
            signum, self.pending = self.pending, None
            self.fired = True
            raise Interrupted(f"received signal {signum}")


#: The active SIGTERM policy (a no-op critical section when no run is in progress).
_TERMINATION = _Termination()


@contextmanager
def _graceful_termination() -> Iterator[None]:
    """Turn SIGTERM (SLURM preemption/time limit) into :class:`Interrupted`, never in the middle of a write."""
    previous = signal.signal(signal.SIGTERM, _TERMINATION.handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        _TERMINATION.pending = None
        _TERMINATION.fired = False


def _check_existing_run(folder: Path, cfg_hash: str, cfg: DictConfig, note_replacement: bool = True) -> None:
    """Refuse to mix two different configs in one results folder (one whose run wrote no prediction is replaced)."""
    meta_path = folder / RUN_META_FILE
    if not meta_path.exists():
        return
    existing = read_json(meta_path).get("config_hash")
    if existing and existing != cfg_hash and not holds_results(folder):
        if not note_replacement:
            return
        print(
            f"note: {folder} held a run with another config (hash {existing}) that stopped before writing any "
            "prediction; this run replaces it.",
            file=sys.stderr,
        )
        return
    if existing and existing != cfg_hash:
        old_cfg = OmegaConf.load(folder / CONFIG_FILE) if (folder / CONFIG_FILE).exists() else OmegaConf.create()
        diffs = _config_diff(
            OmegaConf.to_container(old_cfg, resolve=True), OmegaConf.to_container(cfg, resolve=True), prefix=""
        )
        shown = "; ".join(diffs[:8]) + (" ..." if len(diffs) > 8 else "")
        raise KVBenchError(
            f"{folder} already holds a run with a different config (hash {existing} != {cfg_hash}): {shown}. "
            "Nothing was changed. Pass run.tag=<name> to store this variant separately, or remove that folder."
        )


def _config_diff(old: Any, new: Any, prefix: str) -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        diffs = []
        for key in sorted(set(old) | set(new)):
            if f"{prefix}{key}" in NON_SEMANTIC_KEYS or (key == "wandb" and not prefix):
                continue
            diffs += _config_diff(old.get(key), new.get(key), f"{prefix}{key}.")
        return diffs
    return [] if old == new else [f"{prefix.rstrip('.')}: {old!r} -> {new!r}"]


def _prediction_row(sample: Sample, dataset: TaskDataset, output: Any, encoded: Any) -> dict[str, Any]:
    record = output.record
    return {
        "id": sample.id,
        "prompt_sha256": sample.prompt_sha256(),
        "prediction": dataset.postprocess(output.text),
        "raw_prediction": output.text,
        "answers": list(sample.answers),
        "all_classes": sample.all_classes,
        "length": sample.length,
        "extra": sample.extra,
        "input_tokens": len(encoded.input_ids),
        "context_tokens": len(encoded.context_ids),
        "question_tokens": len(encoded.question_ids),
        "truncated": encoded.truncated,
        "question_lost": encoded.question_lost,
        "new_tokens": len(output.token_ids),
        "stop_reason": output.stop_reason,
        "cache": record.to_json(),
    }


def _cache_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
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
        "mean_cache_bytes": round(sum(r["cache"]["cache_bytes"] for r in rows) / len(rows), 1),
        "budget_exact": bool(torch.equal(requested, achieved)),
        # Every head kept what the method allocated it (Ada-KV's per-head rounding may drift from the layer budget).
        "allocation_exact": all(r["cache"]["requested_per_head"] == r["cache"]["achieved_per_head"] for r in rows),
        "samples_evicted": sum(1 for r in rows if r["cache"]["evicted"]),
    }


class Runner:
    """Runs one configuration end to end (see module docstring)."""

    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg
        self.method, self.budget = validate(cfg)
        check_environment(cfg)
        resolve_device(str(cfg.model.device))
        self.cfg_hash = config_hash(cfg)
        self.folder = run_dir(
            cfg.run.output_root, cfg.model.name, cfg.task.name, cfg.method.name, cfg.budget.name, cfg.run.tag
        )

    def run(self) -> list[DatasetResult]:
        """Execute the run; returns one result per dataset."""
        cfg = self.cfg
        if cfg.run.threads:
            torch.set_num_threads(int(cfg.run.threads))
        torch.manual_seed(int(cfg.seed))
        _check_existing_run(self.folder, self.cfg_hash, cfg, note_replacement=False)
        tokenizer = load_tokenizer(cfg.model)
        data = self._load_data(tokenizer)  # every sample checked before the weights load
        loaded = load_model(cfg.model, seed=int(cfg.seed), tokenizer=tokenizer)
        with claim_run_folder(self.folder):
            # Checked again under the lock: another job may have started this folder since the first check.
            _check_existing_run(self.folder, self.cfg_hash, cfg)
            meta = self._write_run_files()
            logger = _wandb_logger(cfg)
            results: list[DatasetResult] = []
            status = "failed"
            with _graceful_termination():
                try:
                    for dataset, samples in data:
                        results.append(self._run_dataset(loaded, dataset, samples))
                    status = "complete"
                except Interrupted:
                    status = "interrupted"
                    if logger is not None:
                        logger.abort(exit_code=143)
                    raise
                except BaseException:
                    if logger is not None:
                        logger.abort()
                    raise
                finally:
                    with _TERMINATION.critical(raise_pending=False):
                        meta["end_time"] = _now()
                        meta["status"] = status
                        meta["completed_datasets"] = [r.dataset for r in results]
                        if status == "complete":
                            meta["datasets"] = [r.dataset for r in results]
                        atomic_write_json(self.folder / RUN_META_FILE, meta)
        if logger is not None:
            logger.log_results(results)
        if cfg.run.print_table:
            print(format_table(cfg, results, self.folder))
        return results

    def _load_data(self, tokenizer: Any) -> list[tuple[TaskDataset, list[Sample]]]:
        """Build the task's datasets and load every sample of each (the first ``task.num_samples``), checked.

        Loading reads and validates every line of every selected dataset, so a missing file, a corrupt line or an
        empty dataset fails here, before the model's weights load and before anything is written.
        """
        cfg = self.cfg
        data = []
        try:
            cache = sample_cache(cfg)
            for dataset in build_task(cfg.task, tokenizer, chat_template=bool(cfg.model.chat_template)):
                dataset.sample_cache = cache
                samples = list(dataset.samples())
                if cfg.task.num_samples is not None:
                    samples = samples[: int(cfg.task.num_samples)]
                check_samples(dataset.name, samples, str(getattr(dataset, "source", f"task={cfg.task.name}")))
                data.append((dataset, samples))
        except (ValueError, OSError, ImportError, RuntimeError) as err:
            raise KVBenchError(f"task={cfg.task.name}: cannot load its data: {err}") from err
        return data

    def _write_run_files(self) -> dict[str, Any]:
        cfg = self.cfg
        atomic_write_text(self.folder / CONFIG_FILE, OmegaConf.to_yaml(cfg, resolve=True))
        meta_path = self.folder / RUN_META_FILE
        meta = read_json(meta_path) if meta_path.exists() else {}
        if meta.get("config_hash") != self.cfg_hash:  # a replaced run that wrote nothing: start afresh
            meta = {}
        meta.update(
            {
                "config_hash": self.cfg_hash,
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
                "device": _device_name(cfg.model.device),
                "hostname": platform.node(),
                "command": sys.argv,
                "start_time": _now(),
                "end_time": None,
                "status": "running",
                "slurm_job": _slurm_job_id(),
            }
        )
        meta.setdefault("first_start_time", meta["start_time"])
        atomic_write_json(meta_path, meta)
        return meta

    def _run_dataset(self, loaded: LoadedModel, dataset: TaskDataset, samples: list[Sample]) -> DatasetResult:
        cfg = self.cfg
        folder = self.folder / dataset.name
        metrics_path = folder / METRICS_FILE
        if metrics_path.exists():
            existing = read_json(metrics_path)
            if existing.get("config_hash") == self.cfg_hash:
                return DatasetResult(
                    dataset.name,
                    existing["metric"],
                    existing["score"],
                    existing["n_samples"],
                    existing.get("cache", {}).get("mean_kept_fraction", 1.0),
                    skipped=True,
                )
        if hasattr(dataset, "evaluate"):  # a dataset with its own evaluation loop (lm-eval tasks: kvbench/lmeval)
            return dataset.evaluate(self, loaded, samples)
        provenance = dataset.provenance()
        for warning in stand_in_warnings(dataset.name, provenance):
            LOG.warning(warning)
        log = PredictionLog(folder / PREDICTIONS_FILE)
        done = {row["id"]: row for row in log.load()}
        timing_log = TimingLog(folder / TIMINGS_FILE)
        _check_resumable(log.path, done, samples)
        use_template = bool(cfg.model.chat_template and dataset.chat_template)
        stops = stop_token_ids(loaded.tokenizer, loaded.model, list(cfg.model.stop_tokens))
        stops |= last_token_ids(loaded.tokenizer, dataset.stop_token_texts)
        # Stateful allocators (XKV's sampled mode) calibrate per dataset; a resumed run replays what the finished
        # samples recorded (dataset order), so it continues exactly as the uninterrupted run would.
        self.method.layer_allocator.begin_task(dataset.name, len(samples))
        finished = [done[s.id]["cache"].get("allocator_state") for s in samples if s.id in done]
        self.method.layer_allocator.replay(finished)
        todo = [s for s in samples if s.id not in done]
        progress = _progress(todo, f"{dataset.name}", cfg.run.progress, initial=len(done), total=len(samples))
        for sample in progress:
            encoded = encode_sample(
                loaded.tokenizer,
                sample,
                max_input_length=int(cfg.model.max_input_length),
                use_chat_template=use_template,
                truncation=dataset.truncation,
            )
            output = generate(
                loaded.model,
                loaded.tokenizer,
                encoded.context_ids,
                encoded.question_ids,
                method=self.method,
                budget=self.budget,
                question_mode=str(cfg.task.question_mode),
                max_new_tokens=int(dataset.max_new_tokens),
                stop_token_ids=stops,
                stop_strings=tuple(dataset.stop_strings),
                min_new_tokens=int(dataset.min_new_tokens),
                prefill_chunk=cfg.run.prefill_chunk,
            )
            row = _prediction_row(sample, dataset, output, encoded)
            with _TERMINATION.critical():
                log.append(row)
                timing_log.append({"id": sample.id, "prefill_s": output.prefill_s, "decode_s": output.decode_s})
                done[sample.id] = row
        rows = [done[s.id] for s in samples]
        scores = dataset.score([r["prediction"] for r in rows], samples)
        metrics = {
            "model": cfg.model.name,
            "task": cfg.task.name,
            "dataset": dataset.name,
            "method": cfg.method.name,
            "budget": cfg.budget.name,
            "tag": cfg.run.tag,
            "metric": dataset.metric_name,
            "score": float(scores["score"]),
            "scores": {k: _json_number(v) for k, v in scores.items()},
            "n_samples": len(rows),
            "config_hash": self.cfg_hash,
            "question_mode": cfg.task.question_mode,
            "dataset_settings": dataset.describe(),
            "data_provenance": provenance,
            "cache": _cache_summary(rows),
            "settings": {
                "method_family": cfg.method.family,
                "budget_spec": cfg.budget.spec,
                **{knob: cfg.method[knob] for knob in RECORDED_KNOBS if knob not in self.method.ignored_knobs},
                "params": OmegaConf.to_container(cfg.method.params, resolve=True),
                "resolved": dict(self.method.settings),
                "reference": OmegaConf.to_container(cfg.method.reference, resolve=True),
                "max_input_length": cfg.model.max_input_length,
                "chat_template": use_template,
                "dtype": cfg.model.dtype,
            },
            "timing": timing_log.summary(),
        }
        with _TERMINATION.critical():
            dataset.write_report(
                [r["prediction"] for r in rows],
                samples,
                folder,
                f"{cfg.model.name} {cfg.method.name} {cfg.budget.name} {dataset.name}",
            )
            atomic_write_json(metrics_path, metrics)
        return DatasetResult(
            dataset.name,
            dataset.metric_name,
            metrics["score"],
            len(rows),
            metrics["cache"].get("mean_kept_fraction", 1.0),
            skipped=False,
        )


def sample_cache(cfg: DictConfig) -> SampleCache | None:
    """The folder generated samples are stored in (``run.sample_cache``: ``auto`` = ``<run.output_root>/../samples``,
    a path, or null to regenerate in every run)."""
    setting = cfg.run.get("sample_cache", "auto")
    if setting is None:
        return None
    root = Path(cfg.run.output_root).parent / "samples" if setting == "auto" else Path(str(setting))
    return SampleCache(root)


def _check_resumable(path: Path, done: dict[str, dict[str, Any]], samples: list[Sample]) -> None:
    """Rows already in ``predictions.jsonl`` must belong to this dataset's samples, with the same prompt (rows
    written before prompt hashes were recorded are accepted by id)."""
    by_id = {sample.id: sample for sample in samples}
    stale = sorted(set(done) - set(by_id))
    if stale:
        raise KVBenchError(
            f"{path} holds predictions for samples not in this dataset ({stale[:3]}...); "
            "the task definition changed: remove the folder or use run.tag"
        )
    changed = sorted(
        sample_id
        for sample_id, row in done.items()
        if row.get("prompt_sha256") is not None and row["prompt_sha256"] != by_id[sample_id].prompt_sha256()
    )
    if changed:
        raise KVBenchError(
            f"{path} holds predictions made from different prompts for {len(changed)} sample(s) ({changed[:3]}...): "
            "the task data, generator or tokenizer changed since they were written. Nothing was changed; remove the "
            "folder to rerun, or use run.tag"
        )


def _json_number(value: Any) -> float | None:
    """A score as strict JSON: NaN (e.g. an empty LongBench-E bucket) becomes null."""
    number = float(value)
    return None if math.isnan(number) else number


def _progress(items: list[Sample], desc: str, enabled: bool, initial: int, total: int) -> Any:
    if not enabled:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, initial=initial, total=total, leave=False, dynamic_ncols=True, file=sys.stderr)


def _slurm_job_id() -> str | None:
    """``<array job>_<task>`` (or the plain job id) when running under SLURM."""
    array_job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array_job and task:
        return f"{array_job}_{task}"
    return os.environ.get("SLURM_JOB_ID")


def _device_name(spec: str) -> str:
    if torch.cuda.is_available() and spec != "cpu":
        return torch.cuda.get_device_name(0)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def format_table(cfg: DictConfig, results: list[DatasetResult], folder: Path) -> str:
    """A plain-text score table for the terminal."""
    title = (
        f"model={cfg.model.name} task={cfg.task.name} method={cfg.method.name} budget={budget_label(cfg)} "
        f"question_mode={cfg.task.question_mode}" + (f" tag={cfg.run.tag}" if cfg.run.tag else "")
    )
    width = max([len("dataset"), *(len(r.dataset) for r in results)])
    lines = [title, f"{'dataset':<{width}}  {'metric':<18} {'score':>7} {'n':>4} {'kept':>6}"]
    for r in results:
        note = " (cached)" if r.skipped else ""
        lines.append(
            f"{r.dataset:<{width}}  {r.metric:<18} {r.score:7.2f} {r.n_samples:4d} {r.mean_kept_fraction:6.1%}{note}"
        )
    if results:
        mean = sum(r.score for r in results) / len(results)
        lines.append(f"{'average':<{width}}  {'':<18} {mean:7.2f}")
    lines.append(f"results: {folder}")
    return "\n".join(lines)


def budget_label(cfg: DictConfig) -> str:
    """The budget as run (``budget.spec``), with the preset's name when it differs (``96L (preset 128L)``)."""
    spec, name = str(cfg.budget.spec), str(cfg.budget.name)
    return spec if spec == name else f"{spec} (preset {name})"


def _wandb_logger(cfg: DictConfig) -> Any:
    from kvbench.wandb_logging import WandbLogger

    return WandbLogger.create(cfg)
