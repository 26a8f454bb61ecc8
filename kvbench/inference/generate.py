"""Prefill with eviction (:func:`kvbench.inference.prefill.prefill`), then greedy decoding (or seeded sampling when a
dataset asks for it, :class:`Sampling`), for one sample (batch size 1).

Explicit ``position_ids`` everywhere: after eviction the cache holds fewer tokens than were seen, so positions
come from the count of tokens fed, never from the cache length.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from kvbench.budget import Budget
from kvbench.eviction.base import EvictionMethod
from kvbench.inference.eviction import CacheRecord
from kvbench.inference.prefill import (  # noqa: F401  (re-exported: the runner's names for the prefill's parts)
    CPU_CHUNK_PAIRS,
    CPU_PREFILL_CHUNK,
    PrefillState,
    build_cache,
    forward_logits,
    prefill,
    resolve_prefill_chunk,
)
from kvbench.models.loading import input_device, model_devices
from kvbench.sampling import Sampling


def sample_token(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator) -> int:
    """One draw from ``logits`` ``[vocab]`` under ``sampling`` (see :class:`Sampling`)."""
    probs = torch.softmax(logits.float() / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # mass of the more likely tokens
        sorted_probs = torch.where(before < sampling.top_p, sorted_probs, torch.zeros_like(sorted_probs))
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))


@dataclass
class GenerationOutput:
    """Result of one generation (``later_passes``: what a multi-pass dataset's later passes produced from this one's
    text, e.g. LongBench v2's answer pass after the chain of thought: one dict per pass with ``text``,
    ``input_tokens``, ``new_tokens``, ``stop_reason`` and ``cache``; the last one's text is the prediction)."""

    token_ids: list[int]
    text: str
    record: CacheRecord
    prefill_s: float
    decode_s: float
    stop_reason: str
    later_passes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def final_text(self) -> str:
        """The text that is scored: the last pass's."""
        return self.later_passes[-1]["text"] if self.later_passes else self.text


@torch.inference_mode()
def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    context_ids: list[int],
    question_ids: list[int],
    *,
    method: EvictionMethod,
    budget: Budget,
    question_mode: str,
    max_new_tokens: int,
    stop_token_ids: set[int],
    stop_strings: tuple[str, ...] = (),
    min_new_tokens: int = 0,
    prefill_chunk: int | None = None,
    sampling: Sampling | None = None,
    dataset_state: Any = None,
    kv_quant: Any = None,
) -> GenerationOutput:
    """Greedy generation (or seeded ``sampling``) with ``method`` applied at ``budget``.

    ``aware``: the whole prompt (context + question) is prefilled and compressed.  ``agnostic``: only the context
    is prefilled and compressed, then the question is fed on top of the compressed cache.  Stop tokens and stop
    strings are ignored for the first ``min_new_tokens`` tokens (LongBench's ``min_length`` for samsum: the stop
    tokens' logits are masked, so the model picks another token).  A stop token ends the output and is part of it
    (as in ``generate()``); the text is decoded with ``skip_special_tokens=True``.
    ``prefill_chunk``: tokens per forward of the compressed prefill (:func:`resolve_prefill_chunk`).
    ``dataset_state``: what the method's layer allocator keeps across a dataset's samples (XKV's sampled mode;
    :meth:`~kvbench.eviction.base.LayerBudgetAllocator.new_dataset_state`), ``None`` for a sample alone.
    ``kv_quant``: quantized KV storage (the ``kv_quant`` config node; :func:`kvbench.inference.prefill.build_cache`).
    """
    state = prefill(
        model,
        context_ids,
        question_ids,
        method=method,
        budget=budget,
        question_mode=question_mode,
        prefill_chunk=prefill_chunk,
        dataset_state=dataset_state,
        tokenizer=tokenizer,
        kv_quant=kv_quant,
    )
    rules = (max_new_tokens, stop_token_ids, stop_strings, min_new_tokens, sampling)
    return decode_prefilled(model, tokenizer, state, *rules)


@torch.inference_mode()
def decode_prefilled(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    state: PrefillState,
    max_new_tokens: int,
    stop_token_ids: set[int],
    stop_strings: tuple[str, ...] = (),
    min_new_tokens: int = 0,
    sampling: Sampling | None = None,
) -> GenerationOutput:
    """Decode a prefilled prompt (:func:`generate`'s second half; a shared prefill's job,
    :mod:`kvbench.inference.shared_prefill`): its first token from the prefill's logits, then one forward per token
    under the stop rules; the prefill seconds run from ``state.started`` to the first decoding step."""
    devices = model_devices(model)
    cache, session, position, logits = state.cache, state.session, state.position, state.logits
    device = input_device(model)
    session.begin_decode()
    sync_devices(devices)
    prefill_s = time.perf_counter() - state.started

    start = time.perf_counter()
    stream = GreedyStream(tokenizer, max_new_tokens, stop_token_ids, stop_strings, min_new_tokens, sampling)
    decode_stream(model, stream, logits, position, cache, session, device)
    sync_devices(devices)
    decode_s = time.perf_counter() - start
    record = session.finish()
    return GenerationOutput(stream.generated, stream.text(), record, prefill_s, decode_s, stream.stop_reason)


class GreedyStream:
    """One sample's greedy choice (or seeded draw, ``sampling``) and stop rules, step by step: shared by
    :func:`generate` (batch 1) and the batched decoder (:mod:`kvbench.inference.batched_decode`), so both stop alike.

    Stop tokens and stop strings are ignored for the first ``min_new_tokens`` tokens (LongBench's ``min_length`` for
    samsum: the stop tokens' logits are masked, so the model picks another token).  A stop token ends the output and
    is part of it (as in ``generate()``); the text is decoded with ``skip_special_tokens=True`` and cut before a stop
    string.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        max_new_tokens: int,
        stop_token_ids: set[int],
        stop_strings: tuple[str, ...] = (),
        min_new_tokens: int = 0,
        sampling: Sampling | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.sampling = sampling
        self._generator: torch.Generator | None = None
        self.max_new_tokens = max_new_tokens
        self.stop_token_ids = stop_token_ids
        self.stop_strings = stop_strings
        self.min_new_tokens = min_new_tokens
        self.generated: list[int] = []
        self.stop_reason = "max_new_tokens"
        #: Whether the output is complete (no more forwards for this sample).
        self.done = max_new_tokens <= 0

    def push(self, logits: torch.Tensor) -> int:
        """Choose the next token from ``logits`` ``[vocab]`` (the last fed position's), append it and apply the stop
        rules; returns the token (to feed next unless :attr:`done`)."""
        step = len(self.generated)
        if step < self.min_new_tokens and self.stop_token_ids:
            # Like transformers' MinNewTokensLengthLogitsProcessor: stop tokens cannot be chosen yet.
            logits = logits.clone()
            logits[list(self.stop_token_ids)] = float("-inf")
        if self.sampling is None:
            next_id = int(torch.argmax(logits))
        else:
            if self._generator is None:
                self._generator = torch.Generator(device=logits.device).manual_seed(self.sampling.seed)
            next_id = sample_token(logits, self.sampling, self._generator)
        self.generated.append(next_id)
        if next_id in self.stop_token_ids:
            # Kept in the output like transformers' generate(); decoding skips it when it is a special token, so a
            # newline stop (LongBench samsum) stays in the text as in the official predictions.
            self.stop_reason = "stop_token"
            self.done = True
        elif (
            self.stop_strings
            and step + 1 > self.min_new_tokens
            and any(s in self.tokenizer.decode(self.generated, skip_special_tokens=True) for s in self.stop_strings)
        ):
            self.stop_reason = "stop_string"
            self.done = True
        elif step + 1 == self.max_new_tokens:
            self.done = True
        return next_id

    def text(self) -> str:
        """The output text (special tokens skipped; cut before the first stop string when one stopped it)."""
        text = self.tokenizer.decode(self.generated, skip_special_tokens=True)
        if self.stop_reason == "stop_string":
            # Like an eos, the stop string ends the output and is not part of it.
            text = text[: min(text.find(s) for s in self.stop_strings if s in text)]
        return text


def decode_stream(
    model: PreTrainedModel,
    stream: GreedyStream,
    logits: torch.Tensor,
    position: int,
    cache: Any,
    session: Any,
    device: torch.device,
) -> None:
    """Decode one token at a time into ``stream`` until it is done: ``logits`` ``[V]`` are the last prompt token's,
    ``position`` the next token's position; each chosen token is fed back through ``cache`` and ``session``."""
    while not stream.done:
        next_id = stream.push(logits)
        if stream.done:
            break
        logits = forward_logits(model, [next_id], position, cache, session, device)[-1]
        position += 1


def last_token_ids(tokenizer: PreTrainedTokenizerBase, texts: tuple[str, ...] | list[str]) -> set[int]:
    """Id of the last token of each text (LongBench pred.py's ``tokenizer.encode("\\n", add_special_tokens=False)[-1]``:
    the newline piece, e.g. 13 for Llama-2/Mistral SentencePiece, 198 for Llama-3 and Qwen2)."""
    ids = set()
    for text in texts:
        encoded = tokenizer.encode(text, add_special_tokens=False)
        if not encoded:
            raise ValueError(f"stop text {text!r} encodes to no token")
        ids.add(int(encoded[-1]))
    return ids


def sync_devices(devices: set[torch.device]) -> None:
    """Wait for every CUDA device the model computes on (timings)."""
    for device in devices:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
