"""The runner: one model x method x budget x task run, resumable and idempotent.

Order of work (nothing is written under ``results/`` until every input has been validated and the model and
task have loaded):

1. validate method, budget, task kind and knobs;
2. load the model and build the task's datasets;
3. create the run folder and take its lock (``.kvbench.lock``: two processes never work in one run folder at
   once; the second fails clearly, or waits up to ``$KVBENCH_LOCK_WAIT`` seconds), check that an existing run
   there has the same config (else refuse, naming the differences and ``run.tag``), write ``config.yaml`` and
   ``run_meta.json``;
4. per dataset: skip it if its ``metrics.json`` exists for this config; otherwise resume ``predictions.jsonl``
   (samples already there are not re-run), append each new prediction as soon as it exists, then score and write
   ``metrics.json`` atomically;
5. print the score table; log to W&B when enabled.

SIGTERM (SLURM preemption or time limit) raises :class:`Interrupted` at once while a sample is being generated,
but never while a prediction row or ``metrics.json`` is being written: those writes finish first.  The run then
records ``status: interrupted`` in ``run_meta.json`` and exits; the same command resumes it.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
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
from kvbench.budget import Budget, BudgetError, parse_budget
from kvbench.errors import KVBenchError
from kvbench.generation import QUESTION_MODES, generate
from kvbench.methods.base import RECORDED_KNOBS, EvictionMethod, build_method
from kvbench.models import LoadedModel, load_model, stop_token_ids, validate_model_config
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
    read_json,
    run_dir,
)
from kvbench.tasks.base import Sample, TaskDataset, build_task, task_kinds

#: Config keys that do not change results (excluded from the config hash).
NON_SEMANTIC_KEYS = ("wandb", "run.progress", "run.print_table", "run.threads", "run.output_root", "run.experiment")


@dataclass
class DatasetResult:
    """One dataset's outcome, for the summary table."""

    dataset: str
    metric: str
    score: float
    n_samples: int
    mean_kept_fraction: float
    skipped: bool


class Interrupted(Exception):
    """SIGTERM/SIGINT received: predictions written so far are kept; the run can be resumed."""


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


def validate(cfg: DictConfig) -> tuple[EvictionMethod, Budget]:
    """All checks that need no model; raises :class:`KVBenchError` with the valid choices."""
    try:
        method = build_method(cfg.method)
    except ValueError as err:
        raise KVBenchError(str(err)) from err
    try:
        budget = parse_budget(cfg.budget.spec)
    except BudgetError as err:
        raise KVBenchError(str(err)) from err
    kinds = task_kinds()
    if cfg.task.kind not in kinds:
        raise KVBenchError(f"unknown task kind {cfg.task.kind!r}; valid kinds: {', '.join(kinds)}")
    if cfg.task.question_mode not in QUESTION_MODES:
        raise KVBenchError(f"task.question_mode={cfg.task.question_mode!r}; valid: {', '.join(QUESTION_MODES)}")
    if cfg.task.num_samples is not None and cfg.task.num_samples < 1:
        raise KVBenchError(f"task.num_samples must be >= 1 or null, got {cfg.task.num_samples}")
    validate_model_config(cfg.model)
    return method, budget


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


LOCK_FILE = ".kvbench.lock"


@contextmanager
def run_folder_lock(folder: Path, wait_s: float | None = None) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``folder/.kvbench.lock`` (released when the process ends, even if killed).

    A second process for the same run folder fails with :class:`KVBenchError` naming the holder, after waiting up
    to ``wait_s`` seconds (default ``$KVBENCH_LOCK_WAIT``, else 0).
    """
    if wait_s is None:
        wait_s = float(os.environ.get("KVBENCH_LOCK_WAIT", "0") or 0)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as err:
                if err.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
                if time.monotonic() >= deadline:
                    holder = path.read_text(encoding="utf-8", errors="replace").strip() or "unknown process"
                    raise KVBenchError(
                        f"{folder} is in use by another kvbench process ({holder}); nothing was changed. "
                        "Two jobs with the same model/task/method/budget/tag cannot run at once: wait for it, "
                        "set KVBENCH_LOCK_WAIT=<seconds> to wait, or use run.tag=<name>."
                    ) from None
                time.sleep(min(1.0, max(0.05, deadline - time.monotonic())))
        job = os.environ.get("SLURM_JOB_ID")
        holder = f"pid {os.getpid()} on {platform.node()}" + (f", SLURM job {job}" if job else "") + f", since {_now()}"
        os.ftruncate(fd, 0)
        os.pwrite(fd, (holder + "\n").encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def _check_existing_run(folder: Path, cfg_hash: str, cfg: DictConfig) -> None:
    """Refuse to mix two different configs in one results folder."""
    meta_path = folder / RUN_META_FILE
    if not meta_path.exists():
        return
    existing = read_json(meta_path).get("config_hash")
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
        _check_existing_run(self.folder, self.cfg_hash, cfg)
        loaded = load_model(cfg.model, seed=int(cfg.seed))
        try:
            datasets = build_task(cfg.task, loaded.tokenizer)
        except (ValueError, FileNotFoundError) as err:
            raise KVBenchError(str(err)) from err
        with run_folder_lock(self.folder):
            # Checked again under the lock: another job may have started this folder since the first check.
            _check_existing_run(self.folder, self.cfg_hash, cfg)
            meta = self._write_run_files()
            logger = _wandb_logger(cfg)
            results: list[DatasetResult] = []
            status = "failed"
            with _graceful_termination():
                try:
                    for dataset in datasets:
                        results.append(self._run_dataset(loaded, dataset))
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

    def _write_run_files(self) -> dict[str, Any]:
        cfg = self.cfg
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.folder / CONFIG_FILE, OmegaConf.to_yaml(cfg, resolve=True))
        meta_path = self.folder / RUN_META_FILE
        meta = read_json(meta_path) if meta_path.exists() else {}
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

    def _run_dataset(self, loaded: LoadedModel, dataset: TaskDataset) -> DatasetResult:
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
        samples = list(dataset.samples())
        if cfg.task.num_samples is not None:
            samples = samples[: int(cfg.task.num_samples)]
        ids = [s.id for s in samples]
        if len(set(ids)) != len(ids):
            raise KVBenchError(f"dataset {dataset.name!r} has duplicate sample ids")
        log = PredictionLog(folder / PREDICTIONS_FILE)
        done = {row["id"]: row for row in log.load()}
        timing_log = TimingLog(folder / TIMINGS_FILE)
        stale = sorted(set(done) - set(ids))
        if stale:
            raise KVBenchError(
                f"{log.path} holds predictions for samples not in this dataset ({stale[:3]}...); "
                "the task definition changed: remove the folder or use run.tag"
            )
        use_template = bool(cfg.model.chat_template and dataset.chat_template)
        stops = stop_token_ids(loaded.tokenizer, loaded.model, list(cfg.model.stop_tokens))
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
        f"model={cfg.model.name} task={cfg.task.name} method={cfg.method.name} budget={cfg.budget.name} "
        f"question_mode={cfg.task.question_mode}"
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


def _wandb_logger(cfg: DictConfig) -> Any:
    from kvbench.wandb_logging import WandbLogger

    return WandbLogger.create(cfg)
