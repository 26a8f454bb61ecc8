"""Ada-Pyramid (family ``ada_pyramidkv``, kvbench/methods/adakv.py): on the tiny model every Ada-KV preset keeps its
budgets exactly per layer, and Ada-Pyramid's layer budgets follow PyramidKV's decreasing schedule; the allocator
itself is tested in test_ada_snapkv.py."""

from __future__ import annotations

import pytest

from tests.methods.helpers import method_from_yaml, run_method


@pytest.mark.parametrize("name", ["ada_snapkv", "ada_pyramidkv", "ada_snapkv_early"])
def test_presets_keep_budgets_exactly_per_layer(tiny_llama, name: str) -> None:
    model, tokenizer = tiny_llama
    record = run_method(model, tokenizer, method_from_yaml(name), "64L", new=4).record
    heads = 4 if name.endswith("early") else 2  # early: KV replicated per query head
    assert all(len(h) == heads for h in record.achieved_per_head)
    assert record.requested_per_head == record.achieved_per_head  # every head keeps what it was allocated
    # The reference rounds each head on its own: a layer may keep a few tokens more or less than requested.
    for achieved, layer in zip(record.achieved_per_head, record.requested_per_layer, strict=True):
        assert abs(sum(achieved) - layer * heads) <= heads // 2
    assert any(len(set(h)) > 1 for h in record.achieved_per_head)  # head budgets really differ
    if name == "ada_pyramidkv":
        assert record.requested_per_layer[0] > record.requested_per_layer[-1]
