"""DMS (kvpress's ``DMSPress``) and the threshold budget form (issue #58) against NVIDIA/kvpress 0.5.5's recordings:
every recorded tiny-Llama case, float32 and bfloat16, keeps kvpress's tokens per layer and head, at a threshold budget
``<t>thr``; while decoding (``decoding: true``), the question and 10 single steps too."""

from __future__ import annotations

import pytest
import torch

from kvbench.budget import BudgetError, parse_budget
from kvbench.cache.kv_cache import KVBenchCache
from kvbench.eviction.base import WindowObservation, build_method
from kvbench.eviction.threshold import threshold_counts
from kvbench.inference.eviction import EvictionSession
from tests.methods.helpers import LayerIndex
from tests.methods.wrapper_replay import KeptTally, cases_in, recent_queries_observation, tally_exact
from tests.parity.kvpress_claims import Claim, claim_of
from tests.reference_recordings import case_inputs, load_recording

SNAPKV_KVPRESS = {"kernel_size": 5, "pooling": "avg", "pool_padding": "include", "gqa_reduce": "after_pool"}
SNAPKV_KVPRESS |= {"score_dtype": "model", "row_reduce": "mean"}  # kvpress averages the window rows


def dms(press: str = "knorm", window: int = 64, **params) -> object:
    return build_method({"name": "dms", "family": "dms", "window": window, "params": {"press": press, **params}})


def kept_one_layer(method, observation: WindowObservation, threshold: float) -> list[list[int]]:
    """kvbench's session over one layer holding ``observation``'s keys and values at ``budget=<t>thr``."""
    cache = KVBenchCache(1)
    cache.update(observation.keys[None], observation.values[None], 0)
    session = EvictionSession(method, parse_budget(f"{threshold}thr"), cache)
    session.begin_prefill(observation.keys.shape[1])
    session.after_attention(LayerIndex(0), observation.queries[None], observation.scaling)
    session.begin_decode()
    return [sorted(p.tolist()) for p in cache.headwise_layers[0].positions]


def replay_dms(claim: Claim, form: str, dtype: str) -> KeptTally:
    """Every prefill case of the claim's recording in ``dtype`` at ``budget=<t>thr`` (``form``: only ``thr``, t the
    case's threshold): per layer and head kvpress's kept positions exactly (its scores below the threshold, outside the
    sliding window, evicted), or different; the kept fraction is kvpress's measured compression ratio (asserted)."""
    assert form == "thr", form
    window = dict(claim.knobs)["window"]  # the observation window of the wrapped press's queries
    tally = KeptTally()
    for case in cases_in(claim.recording, dtype, tally):
        method = claim.build(sliding_window_size=case.settings["sliding_window_size"])
        kept_total = 0
        for layer, inputs in enumerate(case_inputs(case)):
            observation = recent_queries_observation(case, layer, inputs, window)
            kept = kept_one_layer(method, observation, case.settings["threshold"])
            tally_exact(tally, kept, case.kept[layer])
            kept_total += sum(map(len, kept))
        masked = 1 - kept_total / (len(case.kept) * len(case.kept[0]) * case.length)
        assert masked == pytest.approx(case.compression_ratio, abs=1e-9), (case.inputs, case.dtype)
    return tally


@pytest.mark.parametrize("press", ["DMSPress_KnormPress", "DMSPress_SnapKVPress"])
def test_dms_prefill_keeps_kvpress_tokens(press: str) -> None:
    tallies = [replay_dms(claim_of(press), "thr", dtype) for dtype in ("float32", "bfloat16")]
    assert all(t.differ == 0 for t in tallies), tallies
    assert sum(t.selections for t in tallies) == len(load_recording(press).cases) * 4


def replay_dms_decoding(claim: Claim, form: str, dtype: str) -> KeptTally:
    """``DMSPress(KnormPress, sliding_window_size=8, decoding=True)`` (the claim's recording), every case in ``dtype``
    at ``budget=<t>thr``: the prompt under the press, then the question in one forward and single steps, each token
    leaving the window evicted below the threshold; per layer and head of the final cache, kvpress's positions or
    different."""
    from kvbench.inference.prefill import forward_logits
    from tests.methods.test_kvpress_decoding import QUESTION, tiny_llama
    from tests.reference_recordings import stored_input

    assert form == "thr", form
    tally = KeptTally()
    for case in cases_in(claim.recording, dtype, tally):
        settings = case.settings
        method = claim.build(sliding_window_size=settings["sliding_window_size"], decoding=settings["decoding"])
        model = tiny_llama(case.dtype)
        ids = stored_input(f"{case.inputs}/input_ids")[0].tolist()
        decoded = stored_input(f"decode_ids/S{case.length}").flatten().tolist()
        cache = KVBenchCache(2)
        session = EvictionSession(method, parse_budget(f"{case.settings['threshold']}thr"), cache)
        device = torch.device("cpu")
        with torch.no_grad():
            session.begin_prefill(len(ids))
            forward_logits(model, ids, 0, cache, session, device)
            session.begin_append()
            forward_logits(model, decoded[:QUESTION], len(ids), cache, session, device)
            session.begin_decode()
            for step, token in enumerate(decoded[QUESTION:]):
                forward_logits(model, [token], len(ids) + QUESTION + step, cache, session, device)
        for stored, recorded in zip(cache.headwise_layers, case.kept, strict=True):
            tally_exact(tally, stored.positions, recorded)
    return tally


def test_dms_decoding_keeps_kvpress_tokens() -> None:
    claim = claim_of("DMSPress_KnormPress_decoding")
    tallies = [replay_dms_decoding(claim, "thr", dtype) for dtype in ("float32", "bfloat16")]
    assert all(t.differ == 0 and t.same == t.cases * 4 > 0 for t in tallies), tallies


def test_threshold_budget_parses_and_is_refused_where_it_means_nothing() -> None:
    budget = parse_budget("-3.0thr")
    assert (budget.kind, budget.value, budget.is_threshold) == ("threshold", -3.0, True)
    assert parse_budget("1e-3thr").value == 0.001
    with pytest.raises(BudgetError, match="thr"):
        parse_budget("thr")
    cache = KVBenchCache(1)
    with pytest.raises(ValueError, match=r"'<t>thr'"):  # a size for a threshold method names the threshold form
        EvictionSession(dms(), parse_budget("64L"), cache)
    knorm = build_method({"name": "knorm", "family": "knorm"})
    with pytest.raises(ValueError, match=r"only threshold methods"):
        EvictionSession(knorm, parse_budget("-3.0thr"), cache)
    EvictionSession(dms(), parse_budget("full"), cache)  # full: no eviction, for every method


def test_threshold_counts_compare_in_the_scores_dtype() -> None:
    """kvpress compares ``scores < threshold`` in the scores' dtype: a bfloat16 score equal to the rounded
    threshold is kept, though it is below the float32 threshold."""
    threshold = 0.008
    rounded = torch.tensor(threshold, dtype=torch.bfloat16)
    padded = torch.tensor([[rounded.float().item(), 1.0, float("-inf")]])
    assert rounded.float().item() < threshold
    assert threshold_counts(padded, threshold, torch.bfloat16) == [2]
    assert threshold_counts(padded, threshold, torch.float32) == [1]
