"""The pruned key channels of the tokens a layer stores after its key channels were pruned (ThinK, kvpress semantics).

kvpress's ThinKPress zeroes the pruned channels of the compressed context's keys only; the keys appended later (a
question in question-agnostic mode, generated tokens) stay whole.  A pruned kvbench layer (both backends) stores
every token's kept channels ``[S_h, D_k]`` in its own storage, and this store holds the other ``D - D_k`` channels of
the tokens appended after the pruning, one row per appended token, with a per-slot map (``-1``: a context token,
whose pruned channels are zero).  Reading a head back (:meth:`AppendedKeyChannels.full_keys`) scatters both into
full-width keys ``[.., S, D]`` whose context rows are zero in the pruned channels: kvpress's key tensor, attended
with the full query in one softmax.  Used only when the layer was pruned with ``prune_appended=False`` (the default).

Shapes: ``H`` stored heads, ``D`` head dim, ``D_k`` kept channels, ``D_p = D - D_k`` pruned channels, ``R`` rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


class AppendedKeyChannels:
    """Pruned channels ``[R, H, D_p]`` of the tokens appended after a layer's pruning, and which row each slot holds.

    Parameters
    ----------
    kept:
        ``[H, D_k]`` int64 kept channels per head, ascending (the layer's ``key_channels``).
    head_dim:
        ``D``.
    dtype, device:
        The layer's.
    """

    def __init__(self, kept: torch.Tensor, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        heads = kept.shape[0]
        mask = torch.ones(heads, head_dim, dtype=torch.bool, device=device).scatter(-1, kept.to(device), False)
        #: ``[H, D_k]`` kept and ``[H, D_p]`` pruned channels per head, ascending.
        self.kept = kept.to(device)
        self.pruned = mask.nonzero()[:, 1].view(heads, head_dim - kept.shape[1])
        #: ``[R_cap, H, D_p]`` rows of appended tokens (``used_rows`` filled) and ``[H, C]`` int64 row of each slot.
        self.rows = torch.empty((0, heads, self.pruned.shape[1]), dtype=dtype, device=device)
        self.used_rows = 0
        self.slot_rows = torch.full((heads, 0), -1, dtype=torch.long, device=device)

    # ------------------------------------------------------------------ following the layer's slots
    def append(self, key_states: torch.Tensor, lengths: Sequence[int]) -> None:
        """Record the pruned channels of ``key_states`` ``[1, H, q, D]``, which the layer stores in slots
        ``lengths[h] .. lengths[h] + q - 1`` of each head (before its append)."""
        heads, new_tokens = key_states.shape[1], key_states.shape[2]
        self._make_room(new_tokens, lengths)
        self._widen(max(lengths, default=0) + new_tokens)
        index = self.pruned[:, None, :].expand(heads, new_tokens, self.pruned.shape[1])
        pruned = key_states[0].gather(-1, index.to(key_states.device))  # [H, q, D_p]
        first = self.used_rows
        self.rows[first : first + new_tokens] = pruned.transpose(0, 1).to(self.rows.dtype)
        device = self.slot_rows.device
        slots = torch.tensor(list(lengths), dtype=torch.long, device=device)[:, None] + torch.arange(
            new_tokens, device=device
        )
        new_rows = torch.arange(first, first + new_tokens, device=device).expand(heads, -1)
        self.slot_rows.scatter_(1, slots, new_rows)
        self.used_rows += new_tokens

    def keep(self, sorted_indices: Sequence[torch.Tensor]) -> None:
        """The layer kept slots ``sorted_indices[h]`` (ascending, or a decode policy's order) of each head, in that
        order."""
        width = max((int(idx.numel()) for idx in sorted_indices), default=0)
        kept = torch.full((len(sorted_indices), width), -1, dtype=torch.long, device=self.slot_rows.device)
        for head, idx in enumerate(sorted_indices):
            if idx.numel():
                kept[head, : idx.numel()] = self._padded(int(idx.max()) + 1)[head, idx.to(kept.device)]
        self.slot_rows = kept

    def evict(self, heads: torch.Tensor, slots: torch.Tensor, last: torch.Tensor) -> None:
        """Each head ``heads[i]`` moved its last slot ``last[i]`` into slot ``slots[i]`` (a one-token eviction)."""
        self._widen(int(last.max()) + 1 if last.numel() else 0)
        self.slot_rows[heads, slots] = self.slot_rows[heads, last]
        self.slot_rows[heads, last] = -1

    # ------------------------------------------------------------------ reading keys back
    def full_keys(self, kept_keys: torch.Tensor, heads: torch.Tensor | None = None) -> torch.Tensor:
        """Full-width keys ``[n, S, D]`` from the stored kept channels ``kept_keys`` ``[n, S, D_k]`` of ``heads``
        (``[n]``; default all ``H``): the context slots' pruned channels are zero (kvpress's zeroed keys), the
        appended slots' are this store's rows."""
        count, length, width = kept_keys.shape
        heads = torch.arange(count, device=self.kept.device) if heads is None else heads.to(self.kept.device)
        full = kept_keys.new_zeros((count, length, width + self.pruned.shape[1]))
        kept = self.kept[heads][:, None, :].expand(count, length, width)
        full.scatter_(-1, kept.to(full.device), kept_keys)
        if self.used_rows == 0:  # nothing appended since the pruning: kvpress's zeroed context keys
            return full
        rows = self._padded(length)[heads, :length]  # [n, S]
        appended = self.rows[rows.clamp(min=0), heads[:, None]]  # [n, S, D_p]
        appended = torch.where((rows >= 0)[..., None], appended, appended.new_zeros(()))
        pruned = self.pruned[heads][:, None, :].expand(count, length, self.pruned.shape[1])
        return full.scatter_(-1, pruned.to(full.device), appended.to(full.dtype))

    def appended_tokens(self, lengths: Sequence[int]) -> int:
        """Stored slots (summed over heads) that hold an appended, full-width token."""
        width = max(lengths, default=0)
        rows = self._padded(width)[:, :width]
        valid = torch.arange(width, device=rows.device) < torch.tensor(list(lengths), device=rows.device)[:, None]
        return int(((rows >= 0) & valid).sum())

    def extra_token_bytes(self) -> int:
        """Bytes of one appended token's pruned channels for one head (``D_p * itemsize``)."""
        return self.pruned.shape[1] * self.rows.element_size()

    def allocated_bytes(self) -> int:
        """Bytes the rows hold (spare rows included; the slot map excluded, like the layers' positions)."""
        return self.rows.numel() * self.rows.element_size()

    # ------------------------------------------------------------------ internals
    def _padded(self, width: int) -> torch.Tensor:
        """The slot map with at least ``width`` columns (missing ones: ``-1``), as a tensor (not stored)."""
        missing = width - self.slot_rows.shape[1]
        if missing <= 0:
            return self.slot_rows
        pad = self.slot_rows.new_full((self.slot_rows.shape[0], missing), -1)
        return torch.cat([self.slot_rows, pad], dim=1)

    def _widen(self, width: int) -> None:
        if width > self.slot_rows.shape[1]:
            self.slot_rows = self._padded(max(width, math.ceil(self.slot_rows.shape[1] * 1.125)))

    def _make_room(self, new_tokens: int, lengths: Sequence[int]) -> None:
        """Room for ``new_tokens`` rows: the live rows (those some stored slot still maps to) move to a new store
        with spare room; rows of evicted tokens are dropped there."""
        if self.used_rows + new_tokens <= self.rows.shape[0]:
            return
        width = max(lengths, default=0)
        rows = self._padded(width)[:, :width]
        valid = (rows >= 0) & (
            torch.arange(width, device=rows.device) < torch.tensor(list(lengths), device=rows.device)[:, None]
        )
        live = torch.unique(rows[valid])
        remap = torch.full((max(self.used_rows, 1),), -1, dtype=torch.long, device=rows.device)
        remap[live] = torch.arange(live.numel(), device=rows.device)
        capacity = max(8, math.ceil((live.numel() + new_tokens) * 1.25))
        grown = self.rows.new_empty((capacity, *self.rows.shape[1:]))
        grown[: live.numel()] = self.rows[live]
        self.rows, self.used_rows = grown, int(live.numel())
        self.slot_rows = torch.where(valid, remap[rows.clamp(min=0)], torch.full_like(rows, -1))
