"""AhaKV: RA, SGS and VPE each toggle independently and each flips the kept token on a case built for it."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf

from kvbench.budget import parse_budget
from kvbench.cache.kv_cache import KVBenchCache
from kvbench.inference.eviction import EvictionSession
from kvbench.methods.ahakv import AhaScorer, sg_multiplier, value_prior
from tests.methods.helpers import CONF, LayerIndex, method_from_yaml, run_method, with_step_hook

CONTEXT, DIM, WINDOW = 100, 8, 32
X, Y = 10, 20  # the two candidates; a budget of WINDOW + 1 keeps exactly one token outside the window


def _kept(name: str, keys, values, queries, **params) -> list[int]:
    """Non-window positions kept by the preset (with ``params`` overrides) at a budget of window + 1."""
    preset = dict(OmegaConf.load(CONF / "method" / f"{name}.yaml").params)
    method = method_from_yaml(name, decode_eviction=False, params={**preset, **params})
    cache = KVBenchCache(1)
    cache.update(keys[None], values[None], 0)
    session = EvictionSession(method, parse_budget(f"{WINDOW + 1}/layer"), cache)
    session.begin_prefill(CONTEXT)
    session.after_attention(LayerIndex(0), queries[None], DIM**-0.5)
    session.begin_decode()
    return [p for p in cache.headwise_layers[0].positions[0].tolist() if p < CONTEXT - WINDOW]


def _basis(i: int) -> torch.Tensor:
    return torch.eye(DIM)[i]


def _logit(value: float) -> float:
    """Vector length that gives a scaled logit of ``value`` for unit query/key directions."""
    return value / DIM**-0.5


def _blank():
    keys = torch.zeros(1, CONTEXT, DIM)
    values = torch.ones(1, CONTEXT, DIM)
    queries = torch.zeros(1, CONTEXT, DIM)
    return keys, values, queries


def _sgs_case():
    """X: one window query puts a large logit on it; Y: every window query a moderate one.  Every window query
    also attends strongly to its own (protected) key, so the rows compete: sharpening favours the spike."""
    keys, values, queries = _blank()
    keys[0, X] = _basis(0)
    keys[0, Y] = _basis(1)
    for offset, row in enumerate(range(CONTEXT - WINDOW, CONTEXT)):
        keys[0, row] = _basis(2 + offset % 6)
        queries[0, row] = _basis(2 + offset % 6) * _logit(5.0) + _basis(1) * _logit(2.5)
    queries[0, CONTEXT - WINDOW] += _basis(0) * _logit(6.0)
    return keys, values, queries


def _ra_case():
    """X: strongly attended by many early (non-window) queries; Y: moderately by the window queries."""
    keys, values, queries = _blank()
    keys[0, X] = _basis(0)
    keys[0, Y] = _basis(1)
    queries[0, X + 1 : 60] = _basis(0) * _logit(6.0)
    queries[0, CONTEXT - WINDOW :] = _basis(1) * _logit(3.0)
    return keys, values, queries


def _vpe_case():
    """Y gets slightly more window attention than X; X (and its neighbours) carry much larger values."""
    keys, values, queries = _blank()
    keys[0, X] = _basis(0)
    keys[0, Y] = _basis(1)
    queries[0, CONTEXT - WINDOW :] = _basis(0) * _logit(3.0) + _basis(1) * _logit(3.2)
    values[0, X - 3 : X + 4] *= 3.0
    return keys, values, queries


def test_sgs_alone_flips_the_kept_token() -> None:
    case = _sgs_case()
    assert _kept("ahakv", *case) == [X]
    assert _kept("ahakv_no_sgs", *case) == [Y]
    assert _kept("ahakv_no_vpe", *case) == [X]  # VPE is neutral here (equal values)
    assert _kept("ahakv", *case, ra=True, sgs=False, vpe=False) == [Y]


def test_ra_alone_flips_the_kept_token() -> None:
    case = _ra_case()
    assert _kept("ahakv", *case) == [Y]  # the window (recent accumulation) prefers Y
    assert _kept("ahakv_no_ra", *case) == [X]  # all rows: X's early attention dominates
    assert _kept("ahakv", *case, ra=False, sgs=False, vpe=False) == [X]  # plain H2O column sum
    assert _kept("ahakv", *case, ra=True, sgs=False, vpe=False) == [Y]


def test_vpe_alone_flips_the_kept_token() -> None:
    case = _vpe_case()
    assert _kept("ahakv", *case) == [X]
    assert _kept("ahakv_no_vpe", *case) == [Y]
    assert _kept("ahakv", *case, ra=True, sgs=False, vpe=True) == [X]
    assert _kept("ahakv_no_sgs", *case, vpe=False) == [Y]
    assert _kept("ahakv_no_ra", *case) == [X]


def test_step_gain_multiplier_readings() -> None:
    ratios = torch.tensor([2.0, 4.0, 8.0, 16.0, 32.0])
    unscaled = sg_multiplier(ratios * 1000, 1000, 128, "unscaled", 1e-3)
    # Spec table (reading (b)): sqrt(2 ln(i/k)) = 1.177, 1.665, 2.039, 2.355, 2.633.
    torch.testing.assert_close(unscaled, torch.tensor([1.177, 1.665, 2.039, 2.355, 2.633]), atol=1e-3, rtol=0)
    literal = sg_multiplier(ratios * 1000, 1000, 128, "literal", 1e-3)
    torch.testing.assert_close(literal, unscaled / math.sqrt(128))
    # i <= k: ln(i/k) is floored, the multiplier stays small and real.
    assert float(sg_multiplier(torch.tensor([500.0]), 1000, 128, "unscaled", 1e-3)) == pytest.approx(math.sqrt(2e-3))


def test_value_prior_is_pooled_and_normalised() -> None:
    values = torch.ones(1, 20, 4)
    values[0, 5] *= 3.0
    prior = value_prior(values, 3)
    assert float(prior.max()) == pytest.approx(1.0)
    norms = values.pow(2).sum(-1)[0]
    assert float(prior[0, 4]) == pytest.approx(float(norms[3:6].mean() / norms[4:7].mean()))


def test_lambda_k_switch_uses_the_layer_budget() -> None:
    scorer = method_from_yaml("ahakv").scorer
    assert isinstance(scorer, AhaScorer)
    assert scorer.budget_k(64, 1000) == 64
    selected = method_from_yaml("ahakv", params={"lambda_k": "selected"}).scorer
    assert selected.budget_k(64, 1000) == 64 - 32


@pytest.mark.parametrize("name", ["ahakv", "ahakv_no_vpe", "ahakv_no_ra", "ahakv_no_sgs"])
def test_presets_keep_the_budget_through_decoding(tiny_llama, name: str) -> None:
    model, tokenizer = tiny_llama
    out = run_method(model, tokenizer, method_from_yaml(name), "64L", new=12)
    assert out.record.requested_per_layer == out.record.achieved_per_layer == [64] * 4
    assert out.record.final_per_layer == [64] * 4
    assert len(out.token_ids) == 12


def test_decoding_accumulates_and_keeps_the_recent_window(tiny_llama) -> None:
    model, tokenizer = tiny_llama
    states = []  # the sample's decode state, owned by its session
    method = with_step_hook(method_from_yaml("ahakv"), lambda layer_idx, layer, state: states.append(state))
    out = run_method(model, tokenizer, method, "64L", context=300, new=10)
    assert out.record.final_per_layer == [64] * 4
    policy, state = method.decode_policy.policy, states[-1]
    assert all(s is state for s in states)
    for layer in state.scores:
        scores = policy.head_scores(state, layer)
        # Running scores: prefill's enhanced scores plus one probability mass per decoding step, minus evictions.
        assert all(s.shape[0] == 64 for s in scores), layer
        assert all(float(s.sum()) > 0 for s in scores)
