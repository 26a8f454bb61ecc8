"""Prefill with eviction (:func:`kvbench.inference.prefill.prefill`), then greedy decoding, for one sample (batch size
1).

Explicit ``position_ids`` everywhere: after eviction the cache holds fewer tokens than were seen, so positions
come from the count of tokens fed, never from the cache length.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from kvbench.budget import Budget
from kvbench.inference.eviction import CacheRecord
from kvbench.inference.prefill import (  # noqa: F401  (re-exported: the runner's names for the prefill's parts)
    CPU_CHUNK_PAIRS,
    CPU_PREFILL_CHUNK,
    build_cache,
    forward_logits,
    prefill,
    resolve_prefill_chunk,
)
from kvbench.methods.base import EvictionMethod
from kvbench.models.loading import input_device, model_devices


@dataclass
class GenerationOutput:
    """Result of one greedy generation."""

    token_ids: list[int]
    text: str
    record: CacheRecord
    prefill_s: float
    decode_s: float
    stop_reason: str


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
) -> GenerationOutput:
    """Greedy generation with ``method`` applied at ``budget``.

    ``aware``: the whole prompt (context + question) is prefilled and compressed.  ``agnostic``: only the context
    is prefilled and compressed, then the question is fed on top of the compressed cache.  Stop tokens and stop
    strings are ignored for the first ``min_new_tokens`` tokens (LongBench's ``min_length`` for samsum: the stop
    tokens' logits are masked, so the model picks another token).  A stop token ends the output and is part of it
    (as in ``generate()``); the text is decoded with ``skip_special_tokens=True``.
    ``prefill_chunk``: tokens per forward of the compressed prefill (:func:`resolve_prefill_chunk`).
    """
    devices = model_devices(model)
    state = prefill(
        model,
        context_ids,
        question_ids,
        method=method,
        budget=budget,
        question_mode=question_mode,
        prefill_chunk=prefill_chunk,
    )
    cache, session, position, logits = state.cache, state.session, state.position, state.logits
    device = input_device(model)
    session.begin_decode()
    _sync(devices)
    prefill_s = time.perf_counter() - state.started

    start = time.perf_counter()
    generated: list[int] = []
    stop_reason = "max_new_tokens"
    for step in range(max_new_tokens):
        if step < min_new_tokens and stop_token_ids:
            # Like transformers' MinNewTokensLengthLogitsProcessor: stop tokens cannot be chosen yet.
            logits = logits.clone()
            logits[list(stop_token_ids)] = float("-inf")
        next_id = int(torch.argmax(logits))
        generated.append(next_id)
        if next_id in stop_token_ids:
            # Kept in the output like transformers' generate(); decoding skips it when it is a special token, so a
            # newline stop (LongBench samsum) stays in the text as in the official predictions.
            stop_reason = "stop_token"
            break
        if (
            stop_strings
            and step + 1 > min_new_tokens
            and any(s in tokenizer.decode(generated, skip_special_tokens=True) for s in stop_strings)
        ):
            stop_reason = "stop_string"
            break
        if step + 1 == max_new_tokens:
            break
        logits = forward_logits(model, [next_id], position, cache, session, device)[-1]
        position += 1
    _sync(devices)
    decode_s = time.perf_counter() - start
    record = session.finish()
    text = tokenizer.decode(generated, skip_special_tokens=True)
    if stop_reason == "stop_string":
        # Like an eos, the stop string ends the output and is not part of it.
        text = text[: min(text.find(s) for s in stop_strings if s in text)]
    return GenerationOutput(generated, text, record, prefill_s, decode_s, stop_reason)


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


def _sync(devices: set[torch.device]) -> None:
    """Wait for every CUDA device the model computes on (timings)."""
    for device in devices:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
