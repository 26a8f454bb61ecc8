"""Log-likelihood of continuations on top of a context that is prefilled and compressed once.

This is the torch side of the lm-eval bridge (:mod:`kvbench.lmeval.model`); it does not import lm-eval.

Protocol, for one context and any number of continuations (the choices of a multiple-choice question):

1. the *compressed prompt* is prefilled through kvbench's eviction session (the method applied at the budget,
   through :func:`kvbench.inference.prefill.prefill`, as the runner) -- once per distinct context;
2. each continuation is scored on a copy of that compressed cache (``copy.deepcopy``: the compressed cache itself
   is never written to, never recomputed), in one forward of the *tail* + ``continuation[:-1]``; the log-softmax of
   the logits gives the continuation tokens' log-probabilities and the greedy check, as lm-eval's ``hf`` model.

``question_mode`` decides where the compressed prompt ends (lm-eval gives one context string, question included):

* ``agnostic`` (default): the compressed prompt is ``context[:-1]``; the tail is the context's last token, so
  *every* continuation token is predicted from the compressed cache (the last context token's query included).
* ``aware``: the compressed prompt is the whole context and there is no tail.  The first continuation token is
  predicted by the prefill's last position, which attends to the full context (a layer is compressed only after its
  attention), as the first generated token of every prefill-eviction method; later tokens see the compressed cache.
  A one-token continuation therefore gets its full-cache score at every budget.

Compressing the continuation itself (context + continuation prefix in the compressed prompt) would make every scored
position a prefill position, i.e. full attention before eviction: identical to the full cache at any budget, so it is
not offered.  The continuation is fed in one forward without decode-time eviction (H2O/TOVA/AhaKV evict only after
each generated token; a continuation scored in one forward sees the compressed context plus itself).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel

from kvbench.budget import Budget
from kvbench.cache.kv_cache import KVBenchCache
from kvbench.checks import check_choice
from kvbench.config import QUESTION_MODES
from kvbench.eviction.base import EvictionMethod
from kvbench.inference.eviction import CacheRecord
from kvbench.inference.prefill import build_cache, forward_logits, prefill
from kvbench.inference.shared_context import cache_fingerprint
from kvbench.models.loading import input_device


@dataclass
class CompressedContext:
    """One context after its compressed prefill (shared, read-only, by every continuation scored on it).

    Attributes
    ----------
    cache:
        The compressed cache; continuations are scored on deep copies of it.
    record:
        The eviction session's record (requested / achieved sizes) of the compressed prompt.
    position:
        Tokens seen so far (the position of the next token fed).
    tail:
        Context tokens fed on top of the cache before the continuation (``agnostic``: the last context token).
    first_logits:
        ``[vocab]`` logits predicting the first continuation token when there is no tail (``aware``), else ``None``.
    fingerprint:
        Hash of the kept positions of every layer and head: equal fingerprints, equal compressed caches.
    prefill_s:
        Seconds spent in the compressed prefill.
    """

    cache: KVBenchCache
    record: CacheRecord
    position: int
    tail: list[int]
    first_logits: torch.Tensor | None
    fingerprint: str
    prefill_s: float = 0.0
    scored: int = field(default=0)


@torch.inference_mode()
def compress_context(
    model: PreTrainedModel,
    context_ids: list[int],
    *,
    method: EvictionMethod,
    budget: Budget,
    question_mode: str = "agnostic",
    prefill_chunk: int | None = None,
    dataset_state: Any = None,
    tokenizer: Any = None,
) -> CompressedContext:
    """Prefill ``context_ids`` with ``method`` applied at ``budget`` (see the module docstring for the split);
    ``dataset_state``: the method's state across the task's contexts (XKV's sampled mode), or ``None``;
    ``tokenizer``: for a method that replays the context (KVzip's repeat prompt)."""
    check_choice("question_mode", question_mode, QUESTION_MODES)
    if not context_ids:
        raise ValueError("empty context: lm-eval passes at least the prefix token")
    compressed, tail = (context_ids, []) if question_mode == "aware" else (context_ids[:-1], context_ids[-1:])
    cache = build_cache(model, method)
    if not compressed:  # a one-token context in agnostic mode: nothing to compress
        return CompressedContext(cache, CacheRecord(), 0, tail, None, cache_fingerprint(cache))
    state = prefill(
        model,
        compressed,
        method=method,
        budget=budget,
        prefill_chunk=prefill_chunk,
        cache=cache,
        dataset_state=dataset_state,
        tokenizer=tokenizer,
    )
    record = state.session.finish()
    device = input_device(model)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - state.started
    logits = state.logits
    assert logits is not None
    first_logits = logits if not tail else None
    return CompressedContext(
        cache, record, state.position, tail, first_logits, cache_fingerprint(cache), prefill_s=elapsed
    )


@torch.inference_mode()
def score_continuation(
    model: PreTrainedModel, context: CompressedContext, continuation_ids: list[int]
) -> tuple[float, bool]:
    """``(log-probability of continuation_ids, whether greedy decoding produces it)`` on a copy of the
    compressed cache, as lm-eval's ``hf`` model: ``log_softmax`` of the logits in their own dtype, summed over the
    continuation tokens; greedy when every continuation token is its position's argmax."""
    if not continuation_ids:
        raise ValueError("empty continuation")
    fed = context.tail + continuation_ids[:-1]
    rows: list[torch.Tensor] = []
    if context.first_logits is not None:
        rows.append(context.first_logits[None])
    if fed:
        cache = copy.deepcopy(context.cache)
        keep = len(continuation_ids) - len(rows)
        rows.append(forward_logits(model, fed, context.position, cache, None, input_device(model), keep=keep))
    logits = torch.cat(rows, dim=0) if len(rows) > 1 else rows[0]  # [len(continuation), vocab]
    log_probs = torch.log_softmax(logits, dim=-1)
    target = torch.tensor(continuation_ids, dtype=torch.long, device=logits.device)
    greedy = bool((log_probs.argmax(dim=-1) == target).all())
    context.scored += 1
    return float(log_probs.gather(1, target[:, None]).sum()), greedy
