"""Observed attention (``observed_attention``, kvpress's H2O-style ``ObservedAttentionPress``) against NVIDIA/kvpress
0.5.5's recording (issue #43 item 9): the recorded tiny Llama's eager-attention prefill, float32 and bfloat16."""

from __future__ import annotations

import torch

from kvbench.eviction.base import build_method
from tests.methods.kvpress_replay import prompt_queries_observation, replay


def test_observed_attention_scores_and_selections_match_kvpress() -> None:
    """Every recorded eager-attention case (float32 and bfloat16): the same scores bit for bit (the bf16 rounding of
    eager attention and of kvpress's sums, counts, quotient and group mean), kept tokens per head kvpress's or a valid
    top-k where kvpress's scores tie (2 bf16 heads)."""
    method = build_method({"name": "observed_attention", "family": "observed_attention"})
    assert method.scorer.prompt_rows(torch.bfloat16).column_sums and not method.keep_window
    assert method.decode_policy is None
    tally = replay(method, "ObservedAttentionPress", prompt_queries_observation)
    assert tally.kinds == {"model/float32": 8, "model/bfloat16": 8}
    assert tally.same + tally.tied_valid == tally.selections == 64 and tally.max_score_error == 0.0
