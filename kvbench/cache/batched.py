"""Several samples' caches decoded in one model forward (``run.decode_batch``, issue #33).

A :class:`BatchedCache` is the ``past_key_values`` of a batched decoding step: it holds ``B`` samples' own
:class:`~kvbench.cache.KVBenchCache` objects (each compressed by its own prefill, with its own per-layer and per-head
lengths) and their eviction sessions.  The model runs its dense parts (embeddings, projections, MLP, ``lm_head``) on
the ``[B, 1]`` batch at once; at each layer, :meth:`BatchedCache.update` hands row ``b`` of the new keys and values to
sample ``b``'s cache and returns a :class:`BatchedKV`, and kvbench's attention function
(:func:`kvbench.attention.kvbench_attention_forward`) attends row by row over each sample's own storage and calls
each sample's session, exactly as a batch-1 step does.  No padding and no mask: sample ``b`` never sees another
sample's keys.

Positions come from the caller (each sample's next position after eviction, ``position_ids`` ``[B, 1]``), never
from a cache length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache


@dataclass
class BatchedKV:
    """What :meth:`BatchedCache.update` returns (as both "keys" and "values"): per sample, what its own cache
    layer's ``update`` returned, with the sample's cache and session (the attention function's per-row inputs).

    Attributes
    ----------
    keys, values:
        Per sample ``b``, its layer's ``update`` result (dense ``[1, H, S, D]``, per-head or paged storage).
    caches:
        Per sample, its :class:`~kvbench.cache.KVBenchCache`.
    sessions:
        Per sample, its :class:`~kvbench.inference.eviction.EvictionSession` (or ``None``: no eviction hook).
    """

    keys: list[Any]
    values: list[Any]
    caches: Sequence[Any]
    sessions: Sequence[Any]

    @property
    def batch_size(self) -> int:
        return len(self.keys)


class BatchedCache(Cache):
    """The ``past_key_values`` of one batched decoding step over ``B`` samples' own caches (module docstring).

    Parameters
    ----------
    caches:
        Per sample, its :class:`~kvbench.cache.KVBenchCache` (row ``b`` of the batch is ``caches[b]``).
    sessions:
        Per sample, its eviction session (``None`` entries: no eviction hook for that sample).
    """

    def __init__(self, caches: Sequence[Any], sessions: Sequence[Any]) -> None:
        if not caches or len(caches) != len(sessions):
            raise ValueError(f"BatchedCache needs one session per cache, got {len(caches)} and {len(sessions)}")
        # transformers reads layer properties (sliding, lengths) through ``layers``: the first sample's stand for all.
        super().__init__(layers=list(caches[0].layers))
        self.caches = list(caches)
        self.sessions = list(sessions)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[BatchedKV, BatchedKV]:
        """Append row ``b`` of ``key_states`` / ``value_states`` ``[B, H_kv, q, D]`` to sample ``b``'s cache layer."""
        if key_states.shape[0] != len(self.caches):
            raise ValueError(f"batched step of {key_states.shape[0]} rows over {len(self.caches)} caches")
        keys, values = [], []
        for row, cache in enumerate(self.caches):
            key, value = cache.update(key_states[row : row + 1], value_states[row : row + 1], layer_idx)
            keys.append(key)
            values.append(value)
        batched = BatchedKV(keys, values, self.caches, self.sessions)
        return batched, batched

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens seen by the longest sample (positions come from the caller; transformers only reads this when none
        are given)."""
        return max(cache.get_seq_length(layer_idx) for cache in self.caches)
