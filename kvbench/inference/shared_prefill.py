"""One prompt's prefill forward shared by many jobs (issue #56): each job's method and budget compress their own copy
of every layer, as if each had run the prefill alone.

kvbench's compression never changes what the prefill computes: every layer attends over its full keys
(:meth:`~kvbench.inference.eviction.EvictionSession.after_attention` runs once the layer's output exists) and a layer
is compressed only after its last chunk is stored, so the hidden states, the queries and the keys are the same
whatever the method and budget.  :func:`shared_prefill` therefore runs the model's forward once, over a *driver*
cache, and a :class:`PrefillFanOut` (the forward's ``kvbench_session``) hands every layer to each job's own eviction
session:

* before the layer's last chunk, each job's cache holds the driver's layer itself (one object, read only by the
  sessions: the window queries, H2O's column sums against the keys stored so far, the pre-RoPE hidden states);
* at the layer's last chunk, each job in turn gets its own copy of the layer (same buffers, same spare capacity,
  same storage counters) and its session compresses it, exactly as alone; then the driver's layer is dropped.

So each job's cache, session and record go through the very states of a prefill of its own (the recorded bytes, the
per-head counts, the kept tokens), while at most one full layer is held beyond the jobs' own caches (plus, with
chunks, what every layer stored before its last chunk, as in one job's chunked prefill).  Then each job finishes
alone: the question appended on its compressed cache (agnostic mode), a replaying scorer's forwards (KVzip, on its
own full copy), Finch's position shift; its decoding is its own (:mod:`kvbench.run.shared_sweep`).

What must be equal for jobs to share (the model, the prompt, the question mode, the prefill chunk, the cache's
GQA storage and sliding layers, its backend) is the caller's to ensure: :func:`check_shareable` refuses sessions
whose caches differ in layout; :mod:`kvbench.run.prefill_groups` declares what splits a sweep into groups.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from kvbench.budget import Budget
from kvbench.cache.kv_cache import KVBenchCache
from kvbench.eviction.base import EvictionMethod
from kvbench.inference.eviction import EvictionSession
from kvbench.inference.hidden_states import capture_hidden_states
from kvbench.inference.prefill import (
    PrefillState,
    build_cache,
    feed_question,
    forward_logits,
    open_session,
    prompt_segments,
    split_question,
)
from kvbench.inference.replay import replay_context
from kvbench.models.loading import input_device


class JobRandom:
    """One job's own torch random state (CPU, and every CUDA device once CUDA is initialised): a scorer that draws
    from torch's global generator (leverage scores' sketch, as kvpress) draws, in a shared sweep, the numbers it
    would draw alone.  Starts from the global state at its creation (the state the job alone would start from)."""

    def __init__(self) -> None:
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None

    @contextmanager
    def active(self) -> Iterator[None]:
        """Make this job's state the global one for the block, and keep what the block drew."""
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        try:
            yield
        finally:
            self.cpu = torch.get_rng_state()
            self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None


@dataclass(frozen=True)
class PrefillJob:
    """One job of a shared prefill: its method, budget, dataset state (:func:`kvbench.inference.prefill.prefill`)
    and random state (``None``: one from the global state now)."""

    method: EvictionMethod
    budget: Budget
    dataset_state: Any = None
    random: JobRandom | None = None


def cache_layout(method: EvictionMethod) -> tuple[str, bool]:
    """What a method's cache looks like before anything is evicted (:func:`~kvbench.inference.prefill.build_cache`):
    its GQA storage and whether sliding-window layers are kept evictable.  Jobs share a prefill only with equal
    layouts."""
    return (str(method.gqa_granularity), bool(method.compress_sliding))


def check_shareable(jobs: Sequence[PrefillJob]) -> None:
    """Refuse jobs that cannot share one prefill forward: none, or caches of different layouts."""
    if not jobs:
        raise ValueError("shared_prefill needs at least one job")
    layouts = {cache_layout(job.method) for job in jobs}
    if len(layouts) > 1:
        raise ValueError(
            f"jobs with different cache layouts (gqa_granularity, compress_sliding) cannot share a prefill: "
            f"{sorted(layouts)}"
        )
    for job in jobs:
        reason = job.method.unshared_prefill
        if reason is not None:
            raise ValueError(f"method {job.method.name!r} cannot share a prefill: {reason}")


class PrefillFanOut:
    """The ``kvbench_session`` of a shared prefill forward: every layer's queries go to each job's session, each job's
    cache holding the driver's layer (module docstring).

    Attributes
    ----------
    cache:
        The driver cache the model's forward writes into (read by the attention function for sliding windows).
    sessions:
        The jobs' sessions, in job order (each with its own cache).
    last_chunk:
        Whether the forward in progress carries the compressed prompt's last chunk (set by :func:`shared_prefill`).
    """

    def __init__(self, cache: KVBenchCache, sessions: Sequence[EvictionSession], randoms: Sequence[JobRandom]) -> None:
        self.cache = cache
        self.sessions = list(sessions)
        self.randoms = list(randoms)
        self.last_chunk = False

    def after_attention(self, module: torch.nn.Module, query: torch.Tensor, scaling: float) -> None:
        """Hand the layer (``query`` ``[1, H_q, q, D]``) to every job's session; at the last chunk each gets its own
        copy of the layer first, and the driver's is dropped after the last job took it."""
        layer_idx = int(module.layer_idx)
        layer = self.cache.layers[layer_idx]
        for session, random in zip(self.sessions, self.randoms, strict=True):
            session.cache.layers[layer_idx] = copy.deepcopy(layer) if self.last_chunk else layer
            with random.active():
                session.after_attention(module, query, scaling)
        if self.last_chunk:
            self.cache.layers[layer_idx] = self.cache._evictable_layer()  # the full layer is freed


@torch.inference_mode()
def shared_prefill(
    model: PreTrainedModel,
    context_ids: Sequence[int],
    question_ids: Sequence[int],
    jobs: Sequence[PrefillJob],
    *,
    question_mode: str = "aware",
    prefill_chunk: int | None = None,
    tokenizer: Any = None,
    scoring_impl: str = "auto",
) -> list[PrefillState]:
    """Prefill one prompt once for every job of ``jobs``; returns each job's :class:`PrefillState`, what
    :func:`kvbench.inference.prefill.prefill` returns for that job alone (no held segment): its cache compressed,
    the question appended in agnostic mode, its session ready for ``begin_decode``.

    ``question_mode``, ``prefill_chunk``, ``tokenizer`` and ``scoring_impl`` are those of
    :func:`~kvbench.inference.prefill.prefill`, the same for every job; each job's prefill seconds (from its
    ``started``) are its share of the shared forward (the forward's seconds over the jobs) and its own finishing.
    """
    check_shareable(jobs)
    compressed, appended = split_question(list(context_ids), list(question_ids), question_mode)
    opened = [
        open_session(model, context_ids, question_ids, question_mode, job.method, job.budget, prefill_chunk,
                     None, scoring_impl, job.dataset_state)
        for job in jobs
    ]  # fmt: skip
    sessions = [session for _, session, _ in opened]
    chunk = opened[0][2]
    driver = build_cache(model, jobs[0].method)
    randoms = [job.random or JobRandom() for job in jobs]
    fan_out = PrefillFanOut(driver, sessions, randoms)
    device = input_device(model)
    segments = [segment for segment in prompt_segments(compressed, [], chunk)]
    started = time.perf_counter()
    for session in sessions:
        session.begin_prefill(len(compressed), prompt_ids=compressed)
        capture_hidden_states(model, session)  # its hooks accept the fan-out's forwards (hidden_states.py)
    logits: torch.Tensor | None = None
    try:
        for number, segment in enumerate(segments):
            fan_out.last_chunk = number == len(segments) - 1
            logits = forward_logits(model, segment.ids, segment.start, driver, fan_out, device)[-1]
    except BaseException:
        for session in sessions:
            session.release_hooks()
        raise
    del driver, fan_out
    assert logits is not None
    share = (time.perf_counter() - started) / len(jobs)
    states = []
    for (cache, session, _), random in zip(opened, randoms, strict=True):
        position, job_logits = len(compressed), logits
        started = time.perf_counter() - share  # the job's prefill seconds: its share of the forward, then its own
        with random.active():
            if appended:
                position, job_logits = feed_question(model, session, compressed, appended, tokenizer)
            session.release_hooks()
            replay_context(model, session, compressed, tokenizer, device, forward_logits)
        position -= 0 if appended else session.position_shift
        states.append(PrefillState(cache, session, compressed, appended, position, job_logits, None, started))
    return states
