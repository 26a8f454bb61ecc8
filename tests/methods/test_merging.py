"""MergingPress (merge-on-evict over any scorer, issue #58) against NVIDIA/kvpress 0.5.5's recordings: per case,
layer and head, kvbench keeps kvpress's tokens and its cache holds kvpress's merged values, float32 and bfloat16, on
the torch and paged backends; a merging method stores the bytes an evicting one stores at the same kept count."""

from __future__ import annotations

import pytest
import torch

from kvbench.budget import parse_budget
from kvbench.cache.kv_cache import KVBenchCache
from kvbench.eviction.base import WindowObservation, build_method
from kvbench.inference.eviction import EvictionSession
from tests.methods.helpers import LayerIndex
from tests.methods.wrapper_replay import KeptTally, recent_queries_observation
from tests.parity.kvpress_claims import Claim, claim_of
from tests.reference_recordings import (
    boundary_tie,
    case_inputs,
    is_valid_topk,
    kvpress_n_kept,
    load_recording,
    recorded_kept_values,
)

SNAPKV_KVPRESS = {"kernel_size": 5, "pooling": "avg", "pool_padding": "include", "gqa_reduce": "after_pool"}
SNAPKV_KVPRESS |= {"score_dtype": "model", "row_reduce": "mean"}


def merging(press: str = "knorm", window: int = 64, **params) -> object:
    params = {"press": press, **params}
    return build_method({"name": "merging", "family": "merging", "window": window, "params": params})


def compress(method, observation: WindowObservation, budget: str, backend: str = "torch") -> KVBenchCache:
    """kvbench's session over one layer holding ``observation``'s keys and values."""
    cache = KVBenchCache(1, backend=backend)
    cache.update(observation.keys[None], observation.values[None], 0)
    session = EvictionSession(method, parse_budget(budget), cache)
    session.begin_prefill(observation.keys.shape[1])
    session.after_attention(LayerIndex(0), observation.queries[None], observation.scaling)
    session.begin_decode()
    return cache


RECORDINGS = ["MergingPress_KnormPress", "MergingPress_KnormPress_gated", "MergingPress_SnapKVPress"]


def replay_merging(claim: Claim, form: str, dtype: str) -> KeptTally:
    """Every case of the claim's recording in ``dtype`` at ``budget=<max(1, int(S (1 - r)))>/layer`` (``form``: only
    ``per_layer``), the torch and paged backends alternately: per layer and head ``same`` = kvpress's positions, its
    unchanged keys and its merged values, all bit for bit; ``tied`` = another valid top-k of kvpress's scores tied at
    the cut (kvpress's topk keeps the earlier, kvbench the later: the merged values then differ and are not compared);
    else different."""
    assert form == "per_layer", form
    knobs = dict(claim.knobs)
    window = knobs["window"]  # the observation window of the wrapped press's queries
    recording = load_recording(claim.recording)
    values_of = recorded_kept_values(claim.recording)
    score_press = "SnapKVPress" if knobs["press"] == "snapkv" else "KnormPress"
    tally = KeptTally()
    for index, case in enumerate(recording.cases):
        if case.dtype != dtype:
            continue
        tally.cases += 1
        gate = {key: case.settings[key] for key in ("similarity_threshold", "merge_fraction")}
        method = claim.build(**gate)
        n_kept = kvpress_n_kept(case.length, case.compression_ratio)
        backend = "paged" if index % 2 else "torch"  # both storage backends, alternately
        for layer, inputs in enumerate(case_inputs(case)):
            keys = inputs["keys"][0]
            observation = recent_queries_observation(case, layer, inputs, window)
            stored = compress(method, observation, f"{n_kept}/layer", backend).headwise_layers[0]
            for head, reference in enumerate(case.kept[layer]):
                positions = stored.positions[head].tolist()
                if positions != sorted(reference):
                    scores = case.layer_scores(layer, score_press)[head]
                    tied = boundary_tie(scores, n_kept) and is_valid_topk(scores, positions)
                    tally.tied_valid, tally.differ = tally.tied_valid + tied, tally.differ + (not tied)
                    continue
                order = torch.tensor(reference).argsort()
                ours_keys, ours_values = stored.head_kv(head)
                same = torch.equal(ours_values.float(), values_of[index][layer][head][order])
                same = same and torch.equal(ours_keys, keys[head, sorted(reference)])  # keys unchanged
                tally.same, tally.differ = tally.same + same, tally.differ + (not same)
    return tally


@pytest.mark.parametrize("press", RECORDINGS)
def test_merging_keeps_kvpress_tokens_and_merged_values(press: str) -> None:
    tallies = [replay_merging(claim_of(press), "per_layer", dtype) for dtype in ("float32", "bfloat16")]
    assert all(t.differ == 0 for t in tallies), tallies
    recording = load_recording(press)
    assert sum(t.selections for t in tallies) == sum(len(case.kept) * 2 for case in recording.cases)
    # Ties at the cut: SnapKV's window when the budget is below it (S=48 at 0.75 and 0.875), bfloat16 scores
    assert sum(t.tied_valid for t in tallies) == (18 if press.endswith("SnapKVPress") else 0)  # of 32


def test_merging_stores_what_evicting_stores_at_the_same_kept_count() -> None:
    keys = torch.randn(2, 64, 16, generator=torch.Generator().manual_seed(0))
    values = torch.randn(2, 64, 16, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    observation = WindowObservation(0, 1, keys[:, -1:], keys.to(torch.bfloat16), values, 0.25)
    knorm = build_method({"name": "knorm", "family": "knorm"})
    for backend in ("torch", "paged"):
        evicting = compress(knorm, observation, "24/layer", backend)
        merged = compress(merging(), observation, "24/layer", backend)
        assert merged.stored_bytes() == evicting.stored_bytes() > 0
        assert merged.allocated_bytes() == evicting.allocated_bytes()
        layer, plain = merged.headwise_layers[0], evicting.headwise_layers[0]
        assert layer.positions[0].tolist() == plain.positions[0].tolist()
        assert not torch.equal(layer.head_kv(0)[1], plain.head_kv(0)[1])  # values no token produced
