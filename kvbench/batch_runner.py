"""How the runner generates a dataset's samples (issue #33): resolve ``run.decode_batch`` for the device; at 1, one
sample at a time (:func:`kvbench.generation.generate`, the batch-1 path); above, with
:func:`kvbench.batch_decode.generate_batched`, each prediction written in sample order through a
:class:`~kvbench.batch_decode.ReorderBuffer`.

Writes are those of batch 1 (one row per sample, appended as soon as every earlier sample's row is written, under
the runner's termination guard): a run killed mid-batch loses at most the outputs still waiting for an earlier
sample, and the same command resumes it from the first missing sample, without duplicates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from kvbench.batch_decode import DecodeRequest, ReorderBuffer, generate_batched
from kvbench.budget import Budget
from kvbench.checks import DECODE_BATCH_AUTO, check_decode_batch
from kvbench.generation import generate
from kvbench.methods.base import EvictionMethod
from kvbench.models import input_device

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
    the longest prompt (made while the others wait) holds its full cache and one layer's activations.  The result is
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
    prefill = layers * kv_heads * longest_prompt * token_bytes + activations
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


def generate_dataset(
    runner: Any,
    loaded: Any,
    dataset: Any,
    todo: list[Any],
    encode: Callable[[Any], Any],
    write: Callable[[Any, Any, Any], None],
    stops: set[int],
    progress: Any,
) -> None:
    """Generate a dataset's remaining samples ``todo`` (in order) and ``write(sample, encoded, output)`` each, in
    sample order: one at a time (:func:`kvbench.generation.generate`, the batch-1 path) when ``run.decode_batch``
    resolves to 1, else :func:`run_batched`.  ``run.decode_batch`` is resolved once per run (``auto``: from the
    first dataset that generates) into ``runner.resolved_decode_batch``."""
    cfg = runner.cfg
    if runner.resolved_decode_batch is None:
        runner.resolved_decode_batch = resolve_decode_batch(
            cfg.run.decode_batch, loaded.model, runner.method, runner.budget,
            lambda: [len(encode(sample).input_ids) for sample in todo], int(dataset.max_new_tokens),
        )  # fmt: skip
    if runner.resolved_decode_batch > 1:
        run_batched(runner, loaded, dataset, todo, encode, write, stops, progress)
        return
    for sample in progress:
        encoded = encode(sample)
        output = generate(
            loaded.model,
            loaded.tokenizer,
            encoded.context_ids,
            encoded.question_ids,
            method=runner.method,
            budget=runner.budget,
            question_mode=str(cfg.task.question_mode),
            max_new_tokens=int(dataset.max_new_tokens),
            stop_token_ids=stops,
            stop_strings=tuple(dataset.stop_strings),
            min_new_tokens=int(dataset.min_new_tokens),
            prefill_chunk=cfg.run.prefill_chunk,
        )
        write(sample, encoded, output)


def run_batched(
    runner: Any,
    loaded: Any,
    dataset: Any,
    todo: list[Any],
    encode: Callable[[Any], Any],
    write: Callable[[Any, Any, Any], None],
    stops: set[int],
    progress: Any,
) -> None:
    """Generate ``todo`` (a dataset's samples not yet in ``predictions.jsonl``, in order) in batches of
    ``runner.resolved_decode_batch``; ``write(sample, encoded, output)`` is called in sample order; ``progress`` (a
    progress bar or the plain list) counts written samples."""
    cfg = runner.cfg
    encoded_by_index: dict[int, Any] = {}

    def requests() -> Iterator[DecodeRequest]:
        for index, sample in enumerate(todo):
            encoded = encode(sample)
            encoded_by_index[index] = encoded
            yield DecodeRequest(
                encoded.context_ids,
                encoded.question_ids,
                max_new_tokens=int(dataset.max_new_tokens),
                stop_token_ids=stops,
                stop_strings=tuple(dataset.stop_strings),
                min_new_tokens=int(dataset.min_new_tokens),
            )

    buffer = ReorderBuffer()
    outputs = generate_batched(
        loaded.model,
        loaded.tokenizer,
        requests(),
        method=runner.method,
        budget=runner.budget,
        question_mode=str(cfg.task.question_mode),
        decode_batch=int(runner.resolved_decode_batch),
        prefill_chunk=cfg.run.prefill_chunk,
    )
    try:
        for index, output in outputs:
            for ready_index, ready in buffer.add(index, (index, output)):
                write(todo[ready_index], encoded_by_index.pop(ready_index), ready)
                if hasattr(progress, "update"):
                    progress.update(1)
    finally:
        if hasattr(progress, "close"):
            progress.close()
