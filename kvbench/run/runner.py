"""The runner: one model x method x budget x task run, resumable and idempotent.

Order of work (nothing is written under ``results/`` until every input has been validated and the data checked; a
run that fails before its first prediction leaves no trace):

1. take a validated run (:class:`~kvbench.run.validated.ValidatedRun`): its caller validated the config, the
   environment (model, data folder, packages, results root, and that no other process holds the run folder),
   method, budget and task kind in one pass (:func:`kvbench.app.validation.validate_run`); the runner builds nothing
   again;
2. load the tokenizer, build the task's datasets and load and check every sample of every selected dataset;
3. claim the run folder (:mod:`kvbench.storage.folder`): create it and lock it (two processes never work in one run
   folder at once; the second fails clearly, or waits up to ``$KVBENCH_LOCK_WAIT`` seconds), check that an
   existing run there has the same config (else refuse, naming the differences and ``run.tag``; a folder whose run
   wrote no prediction is replaced, with a note), load the model's weights, write ``config.yaml`` and
   ``run_meta.json``.  If the run fails before the folder holds any prediction, what it wrote is removed again;
4. per dataset: skip it if its ``metrics.json`` exists for this config and sample count; report on the first N
   without writing when it covers more samples (``task.num_samples`` is the run's extent, not its identity);
   otherwise resume ``predictions.jsonl``
   (samples already there are not re-run), append each new prediction as soon as it exists, then score and write
   ``metrics.json`` atomically;
5. write the run's ``summary.json`` (:mod:`kvbench.run.summary`: scores with bootstrap 95 % intervals, the papers'
   averages, kept fraction, timings, provenance), print the score table with the intervals; log to W&B when
   enabled.

A progress bar (``run.progress``) covers step 2's sample preparation (dataset by dataset: RULER/NeedleBench
generation, LongBench loading) and step 4's inference (sample by sample).  :func:`kvbench.evaluate` runs this same
runner on a model the caller loaded (``Runner(validate_run(cfg, check_model=False), loaded=...)``).

SIGTERM (SLURM preemption or time limit) raises :class:`Interrupted` at once while a sample is being generated,
but never while a prediction row or ``metrics.json`` is being written: those writes finish first.  The run then
records ``status: interrupted`` in ``run_meta.json`` and exits; the same command resumes it.

Per dataset the runner takes its cached result (:meth:`Runner._cached_result`), or generates what is missing
(:meth:`Runner._generate`, through :func:`kvbench.run.generation.generate_dataset`) and scores and writes it
(:meth:`Runner._score_and_write`); what that work needs from the run is handed down as a
:class:`~kvbench.run.job.DatasetJob`, never the runner itself.

The parts with a job of their own live beside it: validation, the run folder's lock (:mod:`kvbench.storage.folder`) and
resume checks (:mod:`kvbench.run.resume`), ``config.yaml`` and ``run_meta.json`` (:mod:`kvbench.run.run_meta`), the
results writer (:mod:`kvbench.run.records`), SIGTERM handling
(:mod:`kvbench.storage.termination`), provenance (:mod:`kvbench.storage.provenance`), the score table
(:mod:`kvbench.run.table`), the sample cache and W&B; grouped datasets' generation (:mod:`kvbench.run.groups`); the
progress bar and the above-full-cache warning (:mod:`kvbench.run.generation`).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from kvbench.errors import Interrupted, KVBenchError
from kvbench.inference.generate import last_token_ids
from kvbench.inference.prefill import check_kv_quant_model
from kvbench.kernels.paths import ATTENTION_RECORD
from kvbench.models.loading import (
    LoadedModel,
    check_device_map,
    load_model,
    load_tokenizer,
    resolve_device,
    stop_token_ids,
)
from kvbench.prompting import encode_sample
from kvbench.run.fingerprints import Inputs, dataset_inputs, row_stamp, rows_record
from kvbench.run.generation import (
    decode_batch_for,
    decode_path_settings,
    generate_dataset,
    progress_bar,
    warn_if_above_full,
)
from kvbench.run.groups import extent, first_extent, generate_groups
from kvbench.run.job import DatasetJob, Generated, PendingGeneration
from kvbench.run.records import (
    DatasetResult,
    cache_summary,
    json_number,
    metrics_record,
    prediction_row,
    settings_record,
    warn_if_not_as_asked,
    write_metrics,
)
from kvbench.run.resume import (
    check_existing_run,
    check_inputs_unchanged,
    check_resumable,
    lost_predictions,
    metrics_disagree,
    trusted_metrics,
)
from kvbench.run.run_meta import write_run_files
from kvbench.run.scoring import score_rows
from kvbench.run.summary import SUMMARY_FILE, DatasetScores, build_summary, interval_of, sample_scores
from kvbench.run.table import format_table
from kvbench.run.validated import ValidatedRun
from kvbench.run.wandb_logging import WandbLogger
from kvbench.storage.folder import claim_run_folder
from kvbench.storage.paths import run_folder
from kvbench.storage.provenance import now
from kvbench.storage.sample_cache import run_sample_cache
from kvbench.storage.termination import TERMINATION, graceful_termination
from kvbench.storage.writers import (
    METRICS_FILE,
    PREDICTIONS_FILE,
    RUN_META_FILE,
    TIMINGS_FILE,
    PredictionLog,
    TimingLog,
    atomic_write_json,
    config_hash,
)
from kvbench.tasks.base import Sample, TaskDataset, build_task, check_samples
from kvbench.tasks.provenance import stand_in_warnings

LOG = logging.getLogger(__name__)


class Runner:
    """Runs one configuration end to end (see module docstring)."""

    def __init__(self, validated: ValidatedRun, loaded: LoadedModel | None = None) -> None:
        """``validated``: the run's config as validated (:func:`kvbench.app.validation.validate_run`, as ``run.py``
        does), with the method and budget validation built.  ``loaded``: a model and tokenizer the caller loaded
        (:func:`kvbench.evaluate`, which validates with ``check_model=False``), used instead of loading
        ``cfg.model``'s weights (whose ``path`` is then provenance only, not checked)."""
        if not isinstance(validated, ValidatedRun):
            raise TypeError(
                f"Runner takes a validated run, not {type(validated).__name__}: "
                "Runner(kvbench.app.validation.validate_run(cfg))"
            )
        cfg = validated.cfg
        self.cfg = cfg
        self.loaded = loaded
        self.method, self.budget = validated.method, validated.budget
        if loaded is None and check_device_map(cfg.model.get("device_map")) is None:
            resolve_device(str(cfg.model.device))
        self.cfg_hash = config_hash(cfg)
        self.folder = run_folder(cfg, self.cfg_hash, announce=True)
        #: The run's ``summary.json`` payload, once :meth:`run` completed.
        self.summary: dict[str, Any] = {}
        #: Paged-attention fallbacks (reason -> calls) of the datasets run so far (``run_meta.json``).
        self.attention_fallbacks: Counter[str] = Counter()
        #: ``run.decode_batch`` resolved for the device (``auto``), once the first dataset asked for it.
        self.resolved_decode_batch: int | None = None
        #: Per dataset generated in this process, how its samples decoded (``run_meta.json`` ``decode_paths``).
        self.decode_paths: dict[str, dict[str, str | None]] = {}
        #: Per dataset, what its rows are computed from (:mod:`kvbench.run.fingerprints`), once the data loaded.
        self.inputs: dict[str, Inputs] = {}
        #: Whether a sweep's jobs shared this run's prefills, how many, or why not (:mod:`kvbench.run.shared_sweep`).
        self.prefill_sharing: dict[str, Any] = {"shared": False, "reason": "run alone"}

    def run(self) -> list[DatasetResult]:
        """Execute the run; returns one result per dataset."""
        cfg = self.cfg
        if cfg.run.threads:
            torch.set_num_threads(int(cfg.run.threads))
        torch.manual_seed(int(cfg.seed))
        # SIGTERM at any point (data, model load, generation) ends as Interrupted: one message, exit 143.
        with graceful_termination():
            check_existing_run(self.folder, self.cfg_hash, cfg, note_replacement=False)
            tokenizer = self.loaded.tokenizer if self.loaded else load_tokenizer(cfg.model)
            data = self.load_data(tokenizer)  # every sample checked before the weights load
            # The folder is claimed before the weights load: an identical run started meanwhile is refused at once.
            with claim_run_folder(self.folder, config=self.cfg_hash):
                # Checked again under the lock: another job may have started this folder since the first check.
                check_existing_run(self.folder, self.cfg_hash, cfg)
                stale = self.check_inputs(data)
                loaded = self.loaded or load_model(cfg.model, seed=int(cfg.seed), tokenizer=tokenizer)
                check_kv_quant_model(cfg, loaded.model)  # before any file is written
                logger = WandbLogger.create(cfg)
                with self.recording(stale, logger) as results:
                    for dataset, samples in data:
                        results.append(self._run_dataset(loaded, dataset, samples))
        return self.report(results, logger)

    def check_inputs(self, data: list[tuple[TaskDataset, list[Sample]]]) -> dict[str, Any]:
        """What each dataset's rows are computed from (:attr:`inputs`), checked against the rows the claimed folder
        holds (``run.changed_inputs``); returns the datasets whose rows are stale and kept."""
        self.inputs = {d.name: dataset_inputs(self.cfg, self.method, d.provenance()) for d, _ in data}
        checked = {d.name: self.inputs[d.name] for d, _ in data if not d.evaluates_itself}  # lm-eval: own rows
        on_change = str(self.cfg.run.get("changed_inputs", "refuse"))
        return check_inputs_unchanged(self.folder, checked, self.cfg_hash, on_change)

    @contextmanager
    def recording(self, stale: Any, logger: Any = None) -> Iterator[list[DatasetResult]]:
        """Write the run's ``config.yaml`` and ``run_meta.json`` (status ``running``), then collect the datasets'
        results in the list it yields; ``run_meta.json`` gets the status the block ended with (complete,
        interrupted, failed) and a complete run its ``summary.json``.  The run folder is claimed, SIGTERM handled."""
        meta = write_run_files(self.folder, self.cfg, self.cfg_hash, self.inputs, stale)
        results: list[DatasetResult] = []
        status = "failed"
        try:
            yield results
            status = "complete"
        except (Interrupted, KeyboardInterrupt):  # SIGTERM, or SIGINT (Ctrl-C): the same command resumes
            status = "interrupted"
            if logger is not None:
                logger.abort(exit_code=143)
            raise
        except BaseException:
            if logger is not None:
                logger.abort()
            raise
        finally:
            with TERMINATION.critical(raise_pending=False):
                meta["end_time"] = now()
                meta["status"] = status
                meta["completed_datasets"] = [r.dataset for r in results]
                meta["attention_fallbacks"] = dict(sorted(self.attention_fallbacks.items()))
                meta["decode_batch_resolved"] = self.resolved_decode_batch
                meta["decode_paths"] = self.decode_paths
                meta["prefill_sharing"] = self.prefill_sharing
                if status == "complete":
                    meta["datasets"] = [r.dataset for r in results]
                atomic_write_json(self.folder / RUN_META_FILE, meta)
                if status == "complete":
                    self.summary = self._write_summary(meta, results)

    def report(self, results: list[DatasetResult], logger: Any = None) -> list[DatasetResult]:
        """Log a finished run's results to W&B (``logger``) and print its score table (``run.print_table``)."""
        if logger is not None:
            logger.log_results(results)
        if self.cfg.run.print_table:
            print(format_table(self.cfg, results, self.folder, self.summary))
        return results

    def load_data(self, tokenizer: Any) -> list[tuple[TaskDataset, list[Sample]]]:
        """Build the task's datasets and load every sample of each (the first ``task.num_samples``), checked.

        Loading reads and validates every line of every selected dataset, so a missing file, a corrupt line or an
        empty dataset fails here, before the model's weights load and before anything is written.
        """
        cfg = self.cfg
        data = []
        try:
            cache = run_sample_cache(cfg)
            datasets = build_task(cfg.task, tokenizer, chat_template=bool(cfg.model.chat_template))
            # Shown once preparing takes a second (RULER/NeedleBench generation, LongBench loading): instant
            # preparation and its errors print nothing but the error.
            bar = progress_bar(datasets, f"preparing {cfg.task.name}", cfg.run.progress, 0, len(datasets), delay=1.0)
            try:
                for dataset in bar:
                    if hasattr(bar, "set_postfix_str"):
                        bar.set_postfix_str(dataset.name, refresh=False)
                    dataset.sample_cache = cache
                    samples = list(dataset.samples())
                    if cfg.task.num_samples is not None:  # a grouped dataset: the first n context groups
                        samples = first_extent(samples, int(cfg.task.num_samples), dataset.context_groups is not None)
                    check_samples(dataset.name, samples, str(getattr(dataset, "source", f"task={cfg.task.name}")))
                    data.append((dataset, samples))
            finally:
                if hasattr(bar, "close"):
                    bar.close()  # clears the line (leave=False) before an error is printed
        except (ValueError, OSError, ImportError, RuntimeError) as err:
            raise KVBenchError(f"task={cfg.task.name}: cannot load its data: {err}") from err
        return data

    def _run_dataset(self, loaded: LoadedModel, dataset: TaskDataset, samples: list[Sample]) -> DatasetResult:
        """One dataset: its cached result when an earlier run finished it, else generate what is missing, then score
        and write."""
        cached = self._cached_result(dataset, samples)
        if cached is not None:
            return cached
        if dataset.evaluates_itself:  # a dataset with its own evaluation loop (lm-eval tasks: kvbench/lmeval)
            return dataset.evaluate(self._job(), loaded, samples)
        generated = self._generate(loaded, dataset, samples)
        return self._score_and_write(dataset, samples, generated)

    def _job(self, dataset_state: Any = None) -> DatasetJob:
        """What a dataset's work needs from this run (:class:`~kvbench.run.job.DatasetJob`), with the method's
        state across the dataset (``dataset_state``)."""
        return DatasetJob(
            self.cfg, self.cfg_hash, self.method, self.budget, self.folder, self.resolved_decode_batch or 1,
            dataset_state,
        )  # fmt: skip

    def _cached_result(self, dataset: TaskDataset, samples: list[Sample]) -> DatasetResult | None:
        """The dataset's result from what an earlier run of this config wrote: its ``metrics.json`` when it covers
        exactly ``samples``, or a report on the first ``len(samples)`` when it covers more; ``None``: run it."""
        metrics_path = self.folder / dataset.name / METRICS_FILE
        if not metrics_path.exists():
            return None
        # A damaged metrics.json, or predictions it counts that are gone, is recomputed (trusted_metrics: None).
        existing = trusted_metrics(metrics_path)
        if existing is None or existing.get("config_hash") != self.cfg_hash:
            return None
        if existing.get("n_samples") == len(samples):
            if dataset.evaluates_itself:  # lm-eval's scores: no per-sample kvbench predictions to resample
                kept = existing.get("cache", {}).get("mean_kept_fraction", 1.0)
                return DatasetResult(
                    dataset.name, existing["metric"], existing["score"], existing["n_samples"], kept, skipped=True
                )
            predictions = self.folder / dataset.name / PREDICTIONS_FILE
            rows = {row["id"]: row for row in PredictionLog(predictions).load()}
            if lost_predictions(predictions, rows, samples, existing["n_samples"]):
                return None  # rows gone since metrics.json was written: regenerate them
            if metrics_disagree(metrics_path, existing, [rows[s.id] for s in samples], dataset, samples):
                return None  # rewritten from the rows (scored again, nothing regenerated)
            return self._dataset_result(dataset, samples, [rows.get(s.id) for s in samples], existing, True)
        if len(samples) < int(existing.get("n_samples", 0)):
            return self._report_on_first(dataset, samples, existing)
        return None

    def _generate(self, loaded: LoadedModel, dataset: TaskDataset, samples: list[Sample]) -> Generated:
        """Resume the dataset's ``predictions.jsonl``: generate the samples it lacks, appending each row as soon as
        it exists; returns every sample's row, in sample order."""
        pending = self.pending_generation(loaded, dataset, samples)
        generate = generate_groups if dataset.context_groups is not None else generate_dataset  # run/groups.py
        generate(pending.job, loaded, dataset, pending.todo, pending.encode, pending.write, pending.stops,
                 pending.progress)  # fmt: skip
        return self.generated(dataset, samples, pending)

    def pending_generation(
        self, loaded: LoadedModel, dataset: TaskDataset, samples: list[Sample], show_progress: bool = True
    ) -> PendingGeneration:
        """What generating the dataset's missing samples needs (:class:`~kvbench.run.job.PendingGeneration`; resolves
        ``run.decode_batch`` at the run's first generating dataset).  ``show_progress``: a bar of its own (else the
        caller shows one)."""
        cfg = self.cfg
        folder = self.folder / dataset.name
        provenance = dataset.provenance()
        for warning in stand_in_warnings(dataset.name, provenance):
            LOG.warning(warning)
        log = PredictionLog(folder / PREDICTIONS_FILE)
        done = {row["id"]: row for row in log.load()}
        timing_log = TimingLog(folder / TIMINGS_FILE)
        # Rows past the requested extent (an earlier run asked for more samples) stay in the log, unscored.
        truncated = cfg.task.num_samples is not None and extent(dataset, samples) == int(cfg.task.num_samples)
        check_resumable(log.path, done, samples, beyond_extent_ok=truncated)
        done = {sample.id: done[sample.id] for sample in samples if sample.id in done}
        use_template = bool(cfg.model.chat_template and dataset.chat_template)
        stops = stop_token_ids(loaded.tokenizer, loaded.model, list(cfg.model.stop_tokens))
        stops |= last_token_ids(loaded.tokenizer, dataset.stop_token_texts)
        # What spans the dataset (XKV's sampled mode: its calibration) lives in one object per dataset, passed to
        # every sample's session; a resumed run feeds it what the finished samples recorded (dataset order), so it
        # continues exactly as the uninterrupted run would.
        finished = [done[s.id]["cache"].get("allocator_state") for s in samples if s.id in done]
        dataset_state = self.method.layer_allocator.new_dataset_state(dataset.name, len(samples), finished)
        todo = [s for s in samples if s.id not in done]
        ATTENTION_RECORD.reset()  # paths and fallbacks of this dataset's samples (metrics.json "attention")
        shown = cfg.run.progress and show_progress
        progress = progress_bar(todo, f"{dataset.name}", shown, initial=len(done), total=len(samples))

        def encode(sample: Sample) -> Any:
            return encode_sample(
                loaded.tokenizer,
                sample,
                max_input_length=int(cfg.model.max_input_length),
                use_chat_template=use_template,
                truncation=dataset.truncation,
                bos=dataset.bos,
                template_kwargs=dataset.chat_template_kwargs,
            )

        def write(sample: Sample, encoded: Any, output: Any) -> None:
            row = prediction_row(sample, dataset, output, encoded)
            row.update(row_stamp(self.cfg_hash, self.inputs[dataset.name]))
            warn_if_above_full(output.record, self.cfg)
            warn_if_not_as_asked(row["cache"], self.cfg)
            with TERMINATION.critical():
                log.append(row)
                timing_log.append({"id": sample.id, "prefill_s": output.prefill_s, "decode_s": output.decode_s})
                done[sample.id] = row

        if self.resolved_decode_batch is None:  # resolved once per run, from the first dataset that generates
            self.resolved_decode_batch = decode_batch_for(self._job(), loaded, dataset, todo, encode)
        return PendingGeneration(
            self._job(dataset_state), todo, encode, write, stops, progress, done, provenance, use_template, timing_log
        )

    def generated(self, dataset: TaskDataset, samples: list[Sample], pending: PendingGeneration) -> Generated:
        """The dataset's generation once ``pending``'s samples are written: every sample's row, for scoring."""
        path = decode_path_settings(self._job(), dataset, decoded=bool(pending.todo))
        self.decode_paths[dataset.name] = path
        rows = [pending.done[s.id] for s in samples]
        return Generated(rows, pending.provenance, pending.use_template, pending.timing_log.summary(), path)

    def _score_and_write(self, dataset: TaskDataset, samples: list[Sample], generated: Generated) -> DatasetResult:
        """Score the dataset's rows and write its ``metrics.json`` (and the dataset's report) atomically."""
        cfg, rows = self.cfg, generated.rows
        attention = ATTENTION_RECORD.summary()
        self.attention_fallbacks.update(attention["fallbacks"])
        scores, scoring_errors = score_rows(dataset, rows, samples, self.folder / dataset.name)
        metrics = metrics_record(
            cfg,
            self.cfg_hash,
            dataset,
            score=scores["score"],
            scores={k: json_number(v) for k, v in scores.items()},
            n_samples=len(rows),
            provenance=generated.provenance,
            cache=cache_summary(rows),
            settings=settings_record(
                cfg,
                self.method,
                {"max_input_length": cfg.model.max_input_length, "chat_template": generated.use_template},
                {"decode_batch": self.resolved_decode_batch or 1, **generated.decode_path},
            ),
            timing=generated.timing,
            attention=attention,
            scoring_errors=scoring_errors,
            **rows_record(self.inputs[dataset.name], rows, scores["score"]),
        )
        label = f"{cfg.model.name} {cfg.method.name} {cfg.budget.name} {dataset.name}"
        predictions = [r["prediction"] for r in rows]
        folder = self.folder / dataset.name
        write_metrics(folder, metrics, lambda: dataset.write_report(predictions, samples, folder, label))
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
        check_resumable(self.folder / dataset.name / PREDICTIONS_FILE, by_id, samples, beyond_extent_ok=True)
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
            "cache": cache_summary(kept_rows),
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
        the bootstrap interval (:mod:`kvbench.run.summary`)."""
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
            sample_ids=[sample.id for sample in samples] if per_sample is not None else None,
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
        """Write ``summary.json`` (:mod:`kvbench.run.summary`) for a complete run; returns its payload.  A run that
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
