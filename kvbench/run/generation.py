"""How the runner generates a dataset's samples (issue #33): resolve ``run.decode_batch`` for the device; at 1, one
sample at a time (:func:`kvbench.inference.generate.generate`, the batch-1 path); above, with
:func:`kvbench.inference.batched_decode.generate_batched`, each prediction written in sample order through a
:class:`~kvbench.inference.batched_decode.ReorderBuffer`.

Writes are those of batch 1 (one row per sample, appended as soon as every earlier sample's row is written, under
the runner's termination guard): a run killed mid-batch loses at most the outputs still waiting for an earlier
sample, and the same command resumes it from the first missing sample, without duplicates.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from omegaconf import DictConfig

from kvbench.inference.batched_decode import DecodeRequest, ReorderBuffer, generate_batched, resolve_decode_batch
from kvbench.inference.decode_pool import DECODE_PATHS
from kvbench.inference.generate import generate
from kvbench.run.job import DatasetJob


def stop_rules(dataset: Any, stops: set[int], sample_id: str | None = None) -> dict[str, Any]:
    """A dataset's per-sample stop rules and token choice, as keyword arguments of both
    :func:`~kvbench.inference.generate.generate` and :class:`~kvbench.inference.batched_decode.DecodeRequest`; a
    dataset that samples (``dataset.sampling``) gets a seed of its own per ``sample_id``."""
    sampling = getattr(dataset, "sampling", None)
    return {
        "max_new_tokens": int(dataset.max_new_tokens),
        "stop_token_ids": stops,
        "stop_strings": tuple(dataset.stop_strings),
        "min_new_tokens": int(dataset.min_new_tokens),
        "sampling": sampling.for_sample(sample_id or "") if sampling is not None else None,
    }


def _pass_record(encoded: Any, output: Any) -> dict[str, Any]:
    """One later pass of a multi-pass dataset, as stored in its prediction row."""
    return {
        "text": output.text,
        "input_tokens": len(encoded.input_ids),
        "new_tokens": len(output.token_ids),
        "stop_reason": output.stop_reason,
        "cache": output.record.to_json(),
    }


def decode_batch_for(job: DatasetJob, loaded: Any, dataset: Any, todo: list[Any], encode: Callable[[Any], Any]) -> int:
    """``run.decode_batch`` resolved for the device (``auto``: from ``todo``'s prompt lengths and the memory the
    model leaves), for a run whose first generating dataset is ``dataset``."""
    return resolve_decode_batch(
        job.cfg.run.decode_batch, loaded.model, job.method, job.budget,
        lambda: [len(encode(sample).input_ids) for sample in todo], int(dataset.max_new_tokens),
    )  # fmt: skip


#: ``metrics.json``'s ``settings.decode_path`` when samples decode one at a time (besides the batched
#: :data:`~kvbench.inference.decode_pool.POOLED` and :data:`~kvbench.inference.decode_pool.PER_SAMPLE`).
ONE_AT_A_TIME = "batch1"


def decode_path_settings(job: DatasetJob, dataset: Any, decoded: bool) -> dict[str, str | None]:
    """How the dataset's samples decoded, for ``metrics.json``'s settings (a recorded fact, not part of the config
    hash): ``decode_path`` -- ``batch1`` (one at a time), ``pooled`` (one page pool for the batch) or ``per_sample``
    (a batch whose attention and policy run per sample) -- and ``decode_path_reason``, why not pooled.  ``decoded``:
    whether this process decoded any of the dataset's samples (the batched path is the one that
    :func:`~kvbench.inference.batched_decode.generate_batched` noted in
    :data:`~kvbench.inference.decode_pool.DECODE_PATHS` since :func:`run_batched` began); ``None`` if none."""
    if dataset.context_groups is not None:
        return {"decode_path": ONE_AT_A_TIME, "decode_path_reason": "context groups decode one group at a time"}
    if job.decode_batch == 1:
        return {"decode_path": ONE_AT_A_TIME, "decode_path_reason": "run.decode_batch=1"}
    if getattr(dataset, "multi_pass", False):
        return {"decode_path": ONE_AT_A_TIME, "decode_path_reason": "multi-pass dataset (a pass reads the last text)"}
    taken = DECODE_PATHS.taken()
    if not decoded or not taken:
        reason = "no batch decoded in this process (its predictions were written before, or ended at once)"
        return {"decode_path": None, "decode_path_reason": reason}
    paths = sorted({path for path, _ in taken})
    reasons = sorted({reason for _, reason in taken if reason is not None})
    return {"decode_path": "+".join(paths), "decode_path_reason": "; ".join(reasons) or None}


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
    is 1 or the dataset is multi-pass (a later pass needs the earlier text), else :func:`run_batched`."""
    multi_pass = getattr(dataset, "multi_pass", False)
    if job.decode_batch > 1 and not multi_pass:
        run_batched(job, loaded, dataset, todo, encode, write, stops, progress)
        return
    for sample in progress:
        encoded = encode(sample)
        rules = stop_rules(dataset, stops, sample.id)
        output = _generate(job, loaded, encoded, rules)
        step = 1
        # A multi-pass dataset (LongBench v2's chain of thought) builds the next prompt from the text so far: each pass
        # is a fresh prefill, compressed by the method like any prompt, and recorded in the row's "later_passes".
        while multi_pass and (follow := dataset.follow_up(sample, output.final_text, step)) is not None:
            next_sample, max_new_tokens = follow
            next_encoded = encode(next_sample)
            next_rules = {**rules, **stop_rules(dataset, stops, f"{sample.id}#pass{step + 1}")}
            next_rules["max_new_tokens"] = int(max_new_tokens)
            later = _generate(job, loaded, next_encoded, next_rules)
            output.later_passes.append(_pass_record(next_encoded, later))
            step += 1
        write(sample, encoded, output)


def _generate(job: DatasetJob, loaded: Any, encoded: Any, rules: dict[str, Any]) -> Any:
    """One batch-1 generation of an encoded prompt under the job's method and budget."""
    return generate(
        loaded.model,
        loaded.tokenizer,
        encoded.context_ids,
        encoded.question_ids,
        method=job.method,
        budget=job.budget,
        question_mode=str(job.cfg.task.question_mode),
        prefill_chunk=job.cfg.run.prefill_chunk,
        dataset_state=job.dataset_state,
        kv_quant=job.cfg.get("kv_quant"),
        **rules,
    )


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

    def requests() -> Iterator[DecodeRequest]:
        for index, sample in enumerate(todo):
            encoded = encode(sample)
            encoded_by_index[index] = encoded
            yield DecodeRequest(encoded.context_ids, encoded.question_ids, **stop_rules(dataset, stops, sample.id))

    buffer = ReorderBuffer()
    DECODE_PATHS.reset()  # the path these samples' batches take (decode_path_settings)
    outputs = generate_batched(
        loaded.model,
        loaded.tokenizer,
        requests(),
        method=job.method,
        budget=job.budget,
        question_mode=str(cfg.task.question_mode),
        decode_batch=job.decode_batch,
        prefill_chunk=cfg.run.prefill_chunk,
        dataset_state=job.dataset_state,
        kv_quant=cfg.get("kv_quant"),
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


def progress_bar(items: Sequence[Any], desc: str, enabled: bool, initial: int, total: int, delay: float = 0.0) -> Any:
    """A progress bar over ``items`` on stderr (``run.progress``), shown after ``delay`` seconds."""
    if not enabled:
        return items
    from tqdm import tqdm

    return tqdm(
        items, desc=desc, initial=initial, total=total, leave=False, dynamic_ncols=True, file=sys.stderr, delay=delay
    )


LOG = logging.getLogger(__name__)
_WARNED_ABOVE_FULL: set[str] = set()


def warn_if_above_full(record: Any, cfg: DictConfig) -> None:
    """One warning per run (method x budget x model) when the stored cache exceeds the full cache's size."""
    key = f"{cfg.model.name}/{cfg.method.name}/{cfg.budget.name}"
    if record.exceeds_full_cache and key not in _WARNED_ABOVE_FULL:
        _WARNED_ABOVE_FULL.add(key)
        LOG.warning(
            "%s stores %d heads per layer (gqa_granularity=query_head, %d KV heads): its cache (%d bytes) exceeds "
            "the full cache's (%d bytes) at budget %s; method.params.gqa_granularity=kv_head stores one per KV head",
            cfg.method.name,
            record.stored_heads,
            record.kv_heads,
            record.stored_bytes,
            record.full_cache_bytes,
            cfg.budget.name,
        )
