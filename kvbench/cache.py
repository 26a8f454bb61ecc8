"""kvbench's KV cache: per-layer, per-head variable-length storage that really frees evicted tokens.

A :class:`KVBenchCache` is a transformers :class:`~transformers.cache_utils.Cache` whose layers are
:class:`HeadwiseLayer`.  Each layer holds, for batch size 1, one key and one value sequence per *stored head*:

* while every head has the same length the layer is **dense**: ``keys``/``values`` are ``[1, H, S, D]`` tensors,
  exactly like transformers' ``DynamicLayer`` (so attention can take the stock SDPA path);
* after a per-head eviction leaves heads with different lengths the layer is **ragged**: ``head_keys[h]`` /
  ``head_values[h]`` are ``[1, 1, S_h, D]`` tensors, one per head (:class:`RaggedKV` is what ``update`` returns).

Only kept tokens are stored (no masks, no "fake" keys): :meth:`HeadwiseLayer.kv_bytes` is exactly
``sum_h S_h * D * 2 * itemsize``.  Each head also records the true positions of its kept tokens (int32), which
decode-time policies use (StreamingLLM's sinks) and which runs report.

Positions: :meth:`HeadwiseLayer.get_seq_length` returns the number of tokens *seen* (not stored), so anything in
transformers that derives positions from the cache length stays correct after eviction; kvbench's generation loop
passes explicit ``position_ids`` anyway.

Stored heads: ``num_stored_heads`` equals the model's ``num_key_value_heads``, or ``num_attention_heads`` when the
cache is built with ``expand_gqa=True`` (the per-query-head layout of the original SnapKV/PyramidKV code; keys and
values are then repeated per query head as they enter the cache).

Storage is behind this class so a GPU backend can replace it without touching methods: ``KVBenchCache(...,
backend="paged")`` stores every layer in :class:`kvbench.paged.PagedLayer` (fixed-size pages + block table, O(heads)
appends, varlen / Triton attention on CUDA) with the same layer API; ``backend="auto"`` (default) picks paged on CUDA
and this torch storage on CPU.  What both backends share (:class:`RaggedKV`, the ``keep`` index check, the
logical-length base layer) lives below them in :mod:`kvbench.cache_base`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from kvbench.cache_base import LogicalLengthLayer, RaggedKV, on_device, sorted_keep_indices
from kvbench.checks import check_choice
from kvbench.paged import DEFAULT_PAGE_SIZE, PagedLayer
from kvbench.sliding import SlidingWindowLayer


class HeadwiseLayer(LogicalLengthLayer):
    """One layer's KV storage with per-head lengths, for batch size 1 (see module docstring)."""

    def __init__(self, expand_factor: int = 1) -> None:
        super().__init__()
        self.expand_factor = expand_factor
        #: Ragged storage (``None`` while dense): per head ``[1, 1, S_h, D]``.
        self.head_keys: list[torch.Tensor] | None = None
        self.head_values: list[torch.Tensor] | None = None
        #: Original positions of the stored tokens, per head: ``[S_h]`` int32.
        self.positions: list[torch.Tensor] = []
        #: Tokens this layer has seen (prompt + generated), whatever was evicted.
        self.seen_tokens = 0

    # ------------------------------------------------------------------ transformers' CacheLayerMixin contract
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Record dtype/device from the first states (shape ``[1, H_kv, q, D]``)."""
        if key_states.shape[0] != 1:
            raise ValueError(
                f"kvbench caches hold one sequence (batch size 1), got batch size {key_states.shape[0]}; "
                "run samples one at a time"
            )
        self.dtype, self.device = key_states.dtype, key_states.device
        num_heads = key_states.shape[1] * self.expand_factor
        empty_k = key_states.new_empty((1, num_heads, 0, key_states.shape[-1]))
        empty_v = value_states.new_empty((1, num_heads, 0, value_states.shape[-1]))
        self.keys, self.values = empty_k, empty_v
        self.positions = [torch.empty(0, dtype=torch.int32, device=self.device) for _ in range(num_heads)]
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor | RaggedKV, torch.Tensor | RaggedKV]:
        """Append ``q`` new tokens to every head and return the layer's full keys and values.

        Parameters
        ----------
        key_states, value_states:
            ``[1, H_kv, q, D]`` states of the new tokens (post-RoPE keys).

        Returns
        -------
        Dense ``[1, H, S, D]`` tensors, or :class:`RaggedKV` per-head sequences when heads differ in length.
        """
        key_states, value_states = self._incoming(key_states, value_states)
        new_tokens = key_states.shape[2]
        new_positions = torch.arange(
            self.seen_tokens, self.seen_tokens + new_tokens, dtype=torch.int32, device=key_states.device
        )
        self.positions = [torch.cat([pos, new_positions]) for pos in self.positions]
        self.seen_tokens += new_tokens
        if self.head_keys is None:
            self.keys = torch.cat([self.keys, key_states], dim=-2)
            self.values = torch.cat([self.values, value_states], dim=-2)
            return self.keys, self.values
        assert self.head_values is not None
        for head in range(len(self.head_keys)):
            self.head_keys[head] = torch.cat([self.head_keys[head], key_states[:, head : head + 1]], dim=-2)
            self.head_values[head] = torch.cat([self.head_values[head], value_states[:, head : head + 1]], dim=-2)
        return RaggedKV(self.head_keys), RaggedKV(self.head_values)

    def reset(self) -> None:
        self.keys = self.values = None
        self.head_keys = self.head_values = None
        self.positions = []
        self.seen_tokens = 0
        self.is_initialized = False

    # ------------------------------------------------------------------ kvbench API
    @property
    def is_ragged(self) -> bool:
        """Whether heads currently differ in length (per-head storage)."""
        return self.head_keys is not None

    @property
    def num_heads(self) -> int:
        """Number of stored heads."""
        return len(self.positions)

    def head_lengths(self) -> list[int]:
        """Stored tokens per head."""
        return [int(pos.shape[0]) for pos in self.positions]

    def stored_tokens(self) -> int:
        """Stored tokens summed over heads."""
        return sum(self.head_lengths())

    def head_kv(self, head: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of one head: two ``[S_h, D]`` views."""
        if self.head_keys is not None and self.head_values is not None:
            return self.head_keys[head][0, 0], self.head_values[head][0, 0]
        assert self.keys is not None and self.values is not None
        return self.keys[0, head], self.values[0, head]

    def dense_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values as ``[H, S, D]`` (only while all heads have the same length)."""
        if self.head_keys is not None:
            raise ValueError("layer is ragged (heads differ in length); use head_kv(h)")
        assert self.keys is not None and self.values is not None
        return self.keys[0], self.values[0]

    def kv_bytes(self) -> int:
        """Bytes held by keys and values (positions metadata excluded)."""
        if not self.is_initialized:
            return 0
        if self.head_keys is not None and self.head_values is not None:
            tensors = [*self.head_keys, *self.head_values]
        else:
            assert self.keys is not None and self.values is not None
            tensors = [self.keys, self.values]
        return sum(t.numel() * t.element_size() for t in tensors)

    def keep(self, indices: Sequence[torch.Tensor] | torch.Tensor) -> None:
        """Keep only the given stored slots of each head and free the rest.

        Parameters
        ----------
        indices:
            Per head, a 1-D integer tensor of slot indices into that head's current storage (``0 <= i < S_h``),
            unique; they are sorted here so tokens stay in position order.  A ``[H, k]`` tensor is accepted
            when every head keeps the same number.
        """
        sorted_idx = sorted_keep_indices(indices, self.head_lengths(), self.device)
        new_keys, new_values = [], []
        for head, idx in enumerate(sorted_idx):
            head_k, head_v = self.head_kv(head)
            # index_select copies, so the old (full-length) storage is freed once dropped below.
            new_keys.append(head_k.index_select(0, idx)[None, None])
            new_values.append(head_v.index_select(0, idx)[None, None])
            self.positions[head] = self.positions[head].index_select(0, idx)
        if len({k.shape[2] for k in new_keys}) == 1:
            self.keys = torch.cat(new_keys, dim=1)
            self.values = torch.cat(new_values, dim=1)
            self.head_keys = self.head_values = None
        else:
            self.head_keys, self.head_values = new_keys, new_values
            self.keys = self.values = None


BACKENDS = ("auto", "torch", "paged")
#: Environment variable that overrides the default backend (``auto``) of every KVBenchCache built without one.
BACKEND_ENV = "KVBENCH_CACHE_BACKEND"


def resolve_backend(backend: str | None, device: torch.device) -> str:
    """``torch`` or ``paged`` for a cache on ``device``: ``auto`` is paged on CUDA, torch elsewhere.

    ``None`` reads :data:`BACKEND_ENV` (default ``auto``).
    """
    if backend is None:
        backend = os.environ.get(BACKEND_ENV, "auto") or "auto"
    check_choice("cache backend", backend, BACKENDS)
    if backend == "auto":
        return "paged" if device.type == "cuda" else "torch"
    return backend


class KVBenchCache(Cache):
    """A transformers Cache of per-head KV layers (batch size 1).

    Parameters
    ----------
    num_layers:
        Number of decoder layers of the model.
    expand_factor:
        Repeat factor for incoming KV heads: 1 stores one sequence per KV head; ``num_attention_heads //
        num_key_value_heads`` stores one per query head (``gqa_granularity=query_head``).
    backend:
        ``torch`` (:class:`HeadwiseLayer`: dense / ragged tensors, the CPU default), ``paged``
        (:class:`kvbench.paged.PagedLayer`: fixed-size pages + block table, O(heads) appends, varlen/Triton
        attention on CUDA) or ``auto`` (paged on CUDA, torch otherwise, decided at each layer's first update).
        ``None``: the ``KVBENCH_CACHE_BACKEND`` environment variable, else ``auto``.
    page_size:
        Tokens per page of the paged backend (``None``: 16; use a multiple of 256 for FlashAttention-2's paged path).
    sliding_windows:
        Per layer, its sliding window or ``None`` (:func:`kvbench.sliding.layer_windows`); sliding layers are held
        in :class:`kvbench.sliding.SlidingWindowLayer` (never evicted).  ``None``: every layer is full attention.
    compress_sliding:
        Keep the sliding layers in evictable storage instead (eviction then acts on them too; attention applies
        their window on the kept tokens' true positions).  Off by default.
    """

    def __init__(
        self,
        num_layers: int,
        expand_factor: int = 1,
        backend: str | None = None,
        page_size: int | None = None,
        sliding_windows: Sequence[int | None] | None = None,
        compress_sliding: bool = False,
    ) -> None:
        super().__init__(layers=[HeadwiseLayer(expand_factor) for _ in range(num_layers)])
        self.expand_factor = expand_factor
        if backend is None:
            backend = os.environ.get(BACKEND_ENV, "auto") or "auto"
        self.backend = check_choice("cache backend", backend, BACKENDS)
        self.page_size = page_size
        if backend == "paged":
            self.layers = [self._paged_layer() for _ in range(num_layers)]
        #: Per layer, its sliding window (``None``: full attention).
        self.windows: list[int | None] = [None] * num_layers
        if sliding_windows is not None:
            if len(sliding_windows) != num_layers:
                raise ValueError(f"got {len(sliding_windows)} sliding windows for {num_layers} layers")
            self.windows = list(sliding_windows)
            for layer_idx, window in enumerate(sliding_windows):
                if window is not None and not compress_sliding:
                    self.layers[layer_idx] = SlidingWindowLayer(window)

    @property
    def sliding_layers(self) -> list[int]:
        """Indices of the sliding-window layers (evicted only with ``compress_sliding``)."""
        return [idx for idx, window in enumerate(self.windows) if window is not None]

    @property
    def compressible_layers(self) -> list[int]:
        """Indices of the layers eviction acts on (full attention)."""
        return [idx for idx, layer in enumerate(self.layers) if not isinstance(layer, SlidingWindowLayer)]

    def _paged_layer(self) -> CacheLayerMixin:
        return PagedLayer(self.expand_factor, page_size=self.page_size or DEFAULT_PAGE_SIZE)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[Any, Any]:
        """transformers' update; with ``backend="auto"`` the layer's storage is chosen from the states' device."""
        layer = self.layers[layer_idx]
        if (
            self.backend == "auto"
            and not layer.is_initialized
            and isinstance(layer, HeadwiseLayer)
            and resolve_backend("auto", key_states.device) == "paged"
        ):
            self.layers[layer_idx] = self._paged_layer()
        with on_device(key_states.device):
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    @property
    def headwise_layers(self) -> list[HeadwiseLayer]:
        """The layers, typed (:class:`HeadwiseLayer`, or :class:`kvbench.paged.PagedLayer` with the same API)."""
        return self.layers  # type: ignore[return-value]

    def reserve(self, extra_tokens: int) -> None:
        """Pre-allocate room for ``extra_tokens`` more tokens per head (paged layers; no-op for torch layers)."""
        for layer in self.layers:
            if hasattr(layer, "reserve"):
                layer.reserve(extra_tokens)

    def head_lengths(self) -> list[list[int]]:
        """Stored tokens per layer and head: ``[L][H]``."""
        return [layer.head_lengths() for layer in self.headwise_layers]

    def layer_lengths(self) -> list[int]:
        """Stored tokens per layer, summed over heads and divided by the number of stored heads (mean per head)."""
        return [
            round(layer.stored_tokens() / layer.num_heads) if layer.num_heads else 0 for layer in self.headwise_layers
        ]

    def kv_bytes(self) -> int:
        """Bytes held by keys and values over all layers."""
        return sum(layer.kv_bytes() for layer in self.headwise_layers)
