"""CriticalKV and CriticalAdaKV over any scorer (``method.params.rescale=critical``, with
``method.params.allocation=ada_kvpress`` for CriticalAdaKV) against NVIDIA/kvpress 0.5.5's ``CriticalKVPress`` and
``CriticalAdaKVPress`` recordings: the same kept tokens per head, or another valid top-k where the two-stage scores
tie."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvbench.eviction.base import EvictionMethod, WindowObservation, build_method
from kvbench.eviction.critical import projected_value_norms, wrap_critical
from tests.methods.helpers import method_from_yaml
from tests.methods.kvpress_replay import keep_one_layer
from tests.methods.wrapper_replay import replay_kept, window_observation
from tests.reference_recordings import DTYPES, RecordedCase, is_valid_topk, load_recording, tiny_llama_weights

QUERY_HEADS = 4  # the tiny Llama's


def with_output_projection(observation_of):
    """The recorded layer's observation plus the tiny Llama's ``o_proj`` weight in the case's dtype."""

    def observation(case: RecordedCase, layer: int, inputs: dict[str, torch.Tensor]) -> WindowObservation:
        seen = observation_of(case, layer, inputs)
        weight = tiny_llama_weights(DTYPES[case.dtype])[f"model.layers.{layer}.self_attn.o_proj.weight"]
        return dataclasses.replace(seen, output_projection=weight)

    return observation


def keys_values(case: RecordedCase, layer: int, inputs: dict[str, torch.Tensor]) -> WindowObservation:
    keys, values = inputs["keys"][0], inputs["values"][0]
    queries = torch.zeros(QUERY_HEADS, 1, keys.shape[-1], dtype=keys.dtype)  # the query-head count only
    return WindowObservation(layer, 2, queries, keys, values, keys.shape[-1] ** -0.5)


def kvpress_snapkv(adaptive: bool) -> EvictionMethod:
    """kvpress's SnapKV (the ``snapkv_kvpress`` preset averages the window rows as kvpress's ``SnapKVPress``:
    CriticalKV's epsilon and ``max + 1`` padding are not scale-free) under CriticalKV / CriticalAdaKV."""
    return wrap_critical(method_from_yaml("snapkv_kvpress", window=16), adaptive)


def tied_in(press: str):
    """Valid choice: every head keeps kvpress's count and a top-k of kvpress's recorded ``press`` scores."""

    def valid(case: RecordedCase, layer: int, kept: list[list[int]]) -> bool:
        scores = case.layer_scores(layer, press)
        return all(len(p) == len(case.kept[layer][h]) and is_valid_topk(scores[h], p) for h, p in enumerate(kept))

    return valid


def test_criticalkv_over_knorm_keeps_kvpress_tokens() -> None:
    method = build_method({"name": "knorm", "family": "knorm", "params": {"rescale": "critical"}})
    tally = replay_kept(method, "CriticalKVPress_KnormPress", with_output_projection(keys_values))
    assert tally.cases == 16 and tally.same == tally.selections == 64


def test_criticalkv_over_snapkv_keeps_kvpress_tokens() -> None:
    observation = with_output_projection(window_observation(16))
    tally = replay_kept(kvpress_snapkv(False), "CriticalKVPress_SnapKVPress", observation, tied_in("CriticalKVPress"))
    assert tally.cases == 16 and tally.differ == 0 and tally.same > tally.tied_valid


def test_critical_adakv_over_snapkv_keeps_kvpress_tokens() -> None:
    """kvpress records no CriticalAdaKV scores.  Stage 2 scores a token ``(s + epsilon) vnorm`` as CriticalKV does,
    so where a head's set differs, the swapped tokens must tie in kvpress's recorded CriticalKV scores of the same
    inputs (and the head keep kvpress's count)."""
    critical = {(c.inputs, c.compression_ratio): c for c in load_recording("CriticalKVPress_SnapKVPress").cases}

    def valid(case: RecordedCase, layer: int, kept: list[list[int]]) -> bool:
        scores = critical[case.inputs, case.compression_ratio].layer_scores(layer, "CriticalKVPress")
        for head, positions in enumerate(kept):
            swapped = sorted(set(positions) ^ set(case.kept[layer][head]))
            if len(positions) != len(case.kept[layer][head]) or len(set(scores[head][swapped].tolist())) > 1:
                return False
        return True

    observation = with_output_projection(window_observation(16))
    tally = replay_kept(kvpress_snapkv(True), "CriticalAdaKVPress_SnapKVPress", observation, valid)
    assert tally.cases == 16 and tally.differ == 0 and tally.same > tally.tied_valid


def test_projected_value_norms_and_refusals() -> None:
    values = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]])  # [H=1, S=2, D=2]
    weight = torch.tensor([[1.0, -1.0, 2.0, 0.0], [3.0, 0.0, 0.0, 1.0]])  # [hidden=2, H_q D=4]: two query heads
    # query head 0 reads columns 0-1: v W_o[0] = v @ [[1, 3], [-1, 0]]; head 1 columns 2-3: v @ [[2, 0], [0, 1]]
    expected = torch.tensor([[(4 + 2) / 2, (2 + 2) / 2]])
    torch.testing.assert_close(projected_value_norms(values, weight, 2), expected)
    method = build_method({"name": "k", "family": "knorm", "params": {"rescale": "critical"}})
    observation = WindowObservation(0, 1, torch.zeros(1, 1, 2), values, values, 1.0)
    with pytest.raises(ValueError, match="o_proj"):
        keep_one_layer(method, observation, 1)
    with pytest.raises(ValueError, match="ada_kvpress"):
        build_method({"name": "k", "family": "knorm", "params": {"rescale": "critical", "allocation": "ada"}})
