"""kvpress's Ada-KV head allocation (``AdaKVPress``, NVIDIA/kvpress 0.5.5) over any scorer: ``allocation: ada_kvpress``.

kvpress reads Ada-KV differently from its reference code (FFY0/AdaKV, ``allocation: ada``,
:class:`~kvbench.methods.adakv.AdaHeadAllocator`): each head's top ``n_safe = max(1, int(k alpha))`` tokens
(``alpha_safeguard`` 0.2, ``k`` the per-head budget) are set to the largest score, then one top-``H k`` over the
layer's ``[H, S]`` scores picks every head's share.  There is no ``(1 - alpha)`` blend and no rounding: the shares sum
to ``H k`` exactly.  Protected tokens (``+inf``, when the method protects any) are among the top; padding (``-inf``)
never is while a finite score remains.  Parity: ``tests/methods/test_kvpress_ada.py``.
"""

from __future__ import annotations

import torch

from kvbench.eviction.base import HeadBudgetAllocator

#: kvpress's ``AdaKVPress.alpha_safeguard`` default.
KVPRESS_ALPHA_SAFEGUARD = 0.2


class KvpressAdaAllocator(HeadBudgetAllocator):
    """Per-head shares of the layer's top ``H k`` scores after each head's safeguard (module docstring)."""

    def __init__(self, alpha_safeguard: float = KVPRESS_ALPHA_SAFEGUARD) -> None:
        self.alpha_safeguard = alpha_safeguard

    def allocate(self, scores: torch.Tensor, budget_per_head: int) -> list[int]:
        """Counts for ``[H, S]`` scores; they sum to ``H min(k, S)``."""
        heads, length = scores.shape
        budget = min(budget_per_head, length)
        if budget >= length:
            return [length] * heads
        n_safe = max(1, int(budget * self.alpha_safeguard))
        safe = scores.topk(n_safe, dim=-1).indices
        guarded = scores.float().scatter(-1, safe, torch.finfo(torch.float32).max)
        guarded = torch.where(torch.isposinf(scores), torch.inf, guarded)
        chosen = guarded.reshape(-1).topk(heads * budget).indices // length
        return torch.bincount(chosen, minlength=heads).tolist()
