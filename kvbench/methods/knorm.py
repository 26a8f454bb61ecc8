"""KNorm (Devoto et al., 2024): keep the tokens whose keys have the smallest L2 norm.

Reproduces NVIDIA/kvpress ``kvpress/presses/knorm_press.py`` (``KnormPress``, kvpress 0.5.5): the score of a token
is minus the L2 norm of its stored (post-RoPE) key, per KV head, accumulated in at least float32 (a bfloat16 norm
would tie distinct tokens); no token is protected.
kvpress's ``compression_ratio`` c keeps ``max(1, int(S (1 - c)))`` tokens per head: the budget ``<n>/layer`` with that
n (a ratio budget ``r x`` rounds ``r S`` instead).  Parity: ``tests/methods/test_knorm.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvbench.eviction.base import WindowObservation
from kvbench.eviction.recipe import ScorerMethod


@dataclass(frozen=True)
class KNorm(ScorerMethod, family="knorm", reference="NVIDIA/kvpress kvpress/presses/knorm_press.py@0.5.5"):
    """Score ``-||k||_2``: the smallest key norms are kept."""

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """``[H, S]`` minus each stored key's L2 norm (float32, or the keys' dtype when wider)."""
        keys = observation.keys
        return -torch.linalg.vector_norm(keys, dim=-1, dtype=torch.promote_types(keys.dtype, torch.float32))
