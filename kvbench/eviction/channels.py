"""The key-channel piece of a method (ThinK, :mod:`kvbench.methods.think`): which key channels each stored head keeps
once a layer's prefill eviction is done; the cache then stores those channels only
(:meth:`kvbench.cache.base.EvictableLayer.prune_key_channels`) and attention uses the matching query channels.

Shapes: ``H_q`` query heads, ``H`` stored heads, ``W`` window queries, ``S_h`` tokens of head ``h``, ``D`` head dim.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from kvbench.eviction.state import ReadOnlyAfterBuild


class KeyChannelPruner(ReadOnlyAfterBuild, ABC):
    """Chooses the key channels each stored head keeps (a frozen piece of a method, like the scorer)."""

    #: The last prompt queries :meth:`kept_channels` reads.
    window: int = 32
    #: Whether tokens stored after the pruning keep only the kept channels too (``False``: they are stored whole, as
    #: kvpress appends them; :meth:`kvbench.cache.base.EvictableLayer.prune_key_channels`).
    prune_appended: bool = False

    @abstractmethod
    def kept_channels(self, queries: torch.Tensor, keys: list[torch.Tensor]) -> torch.Tensor | None:
        """``[H, D_k]`` the channels each stored head keeps, from the last ``window`` queries ``[H_q, W, D]`` and each
        head's kept keys ``[S_h, D]``; ``None`` keeps every channel."""
