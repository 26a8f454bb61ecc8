"""CUR against NVIDIA/kvpress's ``CURPress`` (0.5.5, defaults: ``kv_product``, local windows of 16, 4 sinks)."""

from __future__ import annotations

import pytest
import torch

from kvbench.eviction.base import build_method
from tests.methods.kvpress_replay import keys_values_observation, replay
from tests.reference_recordings import load_recording


def test_cur_scores_and_selections_match_kvpress() -> None:
    """Every recorded case (tensor and tiny-Llama, float32 and bfloat16): scores bit for bit, kept tokens per head."""
    method = build_method({"name": "cur", "family": "cur"})
    tally = replay(method, "CURPress")
    assert tally.max_score_error == 0.0
    assert tally.cases == 48 and tally.same + tally.tied_valid == tally.selections == 128


@pytest.mark.parametrize("leverage_type", ["kv_avg", "key", "value"])
def test_other_leverage_types_score_their_own_norms(leverage_type: str) -> None:
    """``kv_avg``, ``key`` and ``value`` (not recorded): the normalised mean / key / value squared norms."""
    case = load_recording("CURPress").cases[0]
    keys, values = torch.rand(2, 40, 16) + 0.1, torch.rand(2, 40, 16) + 0.1
    params = {"leverage_type": leverage_type, "use_local_approximation": False, "num_sinks": 0}
    scores = build_method({"name": "cur", "family": "cur", "params": params}).scorer.score(
        keys_values_observation(case, 0, {"keys": keys[None], "values": values[None]})
    )
    k2, v2 = (keys**2).sum(-1), (values**2).sum(-1)
    expected = {"kv_avg": (k2 + v2) / 2, "key": k2, "value": v2}[leverage_type]
    torch.testing.assert_close(scores, expected / expected.sum(-1, keepdim=True))


def test_an_unknown_leverage_type_is_refused_with_the_choices() -> None:
    """A misspelt ``leverage_type`` is an error listing the valid ones."""
    with pytest.raises(ValueError, match="kv_product"):
        build_method({"name": "cur", "family": "cur", "params": {"leverage_type": "keys"}})
