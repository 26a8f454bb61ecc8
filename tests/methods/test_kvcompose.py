"""KVCompose (kvpress's ``KVComposePress``, structured and unstructured, issue #58) against NVIDIA/kvpress 0.5.5's
recordings.

* The allocation and selection: from kvpress's recorded scores, kvbench's ``select`` keeps kvpress's tokens on every
  layer and head of every case, float32 and bfloat16.
* The whole path (the recorded tiny Llama prefilled through kvbench's cache and attention, the context replayed
  once): kvpress forces eager attention for both forwards, and so does kvbench's session for KVCompose
  (``eager_attention``), so every layer's inputs and kvpress's scores are equal bit for bit and kvpress's tokens kept
  on every head, float32 and bfloat16 (with kvbench's SDPA path, bfloat16's layer-1 inputs rounded apart).
* Only KVCompose's prefill and replay attend eagerly (not its question or decoding, not another method), and it
  runs its own prefill in a sweep."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvbench.budget import parse_budget
from kvbench.cache.kv_cache import KVBenchCache
from kvbench.eviction.base import build_method
from kvbench.inference.eviction import EvictionSession
from kvbench.inference.prefill import feed_question, forward_logits
from kvbench.inference.replay import replay_context
from kvbench.inference.shared_prefill import PrefillJob, check_shareable
from tests.methods.reference_models import valid_topk
from tests.methods.test_kvpress_decoding import tiny_llama
from tests.methods.wrapper_replay import KeptTally, cases_in
from tests.parity.kvpress_claims import Claim, claim_of
from tests.reference_recordings import case_inputs, is_valid_topk, kvpress_n_kept, load_recording, stored_input

CASES = [("KVComposePress", True), ("KVComposePress_unstructured", False)]


def kvcompose(structured: bool, **params):
    params = {"structured": structured, **params}
    return build_method({"name": "kvcompose", "family": "kvcompose", "params": params})


@pytest.mark.parametrize(("press", "structured"), CASES)
def test_kvcompose_selects_kvpress_tokens_from_its_scores(press: str, structured: bool) -> None:
    """kvpress's enhanced scores (the head mean already added) through kvbench's allocation over layers and heads."""
    scorer = kvcompose(structured, add_mean_across_heads=False).scorer
    heads = 0
    for case in load_recording(press).cases:
        scores = [case.layer_scores(layer) for layer in range(len(case.kept))]
        total = kvpress_n_kept(case.length, case.compression_ratio) * len(scores) * scores[0].shape[0]
        kept = scorer.select(scores, total, None)  # type: ignore[union-attr]
        for layer, layer_kept in enumerate(kept):
            for head, positions in enumerate(layer_kept):
                reference, ours = sorted(case.kept[layer][head]), positions.tolist()
                assert len(ours) == len(reference), (case.inputs, case.dtype, case.compression_ratio, layer, head)
                assert ours == reference or is_valid_topk(scores[layer][head], ours), (case.inputs, layer, head)
                heads += 1
    assert heads == 64


def replay_kvcompose(claim: Claim, form: str, dtype: str) -> KeptTally:
    """Every case of the claim's recording in ``dtype`` through kvbench's prefill and one context replay at
    ``budget=<r>cr`` (``form``: only ``cr``): per layer and head kvpress's tokens, another valid top-k of kvpress's
    scores (``tied``; unstructured: one over every layer and head), or different."""
    assert form == "cr", form
    tally = KeptTally()
    for case in cases_in(claim.recording, dtype, tally):
        method = claim.build(structured=case.settings["structured"])
        model = tiny_llama(case.dtype)
        ids = stored_input(f"{case.inputs}/input_ids")[0].tolist()
        cache = KVBenchCache(2)
        session = EvictionSession(method, parse_budget(f"{case.compression_ratio}cr"), cache)
        with torch.no_grad():
            session.begin_prefill(len(ids))
            forward_logits(model, ids, 0, cache, session, torch.device("cpu"))
            replay_context(model, session, ids, object(), torch.device("cpu"), forward_logits)
        assert session.record.extra_forwards == 1
        scores = torch.stack([case.layer_scores(layer) for layer in range(len(case.kept))])  # [L, H, S]
        ours = torch.zeros(scores.shape, dtype=torch.bool)
        for layer, stored in enumerate(cache.headwise_layers):
            for head, positions in enumerate(stored.positions):
                ours[layer, head, positions.long()] = True
        # Unstructured: one top-k over every layer and head, so a head's count may move between tied heads.
        kept_total = sum(len(head) for layer in case.kept for head in layer)
        over_all = not case.settings["structured"] and int(ours.sum()) == kept_total and valid_topk(scores, ours)
        for layer, stored in enumerate(cache.headwise_layers):
            for head, reference in enumerate(case.kept[layer]):
                positions = stored.positions[head].tolist()
                if positions == sorted(reference):
                    tally.same += 1
                elif over_all or (len(positions) == len(reference) and is_valid_topk(scores[layer, head], positions)):
                    tally.tied_valid += 1
                else:
                    tally.differ += 1
                    tally.differing_layers.add(layer)
    return tally


@pytest.mark.parametrize("press", sorted(dict(CASES)))
def test_kvcompose_replays_the_context_and_keeps_kvpress_tokens(press: str) -> None:
    tallies = {dtype: replay_kvcompose(claim_of(press), "cr", dtype) for dtype in ("float32", "bfloat16")}
    for tally in tallies.values():  # eager attention as kvpress's: every selection the same, bfloat16 too
        assert tally.cases == 8 and tally.same == 32 and tally.tied_valid == tally.differ == 0, tallies


def forwards_of(model: torch.nn.Module, ids: list[int], method: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """kvbench's prefill of ``ids`` and one replay through ``method``'s session: per layer the attention module's
    prefill input ``[1, S, hidden]`` (what kvpress's recorder saw) and the replay scores ``[H, S]`` (float32)."""
    inputs: dict[int, torch.Tensor] = {}

    def first_input(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        inputs.setdefault(int(module.layer_idx), kwargs["hidden_states"].detach().clone())

    hooks = [layer.self_attn.register_forward_pre_hook(first_input, with_kwargs=True) for layer in model.model.layers]
    cache = KVBenchCache(len(model.model.layers))
    session = EvictionSession(method, parse_budget("0.5cr"), cache)
    try:
        with torch.no_grad():
            session.begin_prefill(len(ids))
            forward_logits(model, ids, 0, cache, session, torch.device("cpu"))
            session.begin_replay(0, len(ids))  # replay_context's one pass, its scores read before the eviction
            forward_logits(model, ids, len(ids), cache, session, torch.device("cpu"))
            session.end_replay()
    finally:
        for hook in hooks:
            hook.remove()
    return [inputs[layer] for layer in sorted(inputs)], [session._replay_scores[layer] for layer in sorted(inputs)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kvcompose_forwards_equal_kvpress_eager_ones_bit_for_bit(dtype: str) -> None:
    """Each layer's prefill input and the replay's scores (the head mean added, as kvpress's ``enhance_scores``) equal
    kvpress's recorded ones bit for bit: with kvbench's SDPA path layer 1's inputs differ (bfloat16 by up to 0.03,
    float32 in the last bits) and with them its scores."""
    model = tiny_llama(dtype)
    cases = [c for c in load_recording("KVComposePress").cases if c.dtype == dtype and c.compression_ratio == 0.5]
    assert len(cases) == 2  # S = 48 and 128 (the scores do not depend on the ratio)
    for case in cases:
        recorded = case_inputs(case)
        inputs, scores = forwards_of(model, recorded[0]["input_ids"][0].tolist(), kvcompose(True))
        for layer, (ours, theirs) in enumerate(zip(inputs, recorded, strict=True)):
            assert torch.equal(ours, theirs["hidden_states"].to(ours.dtype)), (case.inputs, layer)
            enhanced = scores[layer] + scores[layer].mean(dim=0, keepdim=True)
            assert torch.equal(enhanced, case.layer_scores(layer)), (case.inputs, layer)


def test_only_kvcompose_prefill_and_replay_attend_eagerly() -> None:
    """The session's ``eager_attention`` (read by kvbench's attention function) per forward: KVCompose's prefill and
    replay, not its question or decoding steps, not at a full budget, never for another method; and kvcompose runs its
    own prefill in a sweep (a shared one attends through SDPA)."""
    model = tiny_llama("float32")
    ids = list(range(5, 29))

    def eager_per_forward(method: Any, budget: str) -> list[bool]:
        seen: list[bool] = []
        cache = KVBenchCache(2)
        session = EvictionSession(method, parse_budget(budget), cache)

        def note(module: torch.nn.Module, args: tuple) -> None:
            if module.layer_idx == 0:
                seen.append(session.eager_attention)

        hooks = [layer.self_attn.register_forward_pre_hook(note) for layer in model.model.layers]
        try:
            with torch.no_grad():
                session.begin_prefill(len(ids))
                forward_logits(model, ids, 0, cache, session, torch.device("cpu"))
                feed_question(model, session, ids, [7, 8, 9], object())  # the replay, then the question
                session.begin_decode()
                forward_logits(model, [10], len(ids) + 3, cache, session, torch.device("cpu"))
        finally:
            for hook in hooks:
                hook.remove()
        return seen

    assert eager_per_forward(kvcompose(True), "0.5cr") == [True, True, False, False]
    assert eager_per_forward(kvcompose(False), "full") == [False, False, False]  # nothing evicted: plain attention
    knorm = build_method({"name": "knorm", "family": "knorm"})
    assert eager_per_forward(knorm, "0.5cr") == [False, False, False]
    assert kvcompose(True).unshared_prefill and knorm.unshared_prefill is None
    with pytest.raises(ValueError, match="cannot share a prefill: its prefill attends eagerly"):
        check_shareable([PrefillJob(kvcompose(True), parse_budget("0.5cr"))])
