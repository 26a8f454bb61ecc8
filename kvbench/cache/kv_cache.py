"""kvbench's KV cache: per-layer, per-head variable-length storage that really frees evicted tokens.

A :class:`KVBenchCache` is a transformers :class:`~transformers.cache_utils.Cache` whose layers are
:class:`HeadwiseLayer`.  Each layer holds, for batch size 1, one key and one value sequence per *stored head*:

* while every head has the same length the layer is **dense**: ``keys``/``values`` are ``[1, H, S, D]`` views,
  like transformers' ``DynamicLayer`` tensors (so attention can take the stock SDPA path);
* after a per-head eviction leaves heads with different lengths the layer is **ragged**: ``head_keys[h]`` /
  ``head_values[h]`` are ``[1, 1, S_h, D]`` views, one per head (:class:`RaggedKV` is what ``update`` returns).

Both are views of one ``[1, H, C, D]`` buffer per layer with spare capacity, so a decoding step appends without
copying the layer, and decode-time eviction replaces a slot in place (:meth:`HeadwiseLayer.evict_slots`): a step
costs what is kept, not a copy of it.  Only kept tokens count (no masks, no "fake" keys):
:meth:`HeadwiseLayer.stored_bytes` is exactly ``sum_h S_h * D * 2 * itemsize`` (with the spare capacity, at most 1/8
of it after growth, it is :meth:`HeadwiseLayer.allocated_bytes`; an eviction by ``keep`` reallocates to the exact
size).
Each head also records the true positions of its kept tokens (int32), which decode-time policies use (StreamingLLM's
sinks, the recent windows) and which runs report; after in-place evictions slots are no longer in position order.

Positions: :meth:`HeadwiseLayer.get_seq_length` returns the number of tokens *seen* (not stored), so anything in
transformers that derives positions from the cache length stays correct after eviction; kvbench's generation loop
passes explicit ``position_ids`` anyway.

Stored heads: ``num_stored_heads`` equals the model's ``num_key_value_heads``, or ``num_attention_heads`` when the
cache is built with ``expand_gqa=True`` (the per-query-head layout of the original SnapKV/PyramidKV code; keys and
values are then repeated per query head as they enter the cache).

Storage is behind this class so a GPU backend can replace it without touching methods: ``KVBenchCache(...,
backend="paged")`` stores every layer in :class:`kvbench.cache.paged.PagedLayer` (fixed-size pages + block table,
O(heads) appends, varlen / Triton attention on CUDA) with the same layer API; ``backend="auto"`` (default) picks paged
on CUDA and this torch storage on CPU.  What both backends share (:class:`RaggedKV`, the ``keep`` index check, the
logical-length base layer) lives below them in :mod:`kvbench.cache.base`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from kvbench.cache.base import (
    EvictableLayer,
    LayerKV,
    LogicalLengthLayer,
    RaggedKV,
    StorageStats,
    on_device,
    sorted_keep_indices,
)
from kvbench.cache.paged import DEFAULT_PAGE_SIZE, GROWTH_FRACTION, PagedLayer
from kvbench.cache.sliding import SlidingWindowLayer
from kvbench.checks import check_choice


class HeadwiseLayer(LogicalLengthLayer):
    """One layer's KV storage with per-head lengths, for batch size 1 (see module docstring).

    Storage is one buffer per layer, ``[1, H, C, D]`` for keys and values and ``[H, C]`` int32 positions, with
    head ``h``'s tokens in slots ``0 .. S_h - 1`` (capacity ``C >= max_h S_h``).  Appends write into the slack
    (the buffer grows by at least :data:`GROWTH_FRACTION` when full, so an append is amortised O(heads)); a decode
    policy's one-token eviction (:meth:`evict_slots`) moves each head's last token into its evicted slot, in place,
    with one vectorised copy of ``H`` rows: no step copies what stays.  Slots are therefore *not* in position
    order once decoding has evicted; :attr:`positions` says which token each slot holds.
    """

    def __init__(self, expand_factor: int = 1) -> None:
        super().__init__()
        self.expand_factor = expand_factor
        #: ``[1, H, C, D]`` key / value buffers and ``[H, C]`` int32 positions (``None`` before the first update).
        self.key_buffer: torch.Tensor | None = None
        self.value_buffer: torch.Tensor | None = None
        self.position_buffer: torch.Tensor | None = None
        #: Stored tokens per head, on the host and as an ``[H]`` int64 tensor on the cache's device.
        self.host_lengths: list[int] = []
        self.lengths: torch.Tensor | None = None
        #: Tokens this layer has seen (prompt + generated), whatever was evicted.
        self.seen_tokens = 0
        #: Storage events, for cost checks: buffer reallocations (growth or eviction by ``keep``), and rows (tokens x
        #: heads) copied by them and by one-token in-place evictions.
        self.stats = StorageStats()

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
        self.key_buffer = key_states.new_empty((1, num_heads, 0, key_states.shape[-1]))
        self.value_buffer = value_states.new_empty((1, num_heads, 0, value_states.shape[-1]))
        self.position_buffer = torch.empty((num_heads, 0), dtype=torch.int32, device=self.device)
        self.host_lengths = [0] * num_heads
        self.lengths = torch.zeros(num_heads, dtype=torch.long, device=self.device)
        self._refresh_views()
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[LayerKV, LayerKV]:
        """Append ``q`` new tokens to every head and return the layer's full keys and values.

        Parameters
        ----------
        key_states, value_states:
            ``[1, H_kv, q, D]`` states of the new tokens (post-RoPE keys).

        Returns
        -------
        Keys and values as :class:`LayerKV`, whose ``states`` are dense ``[1, H, S, D]`` views, or :class:`RaggedKV`
        per-head views when heads differ in length.
        """
        key_states, value_states = self._incoming(key_states, value_states)
        new_tokens = key_states.shape[2]
        self._ensure_capacity(max(self.host_lengths) + new_tokens)
        assert self.key_buffer is not None and self.value_buffer is not None and self.position_buffer is not None
        assert self.lengths is not None
        first = self.seen_tokens
        if not self.is_ragged:
            stored = self.host_lengths[0]
            self.key_buffer[:, :, stored : stored + new_tokens] = key_states
            self.value_buffer[:, :, stored : stored + new_tokens] = value_states
            self.position_buffer[:, stored : stored + new_tokens] = torch.arange(
                first, first + new_tokens, dtype=torch.int32, device=self.device
            )
        else:
            heads = torch.arange(self.num_heads, device=self.device)[:, None]  # [H, 1]
            offsets = torch.arange(new_tokens, device=self.device)
            slots = self.lengths[:, None] + offsets  # [H, q]
            self.key_buffer[0, heads, slots] = key_states[0].to(self.key_buffer.dtype)
            self.value_buffer[0, heads, slots] = value_states[0].to(self.value_buffer.dtype)
            self.position_buffer[heads, slots] = (offsets + first).to(torch.int32).expand(self.num_heads, -1)
        self.lengths += new_tokens
        self.host_lengths = [length + new_tokens for length in self.host_lengths]
        self.seen_tokens += new_tokens
        self._refresh_views()
        if self.head_keys is None:  # dense: plain tensors, which some models reshape before attention
            assert self.keys is not None and self.values is not None
            return self.keys, self.values  # type: ignore[return-value]
        assert self.head_values is not None
        return LayerKV(self, RaggedKV(self.head_keys)), LayerKV(self, RaggedKV(self.head_values))

    def reset(self) -> None:
        self.__init__(self.expand_factor)  # type: ignore[misc]
        self.key_channels, self.dropped_key_channels, self.appended_keys = None, 0, None

    # ------------------------------------------------------------------ buffer management
    def _ensure_capacity(self, tokens: int) -> None:
        """Grow the buffers (one copy of what is stored) when ``tokens`` slots per head do not fit."""
        assert self.key_buffer is not None and self.value_buffer is not None and self.position_buffer is not None
        capacity = self.key_buffer.shape[2]
        if tokens <= capacity:
            return
        self._reallocate(max(tokens, capacity + math.ceil(capacity * GROWTH_FRACTION)))

    def reserve(self, extra_tokens: int) -> None:
        """Make room for ``extra_tokens`` more tokens per head, so the next appends do not grow the buffers."""
        if self.is_initialized and extra_tokens > 0:
            assert self.key_buffer is not None
            needed = max(self.host_lengths) + extra_tokens
            if needed > self.key_buffer.shape[2]:
                self._reallocate(needed)

    def _reallocate(self, capacity: int, index: torch.Tensor | None = None, lengths: list[int] | None = None) -> None:
        """New buffers of ``capacity`` slots holding, per head, the stored slots ``index`` ``[H, k]`` (default:
        every stored slot); entries of ``index`` past ``lengths[h]`` are ignored.  The old buffers are freed."""
        assert self.key_buffer is not None and self.value_buffer is not None and self.position_buffer is not None
        lengths = self.host_lengths if lengths is None else lengths
        width = max(lengths, default=0)
        old_k, old_v, old_pos = self.key_buffer, self.value_buffer, self.position_buffer
        heads, dim = old_k.shape[1], old_k.shape[-1]
        self.key_buffer = old_k.new_empty((1, heads, capacity, dim))
        self.value_buffer = old_v.new_empty((1, heads, capacity, old_v.shape[-1]))
        self.position_buffer = old_pos.new_empty((heads, capacity))
        if index is None:
            self.key_buffer[:, :, :width] = old_k[:, :, :width]
            self.value_buffer[:, :, :width] = old_v[:, :, :width]
            self.position_buffer[:, :width] = old_pos[:, :width]
        else:
            gather = index[None, :, :, None]
            self.key_buffer[:, :, :width] = old_k.gather(2, gather.expand(1, -1, -1, dim))
            self.value_buffer[:, :, :width] = old_v.gather(2, gather.expand(1, -1, -1, old_v.shape[-1]))
            self.position_buffer[:, :width] = old_pos.gather(1, index)
        self.stats.reallocations += 1
        self.stats.rows_copied += sum(lengths)

    def _refresh_views(self) -> None:
        """Point ``keys``/``values`` (dense) or ``head_keys``/``head_values`` (ragged) at the stored slots."""
        assert self.key_buffer is not None and self.value_buffer is not None
        keys = self._full_width(self.key_buffer[0, :, : max(self.host_lengths, default=0)])[None]  # views, or copies
        if len(set(self.host_lengths)) <= 1:
            stored = self.host_lengths[0] if self.host_lengths else 0
            self.keys = keys[:, :, :stored]
            self.values = self.value_buffer[:, :, :stored]
            self.head_keys = self.head_values = None
        else:
            self.keys = self.values = None
            self.head_keys = [keys[:, h : h + 1, :n] for h, n in enumerate(self.host_lengths)]
            self.head_values = [self.value_buffer[:, h : h + 1, :n] for h, n in enumerate(self.host_lengths)]

    # ------------------------------------------------------------------ kvbench API
    @property
    def is_ragged(self) -> bool:
        """Whether heads currently differ in length (per-head storage)."""
        return len(set(self.host_lengths)) > 1

    @property
    def num_heads(self) -> int:
        """Number of stored heads."""
        return len(self.host_lengths)

    @property
    def positions(self) -> list[torch.Tensor]:
        """Original positions of the stored tokens, per head ``[S_h]`` int32 (views, aligned with the slots)."""
        if self.position_buffer is None:
            return []
        return [self.position_buffer[h, :n] for h, n in enumerate(self.host_lengths)]

    def head_lengths(self) -> list[int]:
        """Stored tokens per head."""
        return list(self.host_lengths)

    def stored_tokens(self) -> int:
        """Stored tokens summed over heads."""
        return sum(self.host_lengths)

    def head_kv(self, head: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of one head: two ``[S_h, D]`` views (keys: full-width copies when appended keys are kept)."""
        assert self.key_buffer is not None and self.value_buffer is not None
        stored = self.host_lengths[head]
        keys = self._full_width(self.key_buffer[0, head : head + 1, :stored], torch.tensor([head]))[0]
        return keys, self.value_buffer[0, head, :stored]

    def dense_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values as ``[H, S, D]`` views (only while all heads have the same length)."""
        if self.is_ragged:
            raise ValueError("layer is ragged (heads differ in length); use head_kv(h)")
        assert self.keys is not None and self.values is not None
        return self.keys[0], self.values[0]

    def padded_kv(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Keys ``[H, S_max, D]``, values ``[H, S_max, D]`` and positions ``[H, S_max]`` (views; slots past a
        head's length hold stale data: mask them with :attr:`lengths`)."""
        assert self.key_buffer is not None and self.value_buffer is not None and self.position_buffer is not None
        width = max(self.host_lengths, default=0)
        keys = self._full_width(self.key_buffer[0, :, :width])
        return keys, self.value_buffer[0, :, :width], self.position_buffer[:, :width]

    def padded_positions(self) -> torch.Tensor:
        """``[H, S_max]`` int32 positions by slot (a view; entries past a head's length are stale)."""
        assert self.position_buffer is not None
        return self.position_buffer[:, : max(self.host_lengths, default=0)]

    def token_head_bytes(self) -> int:
        """Key + value bytes of one token of one head (``(D_k + D) * itemsize``, ``D_k = D`` unless the key channels
        were pruned; 0 before the first update)."""
        if self.key_buffer is None or self.value_buffer is None:
            return 0
        return (self.key_buffer.shape[-1] + self.value_buffer.shape[-1]) * self.key_buffer.element_size()

    def prune_key_channels(self, channels: torch.Tensor, prune_appended: bool = False) -> None:
        """Keep only key channels ``channels`` ``[H, D_k]`` of every head (one new ``[1, H, C, D_k]`` key buffer; later
        appends store those channels there, and their other channels aside unless ``prune_appended``):
        :meth:`EvictableLayer.prune_key_channels`."""
        assert self.key_buffer is not None
        channels = self._check_key_channels(channels, self.key_buffer.shape[-1], prune_appended)
        heads, capacity = self.key_buffer.shape[1], self.key_buffer.shape[2]
        index = channels[None, :, None, :].expand(1, heads, capacity, channels.shape[1])
        self.key_buffer = self.key_buffer.gather(-1, index)
        self.key_channels = channels
        self.stats.reallocations += 1
        self.stats.rows_copied += self.stored_tokens()
        self._refresh_views()

    def stored_bytes(self) -> int:
        """Key + value bytes of the kept tokens: ``sum_h S_h * D * 2 * itemsize`` (what the method costs; the same
        number on every backend; appended tokens of a pruned layer count their ``D - D_k`` channels kept aside)."""
        return self.stored_tokens() * self.token_head_bytes() + self._appended_bytes()

    def allocated_bytes(self) -> int:
        """Bytes the key and value buffers hold, spare capacity included (positions metadata excluded)."""
        if not self.is_initialized:
            return 0
        assert self.key_buffer is not None and self.value_buffer is not None
        return (
            sum(t.numel() * t.element_size() for t in (self.key_buffer, self.value_buffer)) + self._appended_allocated()
        )

    def keep(self, indices: Sequence[torch.Tensor] | torch.Tensor, ordered: bool = False) -> None:
        """Keep only the given stored slots of each head and free the rest (new exact-size buffers).

        Parameters
        ----------
        indices:
            Per head, a 1-D integer tensor of slot indices into that head's current storage (``0 <= i < S_h``),
            unique; sorted here so tokens stay in slot order, unless ``ordered`` (then stored in the order given: a
            decode policy's ``keeps_selection_order``).  A ``[H, k]`` tensor when every head keeps the same number.
        """
        sorted_idx = sorted_keep_indices(indices, self.host_lengths, self.device, ordered)
        new_lengths = [int(idx.numel()) for idx in sorted_idx]
        index = torch.nn.utils.rnn.pad_sequence(sorted_idx, batch_first=True) if sorted_idx else None
        if index is None or index.shape[1] == 0:
            index = torch.zeros((self.num_heads, 0), dtype=torch.long, device=self.device)
        self._reallocate(max(new_lengths, default=0), index, new_lengths)
        self._appended_keep(sorted_idx)
        self.host_lengths = new_lengths
        self.lengths = torch.tensor(new_lengths, dtype=torch.long, device=self.device)
        self._refresh_views()

    def rewrite_keys(self, keys: torch.Tensor, positions: torch.Tensor) -> None:
        """Overwrite every stored key and position in place (key re-rotation: Finch): ``keys`` ``[H, S, D]`` and
        ``positions`` ``[H, S]`` for a dense layer of ``S`` tokens per head (values are unchanged)."""
        assert self.key_buffer is not None and self.position_buffer is not None
        self._refuse_pruned("rewrite_keys")
        if self.is_ragged or tuple(keys.shape[:2]) != (self.num_heads, self.host_lengths[0]):
            raise ValueError(f"rewrite_keys needs [H, S, D] keys of a dense layer, got {tuple(keys.shape)}")
        stored = self.host_lengths[0]
        self.key_buffer[0, :, :stored] = keys.to(self.key_buffer.dtype)
        self.position_buffer[:, :stored] = positions.to(torch.int32)

    def evict_slots(self, slots: torch.Tensor, heads: Sequence[int] | None = None) -> torch.Tensor:
        """Evict one token from each of ``heads`` in place: its last stored token moves into slot ``slots[i]``.

        One vectorised copy of ``len(heads)`` rows of keys, values and positions, no host synchronisation; what
        stays is not copied (the decode-time eviction of StreamingLLM, H2O, TOVA, CAKE...).

        Parameters
        ----------
        slots:
            ``[n]`` int64 slot to evict of each evicting head (on the cache's device).
        heads:
            The ``n`` evicting heads, ascending (default: every head, ``n = H``).

        Returns
        -------
        ``[n]`` the slot each evicting head's last token came from (callers move per-slot state the same way).
        """
        assert self.key_buffer is not None and self.value_buffer is not None and self.position_buffer is not None
        assert self.lengths is not None
        host_heads, rows = self._evicting_heads(heads)
        last = self.lengths[rows] - 1
        self.key_buffer[0, rows, slots] = self.key_buffer[0, rows, last]
        self.value_buffer[0, rows, slots] = self.value_buffer[0, rows, last]
        self.position_buffer[rows, slots] = self.position_buffer[rows, last]
        self._appended_evict(rows, slots, last)
        self._count_evicted(host_heads, rows, every_head=heads is None)
        self._refresh_views()
        return last


BACKENDS = ("auto", "torch", "paged")
#: Environment variable that overrides the default backend (``auto``) of every KVBenchCache built without one.
BACKEND_ENV = "KVBENCH_CACHE_BACKEND"


def backend_setting(backend: str | None) -> str:
    """The backend asked for, checked: ``backend``, or with ``None`` :data:`BACKEND_ENV` (default ``auto``)."""
    if backend is None:
        backend = os.environ.get(BACKEND_ENV, "auto") or "auto"
    return check_choice("cache backend", backend, BACKENDS)


def resolve_backend(backend: str | None, device: torch.device) -> str:
    """``torch`` or ``paged`` for a cache on ``device``: ``auto`` is paged on CUDA, torch elsewhere (``None``:
    :func:`backend_setting`)."""
    backend = backend_setting(backend)
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
        (:class:`kvbench.cache.paged.PagedLayer`: fixed-size pages + block table, O(heads) appends, varlen/Triton
        attention on CUDA) or ``auto`` (paged on CUDA, torch otherwise, decided at each layer's first update).
        ``None``: the ``KVBENCH_CACHE_BACKEND`` environment variable, else ``auto``.
    page_size:
        Tokens per page of the paged backend (``None``: 16; use a multiple of 256 for FlashAttention-2's paged path).
    sliding_windows:
        Per layer, its sliding window or ``None`` (:func:`kvbench.cache.sliding.layer_windows`); sliding layers are held
        in :class:`kvbench.cache.sliding.SlidingWindowLayer` (never evicted).  ``None``: every layer is full attention.
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
        self.backend = backend_setting(backend)
        self.expand_factor = expand_factor
        self.page_size = page_size
        # ``auto`` starts with torch layers and swaps a layer for a paged one at its first update on CUDA (update).
        super().__init__(layers=[self._evictable_layer() for _ in range(num_layers)])
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

    def _evictable_layer(self) -> CacheLayerMixin:
        """A new layer of this cache's backend (``auto``: torch until the first update says the device)."""
        return self._paged_layer() if self.backend == "paged" else HeadwiseLayer(self.expand_factor)

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
    def headwise_layers(self) -> list[EvictableLayer]:
        """The layers, typed: each a :class:`~kvbench.cache.base.EvictableLayer` (torch, paged or sliding)."""
        return self.layers  # type: ignore[return-value]

    def reserve(self, extra_tokens: int) -> None:
        """Pre-allocate room for ``extra_tokens`` more tokens per head in every layer (paged: free pages; torch: a
        larger buffer, one reallocation; sliding: nothing), so decoding never grows the storage."""
        for layer in self.headwise_layers:
            layer.reserve(extra_tokens)

    def head_lengths(self) -> list[list[int]]:
        """Stored tokens per layer and head: ``[L][H]``."""
        return [layer.head_lengths() for layer in self.headwise_layers]

    def layer_lengths(self) -> list[int]:
        """Stored tokens per layer, summed over heads and divided by the number of stored heads (mean per head)."""
        return [
            round(layer.stored_tokens() / layer.num_heads) if layer.num_heads else 0 for layer in self.headwise_layers
        ]

    def stored_bytes(self) -> int:
        """Key + value bytes of the kept tokens over all layers (what the method costs): the same number on every
        backend for the same kept tokens (a paged pool's free slots, a buffer's spare capacity excluded)."""
        return sum(layer.stored_bytes() for layer in self.headwise_layers)

    def allocated_bytes(self) -> int:
        """Key + value bytes the backend holds for this cache over all layers: spare capacity and free pages
        included (positions and block tables excluded)."""
        return sum(layer.allocated_bytes() for layer in self.headwise_layers)

    def full_cache_bytes(self) -> int:
        """Bytes a full cache (one sequence per KV head, nothing evicted) would hold for the tokens seen so far:
        what :meth:`stored_bytes` is compared with (query-head storage can exceed it, ``expand_factor`` times at
        most)."""
        return sum(
            layer.stored_bytes()  # a sliding-window layer holds its window whatever the method
            if isinstance(layer, SlidingWindowLayer)
            else layer.seen_tokens * (layer.num_heads // self.expand_factor) * layer.full_token_head_bytes()
            for layer in self.headwise_layers
        )
