"""Replay kvpress's recorded decoding presses (``DecodingPress``, ``CompressionRatioDecodingPress``,
``PrefillDecodingPress``; ``scripts/reference/record_kvpress_compositions.py``) through kvbench's
``method.params.decode_interval`` on the recorded tiny Llama, comparing **every compression step**.

Per case: the recorded prompt prefilled by kvbench's session (kept whole for a ``DecodingPress``, compressed at the
case's ratio for a ``PrefillDecodingPress``), the 4-token question in one forward, then single teacher-forced tokens,
as kvpress's pipeline ran them.  After each forward, at every layer where kvpress's cache lost tokens (a compression),
each KV head's kept positions are compared with kvpress's: the same, another valid top-k of kvpress's own scores of
that step (``tied``: the scores of that ``score()`` call, in kvpress's cache order), or different.  After a tie the
two caches hold different tokens and later steps of that case are not comparable: the replay stops that case there
(its remaining compressions are not counted).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from kvbench.budget import parse_budget
from kvbench.cache.kv_cache import KVBenchCache
from kvbench.eviction.base import EvictionMethod
from kvbench.inference.eviction import EvictionSession
from kvbench.inference.hidden_states import capture_decode_queries
from kvbench.inference.prefill import forward_logits, rotary_tables
from tests.methods.wrapper_replay import KeptTally
from tests.reference_recordings import RecordedCase, is_valid_topk, kvpress_n_kept, load_recording, stored_input

if TYPE_CHECKING:
    from tests.parity.kvpress_claims import Claim

QUESTION = 4  # the recorder's question forward; the rest of the decoding ids are single steps


def decoding_knobs(case: RecordedCase) -> tuple[dict[str, Any], float]:
    """The ``method.params`` (and ``window``) of a recorded decoding press, and its prefill's compression ratio (0:
    the prompt kept whole)."""
    settings = case.settings
    prefill_ratio = 0.0
    if settings["class"] == "PrefillDecodingPress":
        prefill_ratio, settings = case.compression_ratio, settings["decoding_press"]
    knobs: dict[str, Any] = {"decode_interval": settings["compression_interval"]}
    if settings["class"] == "CompressionRatioDecodingPress":
        knobs["decode_ratio"] = settings["target_compression_ratio"]
    else:
        knobs["decode_target"] = settings["target_size"]
    if "window_size" in settings["base_press"]:
        knobs["window"] = settings["base_press"]["window_size"]
    return knobs, prefill_ratio


def tiny_llama(dtype: str):
    from tests.methods.test_kvpress_decoding import tiny_llama as build

    return build(dtype)


def replay_decoding(claim: Claim, form: str, dtype: str) -> KeptTally:
    """Every case of the claim's recording in ``dtype``, the prefill budget spelled as ``form`` (``per_layer``:
    ``<max(1, int(S (1 - r)))>/layer``, ``cr``: ``<r>cr``)."""
    tally = KeptTally()
    for case in load_recording(claim.recording).cases:
        if case.dtype == dtype:
            tally.cases += 1
            replay_case(claim, case, form, tally)
    return tally


def replay_case(
    claim: Claim, case: RecordedCase, form: str, tally: KeptTally, method: EvictionMethod | None = None
) -> KVBenchCache:
    """One case (see :func:`replay_decoding`), with the claim's method plus the case's decoding knobs, or
    ``method`` as given; kvbench's cache at the end (or where the comparison stopped)."""
    from tests.parity.kvpress_claims import Claim as ClaimType

    knobs, prefill_ratio = decoding_knobs(case)
    if method is None:
        method = ClaimType(claim.recording, claim.method, (*claim.knobs, *knobs.items())).build()
    model = tiny_llama(case.dtype)
    budget = f"{prefill_ratio}cr" if form == "cr" else f"{kvpress_n_kept(case.length, prefill_ratio)}/layer"
    cache = KVBenchCache(len(case.kept))
    session = EvictionSession(method, parse_budget(budget), cache, rotary=rotary_tables(model))
    ids = stored_input(f"{case.inputs}/input_ids")[0].tolist()
    decoded = stored_input(case.decode_inputs).flatten().tolist()
    forwards = [decoded[:QUESTION]] + [[token] for token in decoded[QUESTION:]]
    calls: dict[int, list[torch.Tensor]] = {}
    for call in case.score_calls:  # per layer in call order: the prefilling press's, then each compression's
        calls.setdefault(call.layer, []).append(call.scores)
    device = torch.device("cpu")
    capture_decode_queries(model, session)  # the decoding forwards' q_proj, as kvbench's prefill() registers it
    with torch.no_grad():
        session.begin_prefill(len(ids))
        forward_logits(model, ids, 0, cache, session, device)
        if not _compare_step(case, 0, [list(range(len(ids)))] * 2, cache, calls, tally):
            session.finish()
            return cache
        position = len(ids)
        for index, tokens in enumerate(forwards):
            session.begin_append() if index == 0 else session.begin_decode()
            forward_logits(model, tokens, position, cache, session, device)
            new = list(range(position, position + len(tokens)))
            position += len(tokens)
            before = [[positions + new for positions in heads] for heads in case.steps[index]]  # [layer][head]
            if not _compare_step(case, index + 1, before, cache, calls, tally):
                break
    session.finish()
    return cache


def _compare_step(
    case: RecordedCase,
    step: int,
    before: list,
    cache: KVBenchCache,
    calls: dict[int, list[torch.Tensor]],
    tally: KeptTally,
) -> bool:
    """Compare kvbench's cache after forward ``step`` (0: the prefill) with kvpress's at every layer; a layer where
    kvpress's cache lost tokens is a compression (its heads counted same, tied or different), elsewhere the caches
    must hold the same tokens.  ``before``: per layer, kvpress's cache order before the step's compression (for the
    prefill one list of positions for every layer).  ``False`` once the caches part."""
    comparable = True
    for layer, heads in enumerate(case.steps[step]):
        order = before[layer] if step else [before[0]] * len(heads)
        ours = [sorted(p.tolist()) for p in cache.headwise_layers[layer].positions]
        if all(len(kept) == len(seen) for kept, seen in zip(heads, order, strict=True)):  # no compression here
            if ours != [sorted(seen) for seen in order]:
                tally.differ += len(heads)
                tally.differing_layers.add(layer)
                return False
            continue
        scores = calls[layer].pop(0)
        for head, kept in enumerate(heads):
            if ours[head] == sorted(kept):
                tally.same += 1
                continue
            comparable = False
            index = {position: i for i, position in enumerate(order[head])}
            chosen = [index.get(position, -1) for position in ours[head]]
            if len(chosen) == len(kept) and -1 not in chosen and is_valid_topk(scores[head], chosen):
                tally.tied_valid += 1
            else:
                tally.differ += 1
                tally.differing_layers.add(layer)
    return comparable
