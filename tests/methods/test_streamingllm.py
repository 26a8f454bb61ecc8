"""StreamingLLM (kvbench/methods/streamingllm.py): attention sinks plus the most recent tokens."""

from __future__ import annotations

from tests.methods.helpers import dominant_case, method_from_yaml, prefill_one_layer


def test_streamingllm_keeps_exactly_sinks_and_most_recent() -> None:
    keys, query = dominant_case()
    cache = prefill_one_layer(method_from_yaml("streamingllm"), "40/layer", keys, query)
    for head in range(2):
        assert cache.headwise_layers[0].positions[head].tolist() == [0, 1, 2, 3, *range(200 - 36, 200)]
