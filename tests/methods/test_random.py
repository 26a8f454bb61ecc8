"""Random against NVIDIA/kvpress's ``RandomPress`` (0.5.5): kvpress's seeding reproduced (``seed=0``: reseeded per
draw; ``seed=None``: torch's global generator), and kvbench's per-sample switch independent of the global state."""

from __future__ import annotations

import pytest
import torch

from kvbench.eviction.base import WindowObservation, build_method
from tests.methods.kvpress_cases import check_selection, tensor_cases


def observation_of(keys: torch.Tensor, sample_key: int = 0) -> WindowObservation:
    heads, _, dim = keys.shape
    query = torch.zeros(heads, 1, dim, dtype=keys.dtype)
    return WindowObservation(0, 1, query, keys, keys, 1.0, sample_key=sample_key)


@pytest.mark.parametrize(("press", "seed"), [("RandomPress", 0), ("RandomPress_seed_None", None)])
def test_random_draws_and_selections_match_kvpress(press: str, seed: int | None) -> None:
    method = build_method({"name": "random", "family": "random", "params": {"seed": seed}})
    checked = 0
    for case, keys, reference_scores in tensor_cases(press):
        assert case["settings"]["seed"] == seed
        torch.manual_seed(1234)  # the recorder's global seed before every case (seed=None draws from it)
        assert torch.equal(method.scorer.score(observation_of(keys)).float(), reference_scores), case["inputs"]
        torch.manual_seed(1234)
        check_selection(method, case, keys, reference_scores)
        checked += 1
    assert checked == 32  # the recording's tensor cases


def test_per_sample_draws_depend_on_the_sample_only() -> None:
    scorer = build_method({"name": "random", "family": "random", "params": {"per_sample": True}}).scorer
    keys = torch.randn(2, 50, 8)
    torch.manual_seed(1)
    first = scorer.score(observation_of(keys, sample_key=7))
    torch.rand(100)  # other draws in between change nothing
    assert torch.equal(scorer.score(observation_of(keys, sample_key=7)), first)
    assert not torch.equal(scorer.score(observation_of(keys, sample_key=8)), first)
