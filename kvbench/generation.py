"""Prefill with eviction, then greedy decoding, for one sample (batch size 1).

Explicit ``position_ids`` everywhere: after eviction the cache holds fewer tokens than were seen, so positions
come from the count of tokens fed, never from the cache length.

The compressed prompt is fed in one forward or in chunks (``prefill_chunk``, ``run.prefill_chunk``): each chunk
attends to everything stored before it (kvbench's bottom-right causal attention), the eviction session keeps what
the method reads from the prompt rows, and each layer is compressed once its last chunk is stored -- the method
sees what a one-shot prefill gives it, while the activations (MLP, attention) are bounded by the chunk.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from kvbench.budget import Budget
from kvbench.cache import KVBenchCache
from kvbench.checks import check_choice
from kvbench.config import QUESTION_MODES
from kvbench.eviction import CacheRecord, EvictionSession
from kvbench.methods.base import EvictionMethod
from kvbench.models import input_device, model_devices
from kvbench.sliding import layer_windows

#: ``prefill_chunk=None`` (automatic): on CPU, prompts longer than this are fed in chunks of at most this many
#: tokens; on CUDA the prompt goes in one forward.
CPU_PREFILL_CHUNK = 4096
#: ... and at most this many (query x key) pairs per chunk: CPU attention over a chunk holds a buffer of about 10
#: bytes per pair (its causal mask), so long prompts get smaller chunks (128K tokens: 1024).
CPU_CHUNK_PAIRS = 1 << 27


def resolve_prefill_chunk(prefill_chunk: int | None, device: torch.device, prompt_tokens: int) -> int:
    """Tokens per prefill forward (0 = one forward) for ``run.prefill_chunk`` (``None`` = automatic: see
    :data:`CPU_PREFILL_CHUNK` and :data:`CPU_CHUNK_PAIRS`)."""
    if prefill_chunk is None:
        if device.type != "cpu" or prompt_tokens <= CPU_PREFILL_CHUNK:
            return 0
        return max(256, min(CPU_PREFILL_CHUNK, CPU_CHUNK_PAIRS // prompt_tokens))
    if isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int) or prefill_chunk < 0:
        raise ValueError(
            f"run.prefill_chunk={prefill_chunk!r}; valid: a positive number of tokens per chunk, 0 (one forward) "
            "or null (automatic: chunks on CPU for long prompts)"
        )
    return prefill_chunk if 0 < prefill_chunk < prompt_tokens else 0


@dataclass
class GenerationOutput:
    """Result of one greedy generation."""

    token_ids: list[int]
    text: str
    record: CacheRecord
    prefill_s: float
    decode_s: float
    stop_reason: str


def build_cache(model: PreTrainedModel, method: EvictionMethod) -> KVBenchCache:
    """An empty cache with the method's GQA granularity; the model's sliding-window layers (as transformers reads
    its config, :func:`kvbench.sliding.layer_windows`) are held in sliding layers, or kept evictable when the method
    says ``compress_sliding`` (:class:`~kvbench.methods.base.EvictionMethod`, off by default)."""
    config = model.config.get_text_config(decoder=True)
    expand = 1
    if method.gqa_granularity == "query_head":
        heads = int(config.num_attention_heads)
        expand = heads // int(getattr(config, "num_key_value_heads", None) or heads)
    windows = layer_windows(config)
    return KVBenchCache(
        len(windows), expand_factor=expand, sliding_windows=windows, compress_sliding=method.compress_sliding
    )


def forward_logits(
    model: PreTrainedModel,
    ids: list[int],
    start: int,
    cache: KVBenchCache,
    session: EvictionSession | None,
    device: torch.device,
    keep: int = 1,
) -> torch.Tensor:
    """Feed ``ids`` at positions ``start..`` on top of ``cache`` (``session`` ``None``: no eviction hook); returns
    the logits of the last ``keep`` positions ``[keep, vocab]``."""
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)
    position_ids = torch.arange(start, start + len(ids), dtype=torch.long, device=device)[None]
    output = model(
        input_ids=input_ids,
        position_ids=position_ids,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=keep,
        kvbench_session=session,
        kvbench_cache=cache,  # the attention reads sliding windows from it, also without a session
    )
    return output.logits[0, -keep:]


def _forward(
    model: PreTrainedModel, ids: list[int], start: int, cache: KVBenchCache, session: EvictionSession, device
) -> torch.Tensor:
    """Feed ``ids`` at positions ``start..``; returns the last position's logits ``[vocab]``."""
    return forward_logits(model, ids, start, cache, session, device)[-1]


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
    check_choice("task.question_mode", question_mode, QUESTION_MODES)
    device = input_device(model)  # with a device map each cache layer is created on its own layer's device
    devices = model_devices(model)
    cache = build_cache(model, method)
    session = EvictionSession(method, budget, cache)
    if question_mode == "aware" or not question_ids:
        compressed, appended = context_ids + question_ids, []
    else:
        compressed, appended = context_ids, question_ids
    if not compressed:
        raise ValueError("empty prompt")
    chunk = resolve_prefill_chunk(prefill_chunk, device, len(compressed)) or len(compressed)
    session.record.prefill_chunk = chunk if chunk < len(compressed) else 0

    start = time.perf_counter()
    session.begin_prefill(len(compressed), prompt_ids=compressed)
    for first in range(0, len(compressed), chunk):
        logits = _forward(model, compressed[first : first + chunk], first, cache, session, device)
    position = len(compressed)
    if appended:
        session.begin_append()
        logits = _forward(model, appended, position, cache, session, device)
        position += len(appended)
    session.begin_decode()
    _sync(devices)
    prefill_s = time.perf_counter() - start

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
        logits = _forward(model, [next_id], position, cache, session, device)
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
