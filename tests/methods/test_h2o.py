"""H2O (kvbench/methods/h2o.py): step by step, its decode-time eviction keeps the tokens its rule spelled out per
head keeps, evicting in place on both storage backends (what such a step costs: tests/inference/test_decode_cost.py)."""

from __future__ import annotations

import pytest
import torch

from kvbench.cache.kv_cache import KVBenchCache
from tests.inference.test_decode_cost import HEAD_DIM, _sorted_positions
from tests.methods.helpers import method_from_yaml


def _reference_h2o(keys, queries, cap: int, recent: int, groups: int):
    """H2O's decode rule spelled out per head on position-ordered lists: accumulate the new query's attention
    (mean over the GQA group), evict the lowest-scoring token outside the ``recent`` newest."""
    kept = []
    for head in range(keys.shape[0]):
        positions = list(range(cap))
        scores = {p: 0.0 for p in positions}
        for step, query in enumerate(queries):
            new = cap + step
            positions.append(new)
            scores[new] = 0.0
            head_q = query[head * groups : (head + 1) * groups, 0]
            logits = head_q @ keys[head, positions].T * HEAD_DIM**-0.5
            probs = torch.softmax(logits, dim=-1).mean(dim=0)
            for p, prob in zip(positions, probs.tolist(), strict=True):
                scores[p] += prob
            candidates = positions[: len(positions) - recent]
            victim = min(candidates, key=lambda p: scores[p])
            positions.remove(victim)
        kept.append(sorted(positions))
    return kept


@pytest.mark.parametrize("backend", ["torch", "paged"])
def test_h2o_in_place_keeps_what_the_rule_spelled_out_keeps(backend: str) -> None:
    """20 steps of H2O (cap 48, recent window 8): the same tokens as the per-head reference loop, on both backends."""
    gen = torch.Generator().manual_seed(3)
    cap, steps, groups = 48, 20, 2
    keys = torch.randn(2, cap + steps, HEAD_DIM, generator=gen)
    queries = [torch.randn(4, 1, HEAD_DIM, generator=gen) * 3 for _ in range(steps)]
    policy = method_from_yaml("h2o", window=8).decode_policy
    cache = KVBenchCache(1, backend=backend)
    cache.update(keys[None, :, :cap], keys[None, :, :cap].clone(), 0)
    layer = cache.headwise_layers[0]
    state = policy.new_state()
    policy.start_layer(state, 0, layer, [cap, cap], None)
    for step, query in enumerate(queries):
        new = keys[None, :, cap + step : cap + step + 1]
        cache.update(new, new.clone(), 0)
        policy.step(state, 0, layer, query, HEAD_DIM**-0.5)
    assert _sorted_positions(layer) == _reference_h2o(keys, queries, cap, 8, groups)
    for head in range(2):  # every slot still holds its own token's key
        stored_keys, _ = layer.head_kv(head)
        assert torch.equal(stored_keys, keys[head, layer.positions[head].long()])
