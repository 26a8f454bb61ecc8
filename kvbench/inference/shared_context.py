"""Compress once, ask many: one shared context prefilled and compressed once, then several queries answered from it
(SCBench's multi-request and multi-turn modes, microsoft/MInference ``scbench/eval_utils.py`` ``GreedySearch``).

The reference protocol (MInference's KV-compression caches, ``minference/modules/kvcompression.py``
``BaseKVCache.update``): the *first* forward of a conversation is compressed by the method; every later forward
(follow-up prompts, generated tokens) is appended uncompressed; generated tokens go to a temporary cache that is
dropped after the turn (``clear_temp_kv_cache``), so the next prompt starts right after the last kept prompt token.

* ``multi_request`` (SCBench ``--same_context_different_query``, ``test_scdq``): the context alone is compressed
  (question-agnostic, whatever the query); each query and its answer are fed on a copy of the compressed state and
  dropped: every query sees the same compressed context.
* ``multi_turn`` (SCBench's default, ``test``): the first prompt (context + first query, ``first_query="aware"``,
  SCBench's protocol; or the context alone with the first query appended, ``"agnostic"``) is compressed; each later
  turn's prompt (the previous turn's golden answer and the next query, SCBench's golden context) is appended to the
  shared state -- uncompressed, but a decode-time method (H2O, TOVA, ...) evicts on append as it does on any
  appended question -- and its answer generated on a copy that is dropped afterwards.

Copies are ``copy.deepcopy`` of the cache *and* the eviction session (the session owns the sample's decode-time
state, which travels with the cache; the method, a frozen recipe, is shared, not copied), as the lm-eval bridge
copies a compressed cache per continuation (:mod:`kvbench.lmeval.loglikelihood`).  The compressed prefill runs
exactly once per group: :func:`prefill` is called once, and :attr:`GroupOutput.context_fingerprint` hashes the kept
positions right after it.
"""

from __future__ import annotations

import copy
import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from kvbench.budget import Budget
from kvbench.cache.kv_cache import KVBenchCache
from kvbench.checks import check_choice
from kvbench.eviction.base import EvictionMethod
from kvbench.inference.eviction import EvictionSession
from kvbench.inference.generate import GenerationOutput, GreedyStream, decode_stream, sync_devices
from kvbench.inference.prefill import forward_logits, prefill
from kvbench.models.loading import input_device, model_devices

#: How the queries of a context group share its compressed context.
GROUP_MODES = ("multi_turn", "multi_request")
#: Whether the first query of a multi-turn group is compressed with the context.
FIRST_QUERY_MODES = ("aware", "agnostic")


def cache_fingerprint(cache: KVBenchCache) -> str:
    """SHA-256 (first 16 hex) of every layer's and head's kept token positions (what eviction decided)."""
    digest = hashlib.sha256()
    for layer in cache.headwise_layers:
        for positions in getattr(layer, "positions", []) or []:
            digest.update(positions.detach().to("cpu", torch.int64).numpy().tobytes())
            digest.update(b"|")
        digest.update(b"#")
    return digest.hexdigest()[:16]


@dataclass
class GroupTurn:
    """One query of a context group: ``prompt_ids`` fed on the shared state (multi-turn: the turn's follow-up prompt;
    the first turn's are the first query), then greedy decoding (or ``sampling``) under the stop rules."""

    prompt_ids: list[int]
    max_new_tokens: int
    stop_token_ids: set[int]
    stop_strings: tuple[str, ...] = ()
    min_new_tokens: int = 0
    sampling: Any = None


@dataclass
class GroupOutput:
    """A context group's answers, one :class:`GenerationOutput` per turn (each with the record of its own copy), the
    hash of the positions kept by the one compression (``context_fingerprint``; the positions themselves in
    ``kept_positions`` when asked for: ``[layer][head] -> positions``) and the number of compressed prefills (1)."""

    turns: list[GenerationOutput]
    context_fingerprint: str
    compressed_tokens: int
    prefills: int = 1
    kept_positions: list[list[list[int]]] = field(default_factory=list)


def _state_copy(cache: KVBenchCache, session: EvictionSession) -> tuple[KVBenchCache, EvictionSession]:
    """An independent copy of the shared state (one memo: the copied session points at the copied cache)."""
    return copy.deepcopy((cache, session))


def _decode_turn(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    cache: KVBenchCache,
    session: EvictionSession,
    logits: torch.Tensor,
    position: int,
    turn: GroupTurn,
    prefill_s: float,
) -> GenerationOutput:
    """Greedy decoding (the batch-1 loop of :func:`~kvbench.inference.generate.generate`) on a copied state."""
    devices, device = model_devices(model), input_device(model)
    session.begin_decode()
    start = time.perf_counter()
    stream = GreedyStream(
        tokenizer, turn.max_new_tokens, turn.stop_token_ids, turn.stop_strings, turn.min_new_tokens, turn.sampling
    )
    decode_stream(model, stream, logits, position, cache, session, device)
    sync_devices(devices)
    record = session.finish()
    return GenerationOutput(
        stream.generated, stream.text(), record, prefill_s, time.perf_counter() - start, stream.stop_reason
    )


@torch.inference_mode()
def generate_group(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    context_ids: Sequence[int],
    turns: Sequence[GroupTurn],
    *,
    method: EvictionMethod,
    budget: Budget,
    mode: str,
    first_query: str = "aware",
    prefill_chunk: int | None = None,
    keep_positions: bool = False,
    dataset_state: Any = None,
    kv_quant: Any = None,
) -> GroupOutput:
    """Answer every turn of one context group from one compressed prefill of ``context_ids`` (module docstring).

    ``mode``: one of :data:`GROUP_MODES`; ``first_query``: one of :data:`FIRST_QUERY_MODES` (multi-turn only: a
    multi-request group always compresses the context alone); ``keep_positions``: also return every layer's and
    head's kept positions after the compression (:attr:`GroupOutput.kept_positions`; tests, small caches); ``kv_quant``:
    quantized KV storage (:func:`kvbench.inference.prefill.build_cache`).  Returns one output per turn, in order.
    """
    check_choice("mode", mode, GROUP_MODES)
    check_choice("first_query", first_query, FIRST_QUERY_MODES)
    if not turns:
        raise ValueError("a context group needs at least one turn")
    device = input_device(model)
    first = turns[0]
    with_first = mode == "multi_turn" and first_query == "aware"
    question = list(first.prompt_ids) if mode == "multi_turn" and not with_first else []
    compressed = list(context_ids) + (list(first.prompt_ids) if with_first else [])
    state = prefill(
        model,
        compressed,
        question,
        method=method,
        budget=budget,
        question_mode="agnostic",
        prefill_chunk=prefill_chunk,
        dataset_state=dataset_state,
        tokenizer=tokenizer,
        kv_quant=kv_quant,
    )
    cache, session, position, logits = state.cache, state.session, state.position, state.logits
    session.begin_append()  # closes the compression (records it, starts the decode policies' layers) exactly once
    sync_devices(model_devices(model))
    prefill_s = time.perf_counter() - state.started
    fingerprint = cache_fingerprint(cache)
    kept = (
        [[p.tolist() for p in getattr(layer, "positions", [])] for layer in cache.headwise_layers]
        if keep_positions
        else []
    )
    outputs: list[GenerationOutput] = []
    for index, turn in enumerate(turns):
        started = time.perf_counter()
        if mode == "multi_request":
            # Each query on its own copy of the compressed context, dropped afterwards.
            turn_cache, turn_session = _state_copy(cache, session)
            turn_session.begin_append()
            turn_logits = forward_logits(model, turn.prompt_ids, position, turn_cache, turn_session, device)[-1]
            turn_position = position + len(turn.prompt_ids)
        else:
            if index > 0:  # the follow-up prompt joins the shared state (appended, never compressed)
                logits = forward_logits(model, turn.prompt_ids, position, cache, session, device)[-1]
                position += len(turn.prompt_ids)
            # The answer is generated on a copy and dropped: the next prompt starts right after this one.
            turn_cache, turn_session = _state_copy(cache, session)
            turn_logits, turn_position = logits, position
        assert turn_logits is not None
        turn_s = prefill_s if index == 0 else time.perf_counter() - started
        outputs.append(
            _decode_turn(model, tokenizer, turn_cache, turn_session, turn_logits, turn_position, turn, turn_s)
        )
    return GroupOutput(outputs, fingerprint, len(compressed), kept_positions=kept)
