"""What every kvbench cache layer shares, below both storage backends (:mod:`kvbench.cache.kv_cache`'s torch layers and
:mod:`kvbench.cache.paged`'s pages): the ragged per-head view returned by ``update``, the checked ``keep`` indices, and
the logical-length layer base class.

Imports flow one way: ``cache.base`` <- ``attention.ops`` <- ``cache.paged`` <- ``cache.kv_cache`` <-
``attention.function``.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import CacheLayerMixin


@dataclass
class RaggedKV:
    """Per-head key (or value) sequences of one layer, as returned by :meth:`HeadwiseLayer.update` when ragged.

    Attributes
    ----------
    heads:
        One tensor per stored head, each ``[1, 1, S_h, D]``.
    """

    heads: list[torch.Tensor]

    @property
    def num_heads(self) -> int:
        return len(self.heads)

    @property
    def lengths(self) -> list[int]:
        return [int(head.shape[2]) for head in self.heads]


@dataclass
class StorageStats:
    """What a cache layer's storage has done so far (both backends), for cost checks and the bench.

    Attributes
    ----------
    reallocations:
        Times the layer's buffers / page pool were replaced by new ones (growth, or a rebuild after eviction).
    rows_copied:
        Token rows (one token of one head: its key, value and position) copied by those rebuilds, by growth, by
        compaction and by in-place one-token evictions (appends of new tokens are not counted).
    """

    reallocations: int = 0
    rows_copied: int = 0


def on_device(device: torch.device) -> AbstractContextManager[Any]:
    """Make ``device`` the current CUDA device (where Triton launches kernels) for a layer's work; a no-op on CPU.

    With a device map (``model.device_map``) layers live on different GPUs, and a Triton kernel must run on the
    device of the tensors it gets, not on the process's current device.
    """
    return torch.cuda.device(device) if device.type == "cuda" else nullcontext()


def sorted_keep_indices(
    indices: Sequence[torch.Tensor] | torch.Tensor, lengths: list[int], device: torch.device
) -> list[torch.Tensor]:
    """Validate and sort the per-head slot indices given to ``keep`` (shared by every storage backend).

    Parameters
    ----------
    indices:
        Per head a 1-D integer tensor of unique slot indices (``0 <= i < S_h``), or an ``[H, k]`` tensor.
    lengths:
        Stored tokens per head ``S_h``.

    Returns
    -------
    Per head, sorted ``[k_h]`` int64 indices on ``device``.
    """
    if isinstance(indices, torch.Tensor):
        if indices.dim() != 2:
            raise ValueError(f"indices must be [H, k] or a list of 1-D tensors, got shape {tuple(indices.shape)}")
        per_head = list(indices.unbind(0))
    else:
        per_head = list(indices)
    if len(per_head) != len(lengths):
        raise ValueError(f"got indices for {len(per_head)} heads, layer stores {len(lengths)}")
    sorted_idx = []
    for head, idx in enumerate(per_head):
        idx = torch.sort(idx.to(device=device, dtype=torch.long)).values
        if idx.numel() and (idx[0] < 0 or idx[-1] >= lengths[head]):
            raise IndexError(f"head {head}: slot index out of range [0, {lengths[head]})")
        if idx.numel() > 1 and bool((idx[1:] == idx[:-1]).any()):
            raise ValueError(f"head {head}: duplicate slot indices")
        sorted_idx.append(idx)
    return sorted_idx


class LogicalLengthLayer(CacheLayerMixin):
    """What every kvbench storage backend shares: lengths are *logical* (tokens seen, whatever was evicted),
    eviction goes through ``keep()``, and transformers' tail-``crop`` is refused."""

    is_sliding = False
    is_compileable = False
    is_croppable = False
    #: Tokens this layer has seen (prompt + generated); subclasses keep it up to date in ``update``.
    seen_tokens: int = 0

    def get_seq_length(self) -> int:
        """Tokens seen so far (the logical sequence length), not the number stored."""
        return self.seen_tokens

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv_length, kv_offset) in logical positions; kvbench's attention builds its own per-head masks."""
        return self.seen_tokens + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def crop(self, max_length: int) -> None:
        raise NotImplementedError("kvbench caches evict through keep(); crop() is not supported")

    #: Repeat factor applied to incoming KV heads (num_attention_heads // num_key_value_heads, or 1).
    expand_factor: int = 1

    def _incoming(self, key_states: torch.Tensor, value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The common start of ``update``: initialise on first use, check batch size 1, and repeat KV heads per
        query head when the layer stores query-head granularity.  Returns ``[1, H, q, D]`` keys and values."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if key_states.shape[0] != 1:
            raise ValueError(f"kvbench caches hold batch size 1, got {key_states.shape[0]}")
        if self.expand_factor > 1:
            key_states = key_states.repeat_interleave(self.expand_factor, dim=1)
            value_states = value_states.repeat_interleave(self.expand_factor, dim=1)
        return key_states, value_states
