"""The runner: one model x method x budget x task run, resumable and idempotent.

Order of work (nothing is written under ``results/`` until every input has been validated, the data checked and
the model loaded):

1. validate the config, the environment (model, data folder, packages, results root, and that no other process
   holds the run folder), method, budget and task kind (:mod:`kvbench.validation`);
2. load the tokenizer, build the task's datasets and load and check every sample of every selected dataset, then
   load the model's weights;
3. claim the run folder (:mod:`kvbench.run_folder`): create it and take its lock (``.kvbench.lock``: two processes
   never work in one run folder at once; the second fails clearly, or waits up to ``$KVBENCH_LOCK_WAIT``
   seconds), check that an existing run there has the same config (else refuse, naming the differences and
   ``run.tag``; a folder whose run wrote no prediction is replaced, with a note), write ``config.yaml`` and
   ``run_meta.json``.  If the run fails before the folder holds any prediction, what it wrote is removed again;
4. per dataset: skip it if its ``metrics.json`` exists for this config and sample count; report on the first N
   without writing when it covers more samples (``task.num_samples`` is the run's extent, not its identity);
   otherwise resume ``predictions.jsonl``
   (samples already there are not re-run), append each new prediction as soon as it exists, then score and write
   ``metrics.json`` atomically;
5. write the run's ``summary.json`` (:mod:`kvbench.summary`: scores with bootstrap 95 % intervals, the papers'
   averages, kept fraction, timings, provenance), print the score table with the intervals; log to W&B when
   enabled.

A progress bar (``run.progress``) covers step 2's sample preparation (dataset by dataset: RULER/NeedleBench
generation, LongBench loading) and step 4's inference (sample by sample).  :func:`kvbench.evaluate` runs this same
runner on a model the caller loaded (``Runner(cfg, loaded=...)``).

SIGTERM (SLURM preemption or time limit) raises :class:`Interrupted` at once while a sample is being generated,
but never while a prediction row or ``metrics.json`` is being written: those writes finish first.  The run then
records ``status: interrupted`` in ``run_meta.json`` and exits; the same command resumes it.

Size: over 500 lines because the five steps above are one run's lifecycle, read in order in :class:`Runner`; the
parts with a job of their own already live elsewhere (validation, run folder, results writers, sample cache, W&B).
The score table and run summary are the next seam if it grows.
"""

from __future__ import annotations

import logging
import math
import os
import platform
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import transformers
from omegaconf import DictConfig, OmegaConf

from kvbench import __version__
from kvbench.attention_paths import ATTENTION_RECORD, capability_summary
from kvbench.errors import Interrupted, KVBenchError
from kvbench.generation import generate, last_token_ids
from kvbench.methods.base import RECORDED_KNOBS
from kvbench.models import LoadedModel, check_device_map, load_model, load_tokenizer, resolve_device, stop_token_ids
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
    config_differences,
    config_hash,
    holds_results,
    read_json,
    run_dir,
    same_run,
)
from kvbench.run_folder import claim_run_folder
from kvbench.sample_cache import SampleCache
from kvbench.summary import SUMMARY_FILE, DatasetScores, build_summary, interval_of, sample_scores
from kvbench.tasks.base import Sample, TaskDataset, build_task
from kvbench.tasks.provenance import stand_in_warnings
from kvbench.validation import check_environment, check_samples, validate

LOG = logging.getLogger(__name__)


@dataclass
class DatasetResult:
    """One dataset's outcome, for the summary table (``interval``: bootstrap 95 % interval of the score, ``None``
    when the score is not a mean over samples; ``details``: what :mod:`kvbench.summary` reads)."""

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


def git_commit() -> str | None:
    """The repository's HEAD commit (with ``-dirty`` when there are uncommitted changes), if available; None for an
    installed wheel (``kvbench_version`` identifies that code; never the commit of a repository it sits in)."""
    from kvbench.resources import checkout_dir

    root = checkout_dir()
    if root is None:
        return None
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


def _with_folder_extent(folder: Path, cfg: DictConfig) -> DictConfig:
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


def _check_existing_run(folder: Path, cfg_hash: str, cfg: DictConfig, note_replacement: bool = True) -> None:
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
        # Memory beside accuracy: stored bytes / the full cache's bytes for the same tokens (> 1: query-head storage).
        "mean_stored_vs_full": round(
            sum(r["cache"]["cache_bytes"] / max(r["cache"].get("full_cache_bytes", 0), 1) for r in rows) / len(rows), 4
        )
        if all(r["cache"].get("full_cache_bytes") for r in rows)
        else None,
        "samples_exceeding_full_cache": sum(1 for r in rows if r["cache"].get("exceeds_full_cache")),
        "budget_exact": bool(torch.equal(requested, achieved)),
        # Every head kept what the method allocated it (Ada-KV's per-head rounding may drift from the layer budget).
        "allocation_exact": all(r["cache"]["requested_per_head"] == r["cache"]["achieved_per_head"] for r in rows),
        "samples_evicted": sum(1 for r in rows if r["cache"]["evicted"]),
    }


_WARNED_ABOVE_FULL: set[str] = set()


def _warn_if_above_full(record: Any, cfg: DictConfig) -> None:
    """One warning per run (method x budget x model) when the stored cache exceeds the full cache's size."""
    key = f"{cfg.model.name}/{cfg.method.name}/{cfg.budget.name}"
    if record.exceeds_full_cache and key not in _WARNED_ABOVE_FULL:
        _WARNED_ABOVE_FULL.add(key)
        LOG.warning(
            "%s stores %d heads per layer (gqa_granularity=query_head, %d KV heads): its cache (%d bytes) exceeds "
            "the full cache's (%d bytes) at budget %s; method.gqa_granularity=kv_head stores one per KV head",
            cfg.method.name,
            record.stored_heads,
            record.kv_heads,
            record.cache_bytes,
            record.full_cache_bytes,
            cfg.budget.name,
        )


class Runner:
    """Runs one configuration end to end (see module docstring)."""

    def __init__(self, cfg: DictConfig, loaded: LoadedModel | None = None) -> None:
        """``loaded``: a model and tokenizer the caller loaded (:func:`kvbench.evaluate`), used instead of loading
        ``cfg.model``'s weights (whose ``path`` is then provenance only, not checked)."""
        self.cfg = cfg
        self.loaded = loaded
        self.method, self.budget = validate(cfg)
        check_environment(cfg, check_model=loaded is None)
        if loaded is None and check_device_map(cfg.model.get("device_map")) is None:
            resolve_device(str(cfg.model.device))
        self.cfg_hash = config_hash(cfg)
        self.folder = run_dir(
            cfg.run.output_root, cfg.model.name, cfg.task.name, cfg.method.name, cfg.budget.name, cfg.run.tag
        )
        #: The run's ``summary.json`` payload, once :meth:`run` completed.
        self.summary: dict[str, Any] = {}
        #: Paged-attention fallbacks (reason -> calls) of the datasets run so far (``run_meta.json``).
        self.attention_fallbacks: Counter[str] = Counter()

    def run(self) -> list[DatasetResult]:
        """Execute the run; returns one result per dataset."""
        cfg = self.cfg
        if cfg.run.threads:
            torch.set_num_threads(int(cfg.run.threads))
        torch.manual_seed(int(cfg.seed))
        _check_existing_run(self.folder, self.cfg_hash, cfg, note_replacement=False)
        tokenizer = self.loaded.tokenizer if self.loaded else load_tokenizer(cfg.model)
        data = self._load_data(tokenizer)  # every sample checked before the weights load
        loaded = self.loaded or load_model(cfg.model, seed=int(cfg.seed), tokenizer=tokenizer)
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
                        meta["attention_fallbacks"] = dict(sorted(self.attention_fallbacks.items()))
                        if status == "complete":
                            meta["datasets"] = [r.dataset for r in results]
                        atomic_write_json(self.folder / RUN_META_FILE, meta)
                        if status == "complete":
                            self.summary = self._write_summary(meta, results)
        if logger is not None:
            logger.log_results(results)
        if cfg.run.print_table:
            print(format_table(cfg, results, self.folder, self.summary))
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
            datasets = build_task(cfg.task, tokenizer, chat_template=bool(cfg.model.chat_template))
            # Shown once preparing takes a second (RULER/NeedleBench generation, LongBench loading): instant
            # preparation and its errors print nothing but the error.
            bar = _progress(datasets, f"preparing {cfg.task.name}", cfg.run.progress, 0, len(datasets), delay=1.0)
            try:
                for dataset in bar:
                    if hasattr(bar, "set_postfix_str"):
                        bar.set_postfix_str(dataset.name, refresh=False)
                    dataset.sample_cache = cache
                    samples = list(dataset.samples())
                    if cfg.task.num_samples is not None:
                        samples = samples[: int(cfg.task.num_samples)]
                    check_samples(dataset.name, samples, str(getattr(dataset, "source", f"task={cfg.task.name}")))
                    data.append((dataset, samples))
            finally:
                if hasattr(bar, "close"):
                    bar.close()  # clears the line (leave=False) before an error is printed
        except (ValueError, OSError, ImportError, RuntimeError) as err:
            raise KVBenchError(f"task={cfg.task.name}: cannot load its data: {err}") from err
        return data

    def _write_run_files(self) -> dict[str, Any]:
        cfg = self.cfg
        atomic_write_text(
            self.folder / CONFIG_FILE, OmegaConf.to_yaml(_with_folder_extent(self.folder, cfg), resolve=True)
        )
        meta_path = self.folder / RUN_META_FILE
        meta = read_json(meta_path) if meta_path.exists() else {}
        if not same_run(self.folder, meta.get("config_hash"), cfg, self.cfg_hash):  # a replaced run: start afresh
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
                "device_map": OmegaConf.to_container(cfg.model.device_map)
                if isinstance(cfg.model.get("device_map"), DictConfig)
                else cfg.model.get("device_map"),
                "hostname": platform.node(),
                "command": sys.argv,
                "start_time": _now(),
                "end_time": None,
                "status": "running",
                "slurm_job": _slurm_job_id(),
                "attention_capability": capability_summary(),
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
            same_extent = existing.get("n_samples") == len(samples)
            if existing.get("config_hash") == self.cfg_hash and same_extent:
                if hasattr(dataset, "evaluate"):  # lm-eval's scores: no per-sample kvbench predictions to resample
                    kept = existing.get("cache", {}).get("mean_kept_fraction", 1.0)
                    return DatasetResult(
                        dataset.name, existing["metric"], existing["score"], existing["n_samples"], kept, skipped=True
                    )
                rows = {row["id"]: row for row in PredictionLog(folder / PREDICTIONS_FILE).load()}
                return self._dataset_result(dataset, samples, [rows.get(s.id) for s in samples], existing, True)
            if existing.get("config_hash") == self.cfg_hash and len(samples) < int(existing.get("n_samples", 0)):
                report = self._report_on_first(dataset, samples, existing)
                if report is not None:
                    return report
        if hasattr(dataset, "evaluate"):  # a dataset with its own evaluation loop (lm-eval tasks: kvbench/lmeval)
            return dataset.evaluate(self, loaded, samples)
        provenance = dataset.provenance()
        for warning in stand_in_warnings(dataset.name, provenance):
            LOG.warning(warning)
        log = PredictionLog(folder / PREDICTIONS_FILE)
        done = {row["id"]: row for row in log.load()}
        timing_log = TimingLog(folder / TIMINGS_FILE)
        # Rows past the requested extent (an earlier run asked for more samples) stay in the log, unscored.
        truncated = cfg.task.num_samples is not None and len(samples) == int(cfg.task.num_samples)
        _check_resumable(log.path, done, samples, beyond_extent_ok=truncated)
        done = {sample.id: done[sample.id] for sample in samples if sample.id in done}
        use_template = bool(cfg.model.chat_template and dataset.chat_template)
        stops = stop_token_ids(loaded.tokenizer, loaded.model, list(cfg.model.stop_tokens))
        stops |= last_token_ids(loaded.tokenizer, dataset.stop_token_texts)
        # Stateful allocators (XKV's sampled mode) calibrate per dataset; a resumed run replays what the finished
        # samples recorded (dataset order), so it continues exactly as the uninterrupted run would.
        self.method.layer_allocator.begin_task(dataset.name, len(samples))
        finished = [done[s.id]["cache"].get("allocator_state") for s in samples if s.id in done]
        self.method.layer_allocator.replay(finished)
        todo = [s for s in samples if s.id not in done]
        ATTENTION_RECORD.reset()  # paths and fallbacks of this dataset's samples (metrics.json "attention")
        progress = _progress(todo, f"{dataset.name}", cfg.run.progress, initial=len(done), total=len(samples))
        for sample in progress:
            encoded = encode_sample(
                loaded.tokenizer,
                sample,
                max_input_length=int(cfg.model.max_input_length),
                use_chat_template=use_template,
                truncation=dataset.truncation,
                bos=dataset.bos,
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
            _warn_if_above_full(output.record, self.cfg)
            with _TERMINATION.critical():
                log.append(row)
                timing_log.append({"id": sample.id, "prefill_s": output.prefill_s, "decode_s": output.decode_s})
                done[sample.id] = row
        rows = [done[s.id] for s in samples]
        attention = ATTENTION_RECORD.summary()
        self.attention_fallbacks.update(attention["fallbacks"])
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
            "num_samples_requested": cfg.task.num_samples,
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
            "attention": attention,
        }
        with _TERMINATION.critical():
            dataset.write_report(
                [r["prediction"] for r in rows],
                samples,
                folder,
                f"{cfg.model.name} {cfg.method.name} {cfg.budget.name} {dataset.name}",
            )
            atomic_write_json(metrics_path, metrics)
        return self._dataset_result(dataset, samples, rows, metrics, False)

    def _report_on_first(
        self, dataset: TaskDataset, samples: list[Sample], metrics: dict[str, Any]
    ) -> DatasetResult | None:
        """The scores of the first ``len(samples)`` samples of a dataset whose ``metrics.json`` covers more (a run
        asked for fewer samples than its folder holds), computed from ``predictions.jsonl`` and written nowhere:
        nothing is deleted or overwritten.  ``None`` when a requested sample has no prediction yet."""
        by_id = {row["id"]: row for row in PredictionLog(self.folder / dataset.name / PREDICTIONS_FILE).load()}
        rows = [by_id.get(sample.id) for sample in samples]
        if any(row is None for row in rows):
            return None
        kept_rows = [row for row in rows if row is not None]
        _check_resumable(self.folder / dataset.name / PREDICTIONS_FILE, by_id, samples, beyond_extent_ok=True)
        scores = dataset.score([row["prediction"] for row in kept_rows], samples)
        LOG.info(
            "%s: reporting on the first %d of the %d samples in %s",
            dataset.name,
            len(samples),
            metrics["n_samples"],
            self.folder,
        )
        view = {
            **metrics,
            "score": float(scores["score"]),
            "n_samples": len(kept_rows),
            "cache": _cache_summary(kept_rows),
        }
        result = self._dataset_result(dataset, samples, rows, view, skipped=True)
        result.first_of = int(metrics["n_samples"])
        return result

    def _dataset_result(
        self,
        dataset: TaskDataset,
        samples: list[Sample],
        rows: list[dict[str, Any] | None],
        metrics: dict[str, Any],
        skipped: bool,
    ) -> DatasetResult:
        """A dataset's result from its ``metrics.json`` payload and prediction rows, with the per-sample scores and
        the bootstrap interval (:mod:`kvbench.summary`)."""
        score = float(metrics["score"]) if metrics.get("score") is not None else math.nan
        if all(row is not None for row in rows):
            predictions = [row["prediction"] for row in rows if row is not None]
            per_sample, why = sample_scores(dataset.score, predictions, samples, score)
        else:
            per_sample, why = None, "predictions.jsonl lacks some samples"
        kept = metrics.get("cache", {}).get("mean_kept_fraction", 1.0)
        details = DatasetScores(
            dataset=dataset.name,
            metric=str(metrics["metric"]),
            score=score,
            n_samples=int(metrics["n_samples"]),
            kept_fraction=kept,
            sample_scores=per_sample,
            no_interval_reason=why,
            timing=metrics.get("timing", {}),
            data_provenance=metrics.get("data_provenance", {}),
            cached=skipped,
        )
        interval = interval_of(details, int(self.cfg.seed))
        return DatasetResult(
            dataset.name, details.metric, score, details.n_samples, kept, skipped, interval=interval, details=details
        )

    def _write_summary(self, meta: dict[str, Any], results: list[DatasetResult]) -> dict[str, Any]:
        """Write ``summary.json`` (:mod:`kvbench.summary`) for a complete run; returns its payload.  A run that
        reports on fewer samples than its folder holds leaves the folder's summary as it was (returned, not
        written)."""
        cfg = self.cfg
        run = {
            **meta,
            "question_mode": cfg.task.question_mode,
            "budget_spec": cfg.budget.spec,
            "results_folder": str(self.folder),
        }
        details = [r.details for r in results if r.details is not None]
        summary = build_summary(run, details, int(cfg.seed))
        if all(result.first_of is None for result in results):
            atomic_write_json(self.folder / SUMMARY_FILE, summary)
        return summary


def sample_cache(cfg: DictConfig) -> SampleCache | None:
    """The folder generated samples are stored in (``run.sample_cache``: ``auto`` = ``<run.output_root>/../samples``,
    a path, or null to regenerate in every run)."""
    setting = cfg.run.get("sample_cache", "auto")
    if setting is None:
        return None
    root = Path(cfg.run.output_root).parent / "samples" if setting == "auto" else Path(str(setting))
    return SampleCache(root)


def _check_resumable(
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


def _json_number(value: Any) -> float | None:
    """A score as strict JSON: NaN (e.g. an empty LongBench-E bucket) becomes null."""
    number = float(value)
    return None if math.isnan(number) else number


def _progress(items: Sequence[Any], desc: str, enabled: bool, initial: int, total: int, delay: float = 0.0) -> Any:
    """A progress bar over ``items`` on stderr (``run.progress``), shown after ``delay`` seconds."""
    if not enabled:
        return items
    from tqdm import tqdm

    return tqdm(
        items, desc=desc, initial=initial, total=total, leave=False, dynamic_ncols=True, file=sys.stderr, delay=delay
    )


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


def _interval_text(interval: Sequence[float] | None) -> str:
    return "-" if interval is None else f"[{interval[0]:.2f}, {interval[1]:.2f}]"


def format_table(
    cfg: DictConfig, results: list[DatasetResult], folder: Path, summary: dict[str, Any] | None = None
) -> str:
    """A plain-text score table for the terminal (``summary``: the run's ``summary.json``, for the average's
    interval)."""
    title = (
        f"model={cfg.model.name} task={cfg.task.name} method={cfg.method.name} budget={budget_label(cfg)} "
        f"question_mode={cfg.task.question_mode}" + (f" tag={cfg.run.tag}" if cfg.run.tag else "")
    )
    width = max([len("dataset"), *(len(r.dataset) for r in results)])
    header = f"{'dataset':<{width}}  {'metric':<18} {'score':>7} {'95% CI':>16} {'n':>4} {'kept':>6}"
    lines = [title, header]
    for r in results:
        note = f" (first {r.n_samples} of {r.first_of})" if r.first_of else " (cached)" if r.skipped else ""
        lines.append(
            f"{r.dataset:<{width}}  {r.metric:<18} {r.score:7.2f} {_interval_text(r.interval):>16} {r.n_samples:4d} "
            f"{r.mean_kept_fraction:6.1%}{note}"
        )
    if results:
        mean = sum(r.score for r in results) / len(results)
        mean_interval = (summary or {}).get("averages", {}).get("mean", {}).get("ci95")
        lines.append(f"{'average':<{width}}  {'':<18} {mean:7.2f} {_interval_text(mean_interval):>16}")
    lines.append("95% CI: percentile bootstrap over samples, 1000 resamples (summary.json)")
    lines.append(f"results: {folder}")
    return "\n".join(lines)


def budget_label(cfg: DictConfig) -> str:
    """The budget as run (``budget.spec``), with the preset's name when it differs (``96L (preset 128L)``)."""
    spec, name = str(cfg.budget.spec), str(cfg.budget.name)
    return spec if spec == name else f"{spec} (preset {name})"


def _wandb_logger(cfg: DictConfig) -> Any:
    from kvbench.wandb_logging import WandbLogger

    return WandbLogger.create(cfg)
