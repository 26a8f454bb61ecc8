"""KeyDiff (Park et al., 2025): keep the keys least similar to the layer's average key direction.

Reproduces NVIDIA/kvpress ``kvpress/presses/keydiff_press.py`` (``KeyDiffPress``, kvpress 0.5.5): per KV head, the
anchor is the mean of the L2-normalised stored (post-RoPE) keys, and a token's score is minus the cosine similarity
of its key with that anchor, computed in the keys' dtype (as the reference; bfloat16 scores may tie).  No token is
protected.  kvpress's ``compression_ratio`` c keeps ``max(1, int(S (1 - c)))`` tokens per head: the budget
``<n>/layer`` with that n.  Parity: ``tests/methods/test_keydiff.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from kvbench.eviction.base import WindowObservation
from kvbench.eviction.recipe import ScorerMethod


@dataclass(frozen=True)
class KeyDiff(ScorerMethod, family="keydiff", reference="NVIDIA/kvpress kvpress/presses/keydiff_press.py@0.5.5"):
    """Score ``-cos(k, mean_s(k_s / ||k_s||))`` per KV head: the most distinctive keys are kept."""

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """``[H, S]`` minus the cosine of each key ``[H, S, D]`` with its head's mean unit key, in the keys' dtype."""
        keys = observation.keys
        anchor = F.normalize(keys, p=2, dim=-1).mean(dim=-2, keepdim=True)  # [H, 1, D]
        return -F.cosine_similarity(keys, anchor, dim=-1)
