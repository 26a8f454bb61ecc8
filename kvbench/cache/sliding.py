"""Sliding-window and hybrid attention: which layers of a model slide, and the cache layer that holds them.

Models such as Gemma-2/3, gpt-oss, Mistral (``sliding_window`` set), Qwen2 (``use_sliding_window``) or Cohere-2 mix
full-attention layers with sliding-window layers, whose queries see only the last ``window`` positions (themselves
included).  kvbench reads the layout the way transformers' own ``DynamicCache(config=...)`` does
(:func:`transformers.cache_utils.get_layer_types_and_kwargs` on the decoder config: ``layer_types``, else the
per-layer ``sliding_window``; each model's config turns ``use_sliding_window`` / ``max_window_layers`` into those), so
a layer slides in kvbench exactly when it slides in transformers.

* Full-attention layers get kvbench's evictable storage (:class:`kvbench.cache.kv_cache.HeadwiseLayer` or the paged
  layer).
* Sliding layers get a :class:`SlidingWindowLayer`: it keeps the last ``window - 1`` tokens after each forward (as
  transformers' ``DynamicSlidingWindowLayer``), returns the stored tokens plus the new ones, and attention applies
  the window inside the chunk (:func:`sliding_causal_mask`).  Eviction methods never touch these layers -- a sliding
  layer already holds at most its window -- so budgets, layer allocators and the record count the *compressible*
  (full-attention) layers only (:mod:`kvbench.inference.eviction`).

Layer kinds kvbench cannot hold (recurrent / linear-attention / convolution states, layers that reuse another
layer's cache, chunked attention) raise :class:`UnsupportedLayers` naming them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import get_layer_types_and_kwargs

from kvbench.cache.base import LogicalLengthLayer
from kvbench.errors import KVBenchError

#: transformers layer types that are plain causal attention over every token.
FULL_LAYER_TYPES = ("full_attention",)
#: transformers layer types that are causal attention over the last ``sliding_window`` tokens.
SLIDING_LAYER_TYPES = ("sliding_attention",)


class UnsupportedLayers(KVBenchError):
    """The model has layers whose cache is not a plain key/value sequence (recurrent, chunked, shared...)."""


def layer_windows(config: Any) -> list[int | None]:
    """Per decoder layer, its sliding window (``None``: full attention), as transformers' ``DynamicCache`` reads it.

    Parameters
    ----------
    config:
        A model config (its decoder text config is used for multimodal wrappers).

    Raises
    ------
    UnsupportedLayers
        When a layer type is neither full nor sliding attention (names the layer types and the supported ones).
    """
    decoder_config = config.get_text_config(decoder=True)
    layer_types, per_layer_kwargs = get_layer_types_and_kwargs(decoder_config)
    windows: list[int | None] = []
    unsupported = sorted({kind for kind in layer_types if kind not in FULL_LAYER_TYPES + SLIDING_LAYER_TYPES})
    if unsupported:
        raise UnsupportedLayers(
            f"{type(config).__name__} has layer types {unsupported}, which kvbench's cache does not hold; supported: "
            f"{list(FULL_LAYER_TYPES + SLIDING_LAYER_TYPES)}"
        )
    for kind, kwargs in zip(layer_types, per_layer_kwargs, strict=True):
        windows.append(int(kwargs["sliding_window"]) if kind in SLIDING_LAYER_TYPES else None)
    return windows


def sliding_causal_mask(query_length: int, key_length: int, window: int, device: torch.device) -> torch.Tensor:
    """Boolean ``[q, S]`` mask of ``q`` new queries that are the last ``q`` of ``S`` contiguous stored tokens: query
    ``i`` sees key ``j`` when ``j`` is not in its future and at most ``window - 1`` positions back (transformers'
    ``sliding_window_overlay``: ``kv_idx > q_idx - window``)."""
    if key_length < query_length:
        raise ValueError(f"cache holds {key_length} tokens, fewer than the {query_length} new queries")
    rows = torch.arange(query_length, device=device)[:, None] + (key_length - query_length)
    cols = torch.arange(key_length, device=device)[None, :]
    return (cols <= rows) & (cols > rows - window)


class SlidingWindowLayer(LogicalLengthLayer):
    """One sliding-window layer's cache (batch size 1): the last ``window - 1`` tokens, all heads the same length.

    Same read API as :class:`kvbench.cache.kv_cache.HeadwiseLayer` (``positions``, ``head_lengths``, ``dense_kv``,
    ``stored_bytes``...), so records and byte counts cover it; ``keep`` is refused (eviction skips sliding layers).
    Keys and values are stored per KV head (never expanded per query head: nothing scores them).

    Parameters
    ----------
    window:
        The layer's sliding window (a query sees itself and the ``window - 1`` positions before it).
    """

    is_sliding = True

    def __init__(self, window: int) -> None:
        super().__init__()
        if window < 1:
            raise ValueError(f"sliding window must be >= 1, got {window}")
        self.window = window
        self.seen_tokens = 0
        self.positions: list[torch.Tensor] = []

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Record dtype/device from the first ``[1, H_kv, q, D]`` states."""
        self.dtype, self.device = key_states.dtype, key_states.device
        self.keys = key_states.new_empty((1, key_states.shape[1], 0, key_states.shape[-1]))
        self.values = value_states.new_empty((1, value_states.shape[1], 0, value_states.shape[-1]))
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``q`` tokens; return the ``[1, H_kv, S, D]`` keys and values the new queries attend over (the stored
        ``<= window - 1`` tokens and the new ones, as dense tensors), then keep only the last ``window - 1``."""
        key_states, value_states = self._incoming(key_states, value_states)
        assert self.keys is not None and self.values is not None
        full_keys = torch.cat([self.keys, key_states], dim=-2)
        full_values = torch.cat([self.values, value_states], dim=-2)
        self.seen_tokens += key_states.shape[2]
        keep = self.window - 1
        self.keys = full_keys[:, :, full_keys.shape[2] - min(keep, full_keys.shape[2]) :]
        self.values = full_values[:, :, full_values.shape[2] - min(keep, full_values.shape[2]) :]
        stored = self.keys.shape[2]
        first = self.seen_tokens - stored
        positions = torch.arange(first, self.seen_tokens, dtype=torch.int32, device=self.device)
        self.positions = [positions] * self.keys.shape[1]
        return full_keys, full_values

    def reset(self) -> None:
        self.keys = self.values = None
        self.positions = []
        self.seen_tokens = 0
        self.is_initialized = False

    # ------------------------------------------------------------------ the kvbench read API
    @property
    def is_ragged(self) -> bool:
        return False

    @property
    def num_heads(self) -> int:
        return len(self.positions)

    def head_lengths(self) -> list[int]:
        return [int(pos.shape[0]) for pos in self.positions]

    def stored_tokens(self) -> int:
        return sum(self.head_lengths())

    def dense_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Stored keys and values as ``[H_kv, S, D]``."""
        assert self.keys is not None and self.values is not None
        return self.keys[0], self.values[0]

    def head_kv(self, head: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One head's stored keys and values, two ``[S, D]`` views."""
        keys, values = self.dense_kv()
        return keys[head], values[head]

    def token_head_bytes(self) -> int:
        """Key + value bytes of one token of one head (0 before the first update)."""
        if self.keys is None:
            return 0
        return self.keys.shape[-1] * 2 * self.keys.element_size()

    def stored_bytes(self) -> int:
        """Key + value bytes of the stored window (``H_kv * S * D * 2 * itemsize``)."""
        if not self.is_initialized or self.keys is None or self.values is None:
            return 0
        return sum(t.numel() * t.element_size() for t in (self.keys, self.values))

    def allocated_bytes(self) -> int:
        """Bytes of the key and value storage the window's views keep alive (the last update's concatenation)."""
        if not self.is_initialized or self.keys is None or self.values is None:
            return 0
        return sum(t.untyped_storage().nbytes() for t in (self.keys, self.values))

    def keep(self, indices: Sequence[torch.Tensor] | torch.Tensor) -> None:
        raise NotImplementedError("a sliding-window layer is not evicted (it holds at most its window)")

    def evict_slots(self, slots: torch.Tensor, heads: Sequence[int] | None = None) -> torch.Tensor:
        raise NotImplementedError("a sliding-window layer is not evicted (it holds at most its window)")

    def rewrite_keys(self, keys: torch.Tensor, positions: torch.Tensor) -> None:
        raise NotImplementedError("a sliding-window layer's keys are not re-rotated (it is never evicted)")

    def reserve(self, extra_tokens: int) -> None:
        """Nothing to pre-allocate (the layer never grows past its window)."""
