"""EntropyGatedChunkKV (kvpress's ``EntropyGatedChunkKVPress``, issue #58) against NVIDIA/kvpress 0.5.5's recordings:
every recorded case (KNorm on tensors and the tiny Llama, SnapKV on the tiny Llama), float32 and bfloat16, keeps
kvpress's tokens (the same on every head), exactly the budget."""

from __future__ import annotations

import pytest
import torch

from kvbench.eviction.base import WindowObservation, build_method
from kvbench.methods.entropy_chunkkv import entropy_gated_chunks
from tests.methods.kvpress_replay import keep_one_layer, model_queries
from tests.reference_recordings import case_inputs, kvpress_n_kept, load_recording

SNAPKV_KVPRESS = {"kernel_size": 5, "pooling": "avg", "pool_padding": "include", "gqa_reduce": "after_pool"}
SNAPKV_KVPRESS |= {"score_dtype": "model"}


@pytest.mark.parametrize(
    ("press", "family", "window", "params"),
    [
        ("EntropyGatedChunkKVPress_KnormPress", "knorm", 1, {"chunk_length": 8}),
        ("EntropyGatedChunkKVPress_SnapKVPress", "snapkv", 16, SNAPKV_KVPRESS),
    ],
)
def test_entropy_gated_chunkkv_keeps_kvpress_tokens(press: str, family: str, window: int, params: dict) -> None:
    recording = load_recording(press)
    config = {"name": "e", "family": "entropy_chunkkv", "window": window, "params": {"press": family, **params}}
    method = build_method(config)
    heads = 0
    for case in recording.cases:
        n_kept = kvpress_n_kept(case.length, case.compression_ratio)
        for layer, inputs in enumerate(case_inputs(case)):
            keys, values = inputs["keys"][0], inputs["values"][0]
            queries = model_queries(case, layer, inputs)[:, -window:] if case.kind == "model" else keys[:, -1:]
            observation = WindowObservation(layer, 2, queries, keys, values, keys.shape[-1] ** -0.5)
            for head, positions in enumerate(keep_one_layer(method, observation, n_kept)):
                assert positions == sorted(case.kept[layer][head]), (case.inputs, case.dtype, case.compression_ratio)
                heads += 1
    assert heads == sum(len(case.kept) * 2 for case in recording.cases)


def test_a_spiky_important_chunk_keeps_its_top_tokens_and_the_budget_moves_on() -> None:
    """Chunks of 4: the best chunk has one high token (spiky) and keeps only its top 2; the freed budget takes the
    next chunk whole."""
    scores = torch.tensor([0.5, 9.0, 0.0, 0.0, 2.0, 2.1, 2.0, 2.1, 1.0, 1.1, 1.0, 1.1, 0.1, 0.2, 0.1, 0.2])
    keep = entropy_gated_chunks(scores, budget=6, chunk=4, spiky_keep=2)
    assert keep.nonzero().flatten().tolist() == [0, 1, 4, 5, 6, 7]
    assert entropy_gated_chunks(scores, budget=3, chunk=4, spiky_keep=2).nonzero().flatten().tolist() == [0, 1, 5]
