"""A shared-prefill group of a sweep, run in one process (issue #56): one model load, one sample load, one prefill
forward per sample for every job; each job's folder, rows, metrics and resume exactly as the job alone.

:func:`run_group` runs the jobs of one group (:mod:`kvbench.run.prefill_groups`: configs equal but for method and
budget, in what the prefill depends on).  It follows the runner's order of work (:mod:`kvbench.run.runner`) for all of
them at once: every job's config and folder checked, the tokenizer and the samples loaded once, every job's folder
claimed (:meth:`~kvbench.run.runner.Runner.recording`: ``config.yaml``, ``run_meta.json``), the weights loaded once.
Then per dataset:

* each job takes its cached result when an earlier run finished the dataset, as alone;
* the jobs left share the dataset's generation: per sample that any of them lacks (a killed sweep resumes only the
  missing (job, sample) pairs), :func:`kvbench.inference.shared_prefill.shared_prefill` runs the prefill forward
  once for those jobs, then each job decodes alone
  (:func:`kvbench.inference.generate.decode_prefilled`) and appends its row, in sample order;
* a dataset that is not one prefill per sample (:func:`~kvbench.run.prefill_groups.dataset_unshared_reason`) runs job
  by job, each through its own runner;
* each job scores its rows and writes its ``metrics.json``, as alone.

Each job keeps its own torch random state (:class:`~kvbench.inference.shared_prefill.JobRandom`, from the state
after the seed, the samples and the weights, as alone) and its own paged-attention counts, so nothing a job records
depends on the others.  ``run_meta.json``'s ``prefill_sharing`` says, per job, with how many jobs its prefills were
shared, and which datasets ran alone and why.  W&B logging, when enabled, logs each job's results once the group
has finished.

A failure of the group (an error in the shared forward, or one job's) fails every job still running: each records
status ``failed`` and keeps the rows written so far; the same command resumes them (the CLI runs the jobs of a failed
group alone: :mod:`kvbench.app.cli`, planned by :mod:`kvbench.app.sweep_sharing`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager

import torch

from kvbench.inference.generate import decode_prefilled
from kvbench.inference.shared_prefill import JobRandom, PrefillJob, shared_prefill
from kvbench.kernels.paths import ATTENTION_RECORD
from kvbench.models.loading import LoadedModel, load_model, load_tokenizer
from kvbench.run.generation import progress_bar, stop_rules
from kvbench.run.job import PendingGeneration
from kvbench.run.prefill_groups import dataset_unshared_reason
from kvbench.run.records import DatasetResult
from kvbench.run.resume import check_existing_run
from kvbench.run.runner import Runner
from kvbench.run.validated import ValidatedRun
from kvbench.run.wandb_logging import WandbLogger
from kvbench.storage.folder import claim_run_folder
from kvbench.storage.termination import graceful_termination
from kvbench.tasks.base import Sample, TaskDataset

LOG = logging.getLogger(__name__)


class _Member:
    """One job of the group: its runner, random state, paged-attention counts and results so far."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.random: JobRandom | None = None
        self.calls: Counter[str] = Counter()
        self.fallbacks: Counter[str] = Counter()
        self.results: list[DatasetResult] = []

    @contextmanager
    def own_state(self) -> Iterator[None]:
        """The job's random state and paged-attention counts are the process's for the block."""
        assert self.random is not None
        saved = ATTENTION_RECORD.calls, ATTENTION_RECORD.fallbacks
        ATTENTION_RECORD.calls, ATTENTION_RECORD.fallbacks = self.calls, self.fallbacks
        try:
            with self.random.active():
                yield
        finally:
            ATTENTION_RECORD.calls, ATTENTION_RECORD.fallbacks = saved


def run_group(validated: Sequence[ValidatedRun]) -> list[list[DatasetResult]]:
    """Run the jobs ``validated`` (one shared-prefill group, in sweep order) together; returns each job's results.

    Each job's folder gets what the job alone writes (module docstring); ``Runner.report`` prints each job's table.
    """
    if not validated:
        return []
    members = [_Member(Runner(item)) for item in validated]
    lead = members[0].runner
    cfg = lead.cfg
    if cfg.run.threads:
        torch.set_num_threads(int(cfg.run.threads))
    torch.manual_seed(int(cfg.seed))
    with graceful_termination():  # SIGTERM at any point ends as Interrupted (each job records it), as alone
        for member in members:
            runner = member.runner
            check_existing_run(runner.folder, runner.cfg_hash, runner.cfg, note_replacement=False)
        tokenizer = load_tokenizer(cfg.model)
        data = lead.load_data(tokenizer)  # every sample checked before the weights load
        with ExitStack() as stack:
            stale = []
            for member in members:
                runner = member.runner
                stack.enter_context(claim_run_folder(runner.folder, config=runner.cfg_hash))
                check_existing_run(runner.folder, runner.cfg_hash, runner.cfg)
                stale.append(runner.check_inputs(data))
            loaded = load_model(cfg.model, seed=int(cfg.seed), tokenizer=tokenizer)
            for member, kept in zip(members, stale, strict=True):
                member.random = JobRandom()  # the state the job alone generates from (after seed, samples, weights)
                member.runner.prefill_sharing = {"shared": True, "jobs": len(members), "datasets_alone": {}}
                member.results = stack.enter_context(member.runner.recording(kept))
            for dataset, samples in data:
                _run_dataset(members, loaded, dataset, samples)
    for member in members:
        member.runner.report(member.results, WandbLogger.create(member.runner.cfg))
    return [member.results for member in members]


def _run_dataset(members: list[_Member], loaded: LoadedModel, dataset: TaskDataset, samples: list[Sample]) -> None:
    """One dataset for every job: cached results, else one shared generation, then each job scores and writes."""
    active = []
    for member in members:
        cached = member.runner._cached_result(dataset, samples)
        if cached is not None:
            member.results.append(cached)
        else:
            active.append(member)
    reason = dataset_unshared_reason(dataset) if len(active) > 1 else "no other job of the group generates it"
    if reason is not None:
        for member in active:
            member.runner.prefill_sharing["datasets_alone"][dataset.name] = reason
            with member.own_state():
                member.results.append(member.runner._run_dataset(loaded, dataset, samples))
        return
    pending = []
    for member in active:
        with member.own_state():
            pending.append(member.runner.pending_generation(loaded, dataset, samples, show_progress=False))
    _generate_shared(active, pending, loaded, dataset, samples)
    for member, job in zip(active, pending, strict=True):
        runner = member.runner
        with member.own_state():
            generated = runner.generated(dataset, samples, job)
            member.results.append(runner._score_and_write(dataset, samples, generated))


def _generate_shared(
    members: list[_Member],
    pending: list[PendingGeneration],
    loaded: LoadedModel,
    dataset: TaskDataset,
    samples: list[Sample],
) -> None:
    """Per sample that any job lacks: one prefill forward for the jobs that lack it, then each decodes and writes."""
    todo = [sample for sample in samples if any(sample.id not in job.done for job in pending)]
    lead = pending[0]
    cfg = lead.job.cfg
    label = f"{dataset.name} (x{len(members)} jobs, shared prefill)"
    bar = progress_bar(todo, label, cfg.run.progress, initial=len(samples) - len(todo), total=len(samples))
    try:
        for sample in bar:
            needing = [index for index, job in enumerate(pending) if sample.id not in job.done]
            encoded = lead.encode(sample)
            settings = [pending[index].job for index in needing]
            jobs = [
                PrefillJob(job.method, job.budget, job.dataset_state, members[index].random)
                for index, job in zip(needing, settings, strict=True)
            ]
            shared_calls = ATTENTION_RECORD.calls.copy(), ATTENTION_RECORD.fallbacks.copy()
            states = shared_prefill(
                loaded.model,
                encoded.context_ids,
                encoded.question_ids,
                jobs,
                question_mode=str(cfg.task.question_mode),
                prefill_chunk=cfg.run.prefill_chunk,
                tokenizer=loaded.tokenizer,
            )
            # The paged-attention calls of the shared forward count for every job, as each job's own prefill would.
            forward_calls = ATTENTION_RECORD.calls - shared_calls[0]
            forward_fallbacks = ATTENTION_RECORD.fallbacks - shared_calls[1]
            for index, state in zip(needing, states, strict=True):
                member, job = members[index], pending[index]
                member.calls.update(forward_calls)
                member.fallbacks.update(forward_fallbacks)
                with member.own_state():
                    rules = stop_rules(dataset, job.stops, sample.id)
                    output = decode_prefilled(loaded.model, loaded.tokenizer, state, **rules)
                    job.write(sample, encoded, output)
    finally:
        if hasattr(bar, "close"):
            bar.close()
