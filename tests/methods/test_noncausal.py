"""Non-causal attention against NVIDIA/kvpress's ``NonCausalAttnPress`` (0.5.5, chunk_size 32 on the tiny Llama's
recorded prefill, float32 and bfloat16), and the padding switch."""

from __future__ import annotations

import torch

from kvbench.eviction.base import build_method
from kvbench.methods.noncausal import chunked_bidirectional_attention
from tests.methods.kvpress_replay import prompt_queries_observation, replay


def test_noncausal_scores_and_selections_match_kvpress() -> None:
    """The recorded tiny-Llama cases (chunk 32, float32 and bfloat16): scores within 1e-5, kept tokens per head."""
    method = build_method({"name": "noncausal", "family": "noncausal", "params": {"chunk_size": 32}})
    assert method.scorer.prompt_rows(torch.float32).queries
    tally = replay(method, "NonCausalAttnPress", prompt_queries_observation, score_atol=1e-5)
    assert tally.cases == 16 and tally.same + tally.tied_valid == tally.selections == 64


def test_padding_keys_draw_attention_unless_masked() -> None:
    """kvpress's ``-1e-9`` leaves the zero-padded keys of the last chunk in the softmax; ``mask_padding`` removes
    them, so all 32 rows of the last chunk (8 real queries, 24 zero-padded ones) put their mass on its 8 real keys."""
    generator = torch.Generator().manual_seed(0)
    queries, keys = torch.randn(2, 40, 8, generator=generator), torch.randn(2, 40, 8, generator=generator)
    reference = chunked_bidirectional_attention(queries, keys, 32)
    masked = chunked_bidirectional_attention(queries, keys, 32, mask_padding=True)
    torch.testing.assert_close(reference[:, :32], masked[:, :32])  # full chunks are unaffected
    torch.testing.assert_close(masked[:, 32:].sum(-1), torch.full((2,), 32.0))
    assert bool((reference[:, 32:].sum(-1) < 31.9).all())
