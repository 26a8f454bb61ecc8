"""Prefill alone, decode together: greedy generation of many samples with ``run.decode_batch`` > 1 (issues #33, #46).

Each sample is prefilled and compressed on its own by :func:`kvbench.inference.prefill.prefill`, exactly as at batch 1
(same kept tokens, same cache record); its cache then joins the decode batch. Every step feeds one token of every active
sample through one model forward: the dense parts run on the ``[B, 1]`` batch; where the model and method allow
(:func:`kvbench.inference.decode_pool.decode_path`) the samples share one page pool per layer and each layer runs
one attention call and one decode-policy step for all of them (:class:`kvbench.inference.decode_pool.PooledBatch`),
else attention and the policy run per sample over its own storage (:class:`kvbench.cache.batched.BatchedCache`); the
path taken, and why per sample, is noted in :data:`kvbench.inference.decode_pool.DECODE_PATHS`.
A sample that stops (stop token, ``max_new_tokens``, stop strings: :class:`kvbench.inference.generate.GreedyStream`,
the rules of batch 1) leaves the batch (its pooled rows go back to its own cache, its pages to the pool) and the next
sample is prefilled and takes its place (continuous batching). Outputs come back as samples finish,
with their index; the caller restores the order (:class:`ReorderBuffer`).

Per-sample state: the method is a frozen recipe shared by every sample; each sample's session owns what it
accumulates (the allocator's state, the decode policy's caps and running scores), so nothing is copied.  A dataset's
state (XKV's sampled mode: ``dataset_state``) is read and extended by the prefills, one sample at a time in request
order, as at batch 1.

Exactness: on CPU in float32 the tokens and cache records equal batch 1's (``tests/inference/test_batch_decode.py``);
the batched matrix products of the dense parts may round differently from batch 1's in the last bits on some backends
(the tests state the tolerance of the logits).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from kvbench.budget import Budget
from kvbench.cache.batched import BatchedCache
from kvbench.checks import DECODE_BATCH_AUTO, check_decode_batch
from kvbench.eviction.base import EvictionMethod
from kvbench.inference.decode_pool import DECODE_PATHS, POOLED, PooledBatch, decode_path
from kvbench.inference.eviction import EvictionSession
from kvbench.inference.generate import GenerationOutput, GreedyStream, sync_devices
from kvbench.inference.prefill import prefill
from kvbench.models.loading import input_device, model_devices
from kvbench.sampling import Sampling

#: ``auto`` never decodes more samples than this per forward.
MAX_AUTO_BATCH = 64
#: ``auto`` leaves this share of the free GPU memory unused (allocator fragmentation, temporary buffers).
AUTO_MEMORY_MARGIN = 0.1


def auto_decode_batch(
    free_bytes: int,
    model_config: Any,
    method: EvictionMethod,
    budget: Budget,
    longest_prompt: int,
    max_new_tokens: int,
    itemsize: int,
) -> int:
    """Samples that fit ``free_bytes`` once the longest prompt's prefill is accounted for.

    Each decoding sample holds its compressed cache plus ``max_new_tokens`` per stored head and layer; the prefill of
    the longest prompt (made while the others wait) holds its whole cache before eviction and about one layer's
    activations (hidden states and MLP intermediates over the prompt).  An estimate, not a measurement: it has not
    been checked on a GPU.  The result is
    in ``1 .. MAX_AUTO_BATCH``.
    """
    config = model_config.get_text_config(decoder=True)
    layers = int(config.num_hidden_layers)
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or int(config.hidden_size) // heads)
    stored = heads if method.gqa_granularity == "query_head" else kv_heads
    token_bytes = head_dim * 2 * itemsize  # one token of one head: key + value
    kept = longest_prompt if budget.is_full else min(longest_prompt, budget.mean_per_layer(longest_prompt))
    per_sample = layers * stored * (kept + max_new_tokens) * token_bytes
    activations = longest_prompt * (int(config.hidden_size) * 4 + int(config.intermediate_size) * 3) * itemsize
    prefill = layers * stored * longest_prompt * token_bytes + activations  # its whole cache before eviction
    usable = free_bytes * (1 - AUTO_MEMORY_MARGIN) - prefill
    return max(1, min(MAX_AUTO_BATCH, int(usable // max(per_sample, 1))))


def resolve_decode_batch(
    setting: Any,
    model: Any,
    method: EvictionMethod,
    budget: Budget,
    prompt_lengths: Callable[[], Sequence[int]],
    max_new: int,
) -> int:
    """``run.decode_batch`` as a number: an integer as given; ``auto`` is 1 on CPU and, on CUDA,
    :func:`auto_decode_batch` of the device's free memory now (the model loaded); ``prompt_lengths()`` gives the
    dataset's prompt lengths in tokens (called for ``auto`` on CUDA only)."""
    value = check_decode_batch(setting)
    if value != DECODE_BATCH_AUTO:
        return int(value)
    device = input_device(model)
    lengths = list(prompt_lengths()) if device.type == "cuda" else []
    if not lengths:
        return 1
    free, _ = torch.cuda.mem_get_info(device)
    itemsize = next(model.parameters()).element_size()
    return auto_decode_batch(free, model.config, method, budget, max(lengths), max_new, itemsize)


@dataclass
class DecodeRequest:
    """One sample to generate: its prompt and its own stop rules (:class:`~kvbench.inference.generate.GreedyStream`)."""

    context_ids: list[int]
    question_ids: list[int]
    max_new_tokens: int
    stop_token_ids: set[int]
    stop_strings: tuple[str, ...] = ()
    min_new_tokens: int = 0
    sampling: Sampling | None = None


@dataclass
class _Slot:
    """One sample in the decode batch."""

    index: int
    session: EvictionSession
    stream: GreedyStream
    position: int
    next_id: int
    prefill_s: float
    decode_s: float = 0.0

    def output(self) -> GenerationOutput:
        record = self.session.finish()
        text = self.stream.text()
        return GenerationOutput(
            self.stream.generated, text, record, self.prefill_s, self.decode_s, self.stream.stop_reason
        )


@torch.inference_mode()
def generate_batched(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    requests: Iterable[DecodeRequest],
    *,
    method: EvictionMethod,
    budget: Budget,
    question_mode: str,
    decode_batch: int,
    prefill_chunk: int | None = None,
    dataset_state: Any = None,
    kv_quant: Any = None,
) -> Iterator[tuple[int, GenerationOutput]]:
    """Greedy generation of ``requests`` with up to ``decode_batch`` samples decoded per model forward.

    Yields ``(index, output)`` as samples finish (not in request order); each output is what
    :func:`kvbench.inference.generate.generate` returns for that request alone, except ``decode_s``: the sample's share
    of the batched steps it took part in (each step's time divided by the samples in it), so the shares of a run add up
    to its decoding time. Requests are read lazily: one is prefilled when a place in the batch frees up.
    ``dataset_state``: the dataset's allocator state, given to every sample's session (:func:`prefill`);
    ``kv_quant``: quantized KV storage for every sample's cache (:func:`kvbench.inference.prefill.build_cache`).
    """
    if check_decode_batch(decode_batch, "decode_batch") == DECODE_BATCH_AUTO:
        raise ValueError("generate_batched needs a number: resolve decode_batch='auto' first (resolve_decode_batch)")
    devices = model_devices(model)
    device = input_device(model)
    pending = enumerate(requests)
    active: list[_Slot] = []
    exhausted = False
    pool: PooledBatch | None = None  # the shared page pools, when the model and method allow (decode_pool)
    pooled: bool | None = None
    while True:
        while not exhausted and len(active) < decode_batch:
            item = next(pending, None)
            if item is None:
                exhausted = True
                break
            slot = _start(model, tokenizer, item[0], item[1], method, budget, question_mode, prefill_chunk,
                          devices, dataset_state, kv_quant)  # fmt: skip
            if slot.stream.done:
                yield slot.index, slot.output()
                continue
            if pooled is None:
                path, reason = decode_path(model, slot.session)
                DECODE_PATHS.note(path, reason)
                pooled = path == POOLED
                pool = PooledBatch() if pooled else None
            if pool is not None:
                pool.join(slot.session)
            active.append(slot)
        if not active:
            return
        started = time.perf_counter()
        if pool is not None:
            logits = pool.step(model, [s.next_id for s in active], [s.position for s in active], device)
        else:
            logits = _batched_step(model, active, device)
        for slot, row in zip(active, logits, strict=True):
            slot.position += 1
            slot.next_id = slot.stream.push(row)
        sync_devices(devices)
        share = (time.perf_counter() - started) / len(active)
        still: list[_Slot] = []
        for slot in active:
            slot.decode_s += share
            if slot.stream.done:
                if pool is not None:
                    pool.leave(slot.session)
                yield slot.index, slot.output()
            else:
                still.append(slot)
        active = still


def _start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    index: int,
    request: DecodeRequest,
    method: EvictionMethod,
    budget: Budget,
    question_mode: str,
    prefill_chunk: int | None,
    devices: set[torch.device],
    dataset_state: Any,
    kv_quant: Any = None,
) -> _Slot:
    """Prefill one request alone (as batch 1 does) and choose its first token."""
    state = prefill(
        model,
        request.context_ids,
        request.question_ids,
        method=method,
        budget=budget,
        question_mode=question_mode,
        prefill_chunk=prefill_chunk,
        dataset_state=dataset_state,
        tokenizer=tokenizer,
        kv_quant=kv_quant,
    )
    state.session.begin_decode()
    sync_devices(devices)
    prefill_s = time.perf_counter() - state.started
    stream = GreedyStream(
        tokenizer,
        request.max_new_tokens,
        request.stop_token_ids,
        request.stop_strings,
        request.min_new_tokens,
        request.sampling,
    )
    next_id = -1
    if not stream.done:
        assert state.logits is not None
        next_id = stream.push(state.logits)
    return _Slot(index, state.session, stream, state.position, next_id, prefill_s)


def _batched_step(model: PreTrainedModel, active: list[_Slot], device: torch.device) -> torch.Tensor:
    """One forward of every active sample's next token at its own position; returns ``[B, vocab]`` logits."""
    next_ids = [slot.next_id for slot in active]
    return decode_step(model, next_ids, [slot.position for slot in active], [s.session for s in active], device)


def decode_step(
    model: PreTrainedModel,
    next_ids: list[int],
    positions: list[int],
    sessions: list[EvictionSession],
    device: torch.device,
) -> torch.Tensor:
    """One batched decoding step: sample ``b`` feeds token ``next_ids[b]`` at position ``positions[b]`` on top of
    ``sessions[b].cache`` (its session in phase ``decode``); returns the ``[B, vocab]`` logits."""
    input_ids = torch.tensor([[token] for token in next_ids], dtype=torch.long, device=device)
    position_ids = torch.tensor([[position] for position in positions], dtype=torch.long, device=device)
    batched = BatchedCache([session.cache for session in sessions], sessions)
    output = model(
        input_ids=input_ids,
        position_ids=position_ids,
        past_key_values=batched,
        use_cache=True,
        logits_to_keep=1,
    )
    return output.logits[:, -1]


class ReorderBuffer:
    """Holds outputs that finish out of order and releases them in index order (``predictions.jsonl`` keeps the
    samples' order).  At most ``decode_batch`` outputs wait: a sample finishes at most once per join."""

    def __init__(self, first: int = 0) -> None:
        self.next = first
        self.waiting: dict[int, Any] = {}

    def add(self, index: int, item: Any) -> list[Any]:
        """Take ``item`` number ``index``; return the items now ready, in order."""
        self.waiting[index] = item
        ready = []
        while self.next in self.waiting:
            ready.append(self.waiting.pop(self.next))
            self.next += 1
        return ready
