"""KNorm against NVIDIA/kvpress's ``KnormPress`` (0.5.5): the same scores, bit for bit, and the same kept tokens."""

from __future__ import annotations

import torch

from kvbench.methods.base import WindowObservation, build_method
from tests.methods.kvpress_cases import check_selection, tensor_cases


def test_knorm_scores_and_selections_match_kvpress() -> None:
    method = build_method({"name": "knorm", "family": "knorm"})
    assert method.keep_window is False and method.decode_policy is None
    checked = 0
    for case, keys, reference_scores in tensor_cases("KnormPress"):
        heads, _, dim = keys.shape
        observation = WindowObservation(0, 1, torch.zeros(heads, 1, dim, dtype=keys.dtype), keys, keys, 1.0)
        assert torch.equal(method.scorer.score(observation).float(), reference_scores), case["inputs"]
        check_selection(method, case, keys, reference_scores)
        checked += 1
    assert checked == 32  # the recording's tensor cases: 4 lengths x 2 dtypes x 4 compression ratios
