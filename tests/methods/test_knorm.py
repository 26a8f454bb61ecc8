"""KNorm against NVIDIA/kvpress's ``KnormPress`` (0.5.5): the same scores, bit for bit, and the same kept tokens."""

from __future__ import annotations

import torch

from kvbench.eviction.base import WindowObservation, build_method
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


def test_wrappers_compose_over_knorm_and_name_its_results_folder() -> None:
    """``method=knorm method.params.allocation=ada``: Ada-KV's head allocation over KNorm's scores, in a results
    folder of its own (``knorm+ada``); the layer schedule composes the same way."""
    import kvbench
    from kvbench.app.validation import validate
    from kvbench.methods.adakv import AdaHeadAllocator
    from kvbench.methods.snapkv import PyramidLayerAllocator
    from kvbench.storage.writers import config_hash
    from tests.methods.helpers import prefill_one_layer

    plain = kvbench.compose_config(method="knorm", budget="64L")
    ada = kvbench.compose_config(method="knorm", budget="64L", overrides=["method.params.allocation=ada"])
    both = kvbench.compose_config(method="knorm", budget="64L", overrides=[*ada_and("method.params.layers=pyramid")])
    assert [cfg.method.name for cfg in (plain, ada, both)] == ["knorm", "knorm+ada", "knorm+ada+pyramid"]
    assert len({config_hash(cfg) for cfg in (plain, ada, both)}) == 3
    method = validate(ada)[0]
    assert isinstance(method.head_allocator, AdaHeadAllocator)
    assert isinstance(validate(both)[0].layer_allocator, PyramidLayerAllocator)
    keys = torch.randn(4, 200, 16, generator=torch.Generator().manual_seed(0))
    keys[0] *= 0.2  # head 0's keys have the smallest norms: under Ada-KV it gets more of the layer's budget
    lengths = prefill_one_layer(method, "40/layer", keys, torch.zeros_like(keys)).headwise_layers[0].head_lengths()
    assert sum(lengths) <= 4 * 40 + 4 and lengths[0] > max(lengths[1:]), lengths


def ada_and(*overrides: str) -> list[str]:
    return ["method.params.allocation=ada", *overrides]


def test_a_score_of_another_shape_is_a_clear_error() -> None:
    """Issue #41: one score shape, ``[H_stored, S]`` (or ``[H_q, S]``, reduced per GQA group), checked once by the
    session for every scorer."""
    import dataclasses

    import pytest

    from kvbench.methods.knorm import KNorm
    from tests.methods.helpers import prefill_one_layer

    @dataclasses.dataclass(frozen=True)
    class Transposed(KNorm):
        def score(self, observation: WindowObservation) -> torch.Tensor:
            return super().score(observation).T  # [S, H]: the wrong way round

    keys = torch.randn(2, 50, 8, generator=torch.Generator().manual_seed(0))
    method = dataclasses.replace(build_method({"name": "knorm", "family": "knorm"}), scorer=Transposed())
    with pytest.raises(ValueError, match=r"Transposed returned scores of shape \(50, 2\).*\[H_stored, S\] = \(2, 50\)"):
        prefill_one_layer(method, "20/layer", keys, torch.zeros_like(keys))
