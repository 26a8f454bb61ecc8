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
from tests.methods.kvpress_replay import model_queries
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


@pytest.mark.parametrize(
    ("press", "family", "window", "params"),
    [
        ("MergingPress_KnormPress", "knorm", 1, {}),
        ("MergingPress_KnormPress_gated", "knorm", 1, {"similarity_threshold": 0.1, "merge_fraction": 0.75}),
        ("MergingPress_SnapKVPress", "snapkv", 16, SNAPKV_KVPRESS),
    ],
)
def test_merging_keeps_kvpress_tokens_and_merged_values(press: str, family: str, window: int, params: dict) -> None:
    recording = load_recording(press)
    values_of = recorded_kept_values(press)
    method = merging(family, window, **params)
    score_press = "SnapKVPress" if family == "snapkv" else "KnormPress"
    heads = tied = 0
    for index, case in enumerate(recording.cases):
        n_kept = kvpress_n_kept(case.length, case.compression_ratio)
        backend = "paged" if index % 2 else "torch"  # both storage backends, alternately
        for layer, inputs in enumerate(case_inputs(case)):
            keys, values = inputs["keys"][0], inputs["values"][0]
            queries = model_queries(case, layer, inputs)[:, -window:] if case.kind == "model" else keys[:, -1:]
            observation = WindowObservation(layer, 2, queries, keys, values, keys.shape[-1] ** -0.5)
            stored = compress(method, observation, f"{n_kept}/layer", backend).headwise_layers[0]
            where = (case.inputs, case.dtype, case.compression_ratio, layer)
            for head, reference in enumerate(case.kept[layer]):
                order = torch.tensor(reference).argsort()
                ours_keys, ours_values = stored.head_kv(head)
                heads += 1
                if stored.positions[head].tolist() != sorted(reference):  # scores tied at the cut: kvpress's topk
                    scores = case.layer_scores(layer, score_press)  # keeps the earlier, kvbench the later
                    assert boundary_tie(scores[head], n_kept), (*where, head)
                    assert is_valid_topk(scores[head], stored.positions[head].tolist()), (*where, head)
                    tied += 1
                    continue
                assert torch.equal(ours_values.float(), values_of[index][layer][head][order]), (*where, head)
                assert torch.equal(ours_keys, keys[head, sorted(reference)]), (*where, head)  # keys unchanged
    assert heads == sum(len(case.kept) * 2 for case in recording.cases)
    # Ties at the cut: SnapKV's window when the budget is below it (S=48 at 0.75 and 0.875), bfloat16 scores
    assert tied == (18 if family == "snapkv" else 0)  # of 32: 16 below the window, 2 bfloat16 ties


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
