"""How the runner generates a dataset's samples (issue #33): resolve ``run.decode_batch`` for the device; at 1, one
sample at a time (:func:`kvbench.inference.generate.generate`, the batch-1 path); above, with
:func:`kvbench.inference.batched_decode.generate_batched`, each prediction written in sample order through a
:class:`~kvbench.inference.batched_decode.ReorderBuffer`.

Writes are those of batch 1 (one row per sample, appended as soon as every earlier sample's row is written, under
the runner's termination guard): a run killed mid-batch loses at most the outputs still waiting for an earlier
sample, and the same command resumes it from the first missing sample, without duplicates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from kvbench.inference.batched_decode import DecodeRequest, ReorderBuffer, generate_batched, resolve_decode_batch
from kvbench.inference.generate import generate
from kvbench.run.job import DatasetJob


def stop_rules(dataset: Any, stops: set[int]) -> dict[str, Any]:
    """A dataset's per-sample stop rules, as keyword arguments of both :func:`~kvbench.inference.generate.generate`
    and :class:`~kvbench.inference.batched_decode.DecodeRequest`."""
    return {
        "max_new_tokens": int(dataset.max_new_tokens),
        "stop_token_ids": stops,
        "stop_strings": tuple(dataset.stop_strings),
        "min_new_tokens": int(dataset.min_new_tokens),
    }


def decode_batch_for(job: DatasetJob, loaded: Any, dataset: Any, todo: list[Any], encode: Callable[[Any], Any]) -> int:
    """``run.decode_batch`` resolved for the device (``auto``: from ``todo``'s prompt lengths and the memory the
    model leaves), for a run whose first generating dataset is ``dataset``."""
    return resolve_decode_batch(
        job.cfg.run.decode_batch, loaded.model, job.method, job.budget,
        lambda: [len(encode(sample).input_ids) for sample in todo], int(dataset.max_new_tokens),
    )  # fmt: skip


def generate_dataset(
    job: DatasetJob,
    loaded: Any,
    dataset: Any,
    todo: list[Any],
    encode: Callable[[Any], Any],
    write: Callable[[Any, Any, Any], None],
    stops: set[int],
    progress: Any,
) -> None:
    """Generate a dataset's remaining samples ``todo`` (in order) and ``write(sample, encoded, output)`` each, in sample
    order: one at a time (:func:`kvbench.inference.generate.generate`, the batch-1 path) when ``job.decode_batch``
    is 1, else :func:`run_batched`."""
    cfg = job.cfg
    if job.decode_batch > 1:
        run_batched(job, loaded, dataset, todo, encode, write, stops, progress)
        return
    for sample in progress:
        encoded = encode(sample)
        output = generate(
            loaded.model,
            loaded.tokenizer,
            encoded.context_ids,
            encoded.question_ids,
            method=job.method,
            budget=job.budget,
            question_mode=str(cfg.task.question_mode),
            prefill_chunk=cfg.run.prefill_chunk,
            **stop_rules(dataset, stops),
        )
        write(sample, encoded, output)


def run_batched(
    job: DatasetJob,
    loaded: Any,
    dataset: Any,
    todo: list[Any],
    encode: Callable[[Any], Any],
    write: Callable[[Any, Any, Any], None],
    stops: set[int],
    progress: Any,
) -> None:
    """Generate ``todo`` (a dataset's samples not yet in ``predictions.jsonl``, in order) in batches of
    ``job.decode_batch``; ``write(sample, encoded, output)`` is called in sample order; ``progress`` (a
    progress bar or the plain list) counts written samples."""
    cfg = job.cfg
    encoded_by_index: dict[int, Any] = {}
    rules = stop_rules(dataset, stops)

    def requests() -> Iterator[DecodeRequest]:
        for index, sample in enumerate(todo):
            encoded = encode(sample)
            encoded_by_index[index] = encoded
            yield DecodeRequest(encoded.context_ids, encoded.question_ids, **rules)

    buffer = ReorderBuffer()
    outputs = generate_batched(
        loaded.model,
        loaded.tokenizer,
        requests(),
        method=job.method,
        budget=job.budget,
        question_mode=str(cfg.task.question_mode),
        decode_batch=job.decode_batch,
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
