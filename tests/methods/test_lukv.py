"""LU-KV (kvpress's ``LUKVPress``, issue #58) against NVIDIA/kvpress 0.5.5's recordings with a seeded stand-in curve
(``inputs.safetensors`` ``lukv_curve``, in place of LU-KV's download): every recorded case of the tiny Llama (KNorm
and the default Expected Attention, float32 and bfloat16) keeps kvpress's per-head counts and tokens, at kvpress's
budget ``<c>cr``; the flat curve (``curve: null``) keeps the budget on every head."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from kvbench.budget import parse_budget
from kvbench.cache.kv_cache import KVBenchCache
from kvbench.eviction.base import TokenScorer, WindowObservation, build_method
from kvbench.inference.eviction import EvictionSession
from kvbench.methods.lukv import LukvScorer, curve_row, lukv_head_counts
from tests.methods.helpers import LayerIndex
from tests.methods.kvpress_replay import hidden_states_observation, model_queries
from tests.methods.wrapper_replay import KeptTally, cases_in, tally_exact
from tests.parity.kvpress_claims import Claim, claim_of
from tests.reference_recordings import case_inputs, load_recording, stored_input


class Recorded(TokenScorer):
    """``inner`` on each layer's recorded observation (what kvpress's hook saw) instead of the session's."""

    def __init__(self, inner: TokenScorer, observations: list[WindowObservation]) -> None:
        self.inner, self.observations = inner, observations

    def score(self, observation: WindowObservation) -> torch.Tensor:
        recorded = self.observations[observation.layer_idx]
        return self.inner.score(dataclasses.replace(recorded, layer_budget=observation.layer_budget))


RECORDINGS = ["LUKVPress_KnormPress_seeded_curve", "LUKVPress_ExpectedAttentionPress_seeded_curve"]


def replay_lukv(claim: Claim, form: str, dtype: str) -> KeptTally:
    """Every case of the claim's recording in ``dtype`` at kvpress's ``budget=<r>cr`` (``form``: only ``cr``), the
    seeded curve written to a file as ``method.params.curve``: per layer and head kvpress's count and tokens exactly, or
    different."""
    assert form == "cr", form
    tally = KeptTally()
    with tempfile.TemporaryDirectory() as folder:
        curve_file = Path(folder) / "curve.npy"
        np.save(curve_file, stored_input("lukv_curve").numpy())
        method = claim.build(curve=str(curve_file))
        for case in cases_in(claim.recording, dtype, tally):
            layers = case_inputs(case)
            observations = [hidden_states_observation(case, layer, inputs) for layer, inputs in enumerate(layers)]
            scorer = method.scorer
            assert isinstance(scorer, LukvScorer)
            fixed = dataclasses.replace(method, scorer=LukvScorer(Recorded(scorer.inner, observations), "mean", 4, 1))
            cache = KVBenchCache(2)
            for layer, inputs in enumerate(layers):
                cache.update(inputs["keys"], inputs["values"], layer)
            session = EvictionSession(fixed, parse_budget(f"{case.compression_ratio}cr"), cache)
            session.begin_prefill(case.length)
            for layer, inputs in enumerate(layers):
                queries = model_queries(case, layer, inputs)
                session.after_attention(LayerIndex(layer), queries[None, :, -1:], inputs["keys"].shape[-1] ** -0.5)
            session.begin_decode()
            for stored, recorded in zip(cache.headwise_layers, case.kept, strict=True):
                tally_exact(tally, stored.positions, recorded)
    return tally


@pytest.mark.parametrize("press", RECORDINGS)
def test_lukv_keeps_kvpress_tokens(press: str) -> None:
    tallies = [replay_lukv(claim_of(press), "cr", dtype) for dtype in ("float32", "bfloat16")]
    assert all(t.differ == 0 for t in tallies), tallies
    assert sum(t.same for t in tallies) == len(load_recording(press).cases) * 4


def test_lukv_head_counts_follow_kvpress_arithmetic() -> None:
    """The rounded total, each head's floor, the remainder to the largest fractional parts, at least one token."""
    assert lukv_head_counts(torch.tensor([0.5, 0.25, 0.999]), 10) == [5, 8, 1]
    assert lukv_head_counts(torch.tensor([0.55, 0.55]), 11) == [5, 5]  # 4.95 + 4.95 = 9.9 -> 10
    assert (curve_row(0.25), curve_row(0.0), curve_row(0.999)) == (24, 0, 98)


def test_flat_curve_keeps_the_budget_on_every_head() -> None:
    """``curve: null``: every head prunes the budget's ratio (LU-KV's sink and window kept)."""
    method = build_method({"name": "lukv", "family": "lukv", "params": {"press": "knorm"}})
    keys = torch.randn(2, 40, 16, generator=torch.Generator().manual_seed(3))
    cache = KVBenchCache(1)
    cache.update(keys[None], keys[None].clone(), 0)
    session = EvictionSession(method, parse_budget("0.5cr"), cache)
    session.begin_prefill(40)
    session.after_attention(LayerIndex(0), keys[None, :, -1:], 0.25)
    session.begin_decode()
    layer = cache.headwise_layers[0]
    assert layer.head_lengths() == [20, 20]
    assert all({0, 1, 2, 3, 39} <= set(p.tolist()) for p in layer.positions)
