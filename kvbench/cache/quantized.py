"""Quantized KV storage (``kv_quant``): cache layers whose older tokens are held as quantized codes, on both backends.

:class:`QuantizedStorage` is mixed into the torch and paged layers (:class:`QuantizedHeadwiseLayer`,
:class:`QuantizedPagedLayer`); :class:`~kvbench.cache.kv_cache.KVBenchCache` builds them when it is given a
:class:`~kvbench.config.KVQuantConfig` whose scheme is not ``none``.  What each token holds follows the reference:

* ``quanto`` / ``hqq`` -- transformers' ``QuantizedCache`` (``QuantizedLayer.update``): the first update quantizes
  everything it stores; a later update of ``q`` tokens onto a residual of ``r`` full-precision tokens re-quantizes
  *everything* (the dequantized old tokens, the residual and the new ones) when ``r + q >= residual_length``, else the
  new tokens join the residual (``kv_quant.flush_rule=5.2``: the rule of transformers 5.2, which kvpress 0.5 pins:
  ``r + 1 >= residual_length``, checked only once a token joined the residual since the last flush).  Eviction
  (``keep``) then re-quantizes the kept states, as kvpress does after a press compresses a quantized cache (its
  forward hook dequantizes, compresses and quantizes the result again; merged values, ``rewrite_values``, likewise).
* ``kivi`` -- KIVI (jy-yuan/KIVI ``models/llama_kivi.py``): keys are quantized per channel in blocks of
  ``residual_length`` tokens (positions below ``floor(seen / R) * R``), values per token once they leave the window of
  the ``residual_length`` most recent tokens (positions below ``seen - R``); eviction keeps codes as they are.

Both references attend over full-precision states when a chunk is fed and quantize afterwards (the prefill attends
over the prompt's own states; a decoding step over the residual it just joined), so a layer here appends the new
states as they come and quantizes what the scheme says once the attention function has used them
(:meth:`QuantizedStorage.attention_done`, called by :mod:`kvbench.attention.function`).  Everything read after that --
the eviction scorers (kvpress: scores on the dequantized states its pipeline sees), later attention, the records --
sees the dequantized states.

Storage is simulated, not packed: the backend's buffers hold the *dequantized* states at the model dtype (the numerics
of the references, without their fused kernels), and :meth:`QuantizedStorage.stored_bytes` counts what a packed store
holds -- per head ``ceil(bits * quantized elements / 8)`` code bytes + 2 x groups x itemsize for scales and zero points
+ ``(D_k + D_v) * itemsize`` per full-precision residual token (docs/kv_quant.md) -- while ``allocated_bytes`` stays
what the buffers really hold.  Which tokens are quantized is read from their positions (residual windows are windows
of positions), so slot moves by decode-time eviction keep the count right.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import CacheLayerMixin

from kvbench.cache.kv_cache import HeadwiseLayer, KVBenchCache
from kvbench.cache.paged import DEFAULT_PAGE_SIZE, PagedLayer
from kvbench.cache.quant_schemes import hqq_roundtrip, kivi_keys, kivi_values, quantized_bytes, quanto_roundtrip
from kvbench.config import KVQuantConfig


class QuantizedStorage:
    """The quantization state of one cache layer (mixed in before its backend class; module docstring).

    Positions below :attr:`key_threshold` hold quantized keys, below :attr:`value_threshold` quantized values (the
    transformers schemes move both together).  :attr:`pending` is the quantization the last ``update`` calls for,
    applied by :meth:`attention_done` once attention has read the new states.
    """

    kv_quant: KVQuantConfig
    key_threshold: int = 0
    value_threshold: int = 0
    #: ``None`` (nothing to do), ``"all"`` (transformers: re-quantize everything stored) or ``"kivi"`` (advance
    #: KIVI's thresholds to the layer's ``seen_tokens``).
    pending: str | None = None
    #: Updates since the residual was last flushed (transformers 5.2's rule checks only once one appended).
    updates_since_flush: int = 0
    #: While set (the chunks of a compressed prefill before its last: :func:`hold_quantization`), quantization waits:
    #: the chunks count as one update, quantized after the last chunk's attention, as a one-shot prefill is.
    quantization_held: bool = False

    def _setup_quant(self, kv_quant: KVQuantConfig) -> None:
        self.kv_quant = kv_quant
        self.key_threshold = self.value_threshold = 0
        self.pending = None
        self.updates_since_flush = 0
        self.quantization_held = False

    # ------------------------------------------------------------------ what transformers / attention calls
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        """Append as the backend does (full precision); record what the scheme quantizes after attention."""
        first = self.seen_tokens == 0  # type: ignore[attr-defined]
        residual = self.seen_tokens - self.key_threshold  # type: ignore[attr-defined]
        result = super().update(key_states, value_states, *args, **kwargs)  # type: ignore[misc]
        self.note_update(residual, key_states.shape[-2], first)
        return result

    def note_update(self, residual: int, new_tokens: int, first: bool = False) -> None:
        """Record what the scheme quantizes after ``new_tokens`` were appended onto ``residual`` full-precision
        tokens (``first``: the layer's first update)."""
        if self.pending == "all":  # held chunks of one prefill: the first one's decision stands
            return
        if self.kv_quant.scheme == "kivi":
            self.pending = "kivi"
        elif first or self._flushes(residual, new_tokens):
            self.pending = "all"
        else:
            self.updates_since_flush += 1

    def _flushes(self, residual: int, new_tokens: int) -> bool:
        """transformers' flush condition for ``new_tokens`` onto ``residual`` full-precision tokens
        (:data:`~kvbench.config.KV_QUANT_FLUSH_RULES`)."""
        if str(self.kv_quant.flush_rule) == "5.2":  # keys.dim() == 4 and keys.shape[-2] + 1 >= residual_length
            return self.updates_since_flush > 0 and residual + 1 >= self.kv_quant.residual_length
        return residual + new_tokens >= self.kv_quant.residual_length

    def attention_done(self) -> None:
        """Quantize what the last update called for (attention has used the full-precision states); nothing while
        :attr:`quantization_held`."""
        if self.quantization_held:
            return
        pending, self.pending = self.pending, None
        if pending == "all":
            self._requantize_all()
        elif pending == "kivi":
            self._advance_kivi()

    # ------------------------------------------------------------------ eviction
    def keep(self, indices: Sequence[torch.Tensor] | torch.Tensor, ordered: bool = False) -> None:
        """The backend's ``keep``; the transformers schemes then re-quantize the kept states (kvpress)."""
        self.attention_done()
        super().keep(indices, ordered)  # type: ignore[misc]
        if self.kv_quant.scheme != "kivi":
            self._requantize_all()

    def evict_slots(self, slots: torch.Tensor, heads: Sequence[int] | None = None) -> torch.Tensor:
        """The backend's one-token eviction; moved tokens keep their (dequantized) states."""
        self.attention_done()
        return super().evict_slots(slots, heads)  # type: ignore[misc]

    def rewrite_values(self, values: list[torch.Tensor]) -> None:
        """Merged values (kvpress's merging presses, after ``keep``): written as the backend does, then quantized as
        the reference stores them -- transformers: the layer's values quantized again from the written ones (kvpress
        quantizes the compressed values once); KIVI: the written values of quantized positions, per token."""
        self.attention_done()
        super().rewrite_values(values)  # type: ignore[misc]
        if self.kv_quant.scheme != "kivi":
            self._requantize_all(keys=False)
            return
        threshold, self.value_threshold = self.value_threshold, 0
        self._quantize_values_below(threshold)

    def rewrite_keys(self, keys: torch.Tensor, positions: torch.Tensor) -> None:
        raise ValueError("kv_quant does not compose with key re-rotation (rewrite_keys); use kv_quant=none")

    def prune_key_channels(self, channels: torch.Tensor, prune_appended: bool = False) -> None:
        raise ValueError("kv_quant does not compose with key-channel pruning (ThinK); use kv_quant=none")

    # ------------------------------------------------------------------ quantization
    def _requantize_all(self, keys: bool = True) -> None:
        """transformers: quantize every stored token (the layer's ``[1, H, S, D]`` tensor, or per head when heads
        differ in length) and empty the residual (``keys=False``: the values only, the keys are quantized already)."""
        spec = self.kv_quant
        roundtrip = quanto_roundtrip if spec.scheme == "quanto" else hqq_roundtrip
        key_bits, value_bits = spec.key_bits, spec.value_bits
        axis_key, axis_value, group = spec.transformers_axes[0], spec.transformers_axes[1], spec.group_size
        lengths = self.head_lengths()  # type: ignore[attr-defined]
        if sum(lengths):
            if not self.is_ragged:  # type: ignore[attr-defined]
                stored_keys, values = self._stored_dense()
                quantized = roundtrip(stored_keys[None], key_bits, axis_key, group)[0] if keys else None
                values = roundtrip(values[None], value_bits, axis_value, group)[0]
                heads = torch.arange(len(lengths), device=values.device).repeat_interleave(lengths[0])
                slots = torch.arange(lengths[0], device=values.device).repeat(len(lengths))
                rows = None if quantized is None else quantized.reshape(-1, quantized.shape[-1])
                self._write_rows(heads, slots, rows, values.reshape(-1, values.shape[-1]))
            else:
                for head, length in enumerate(lengths):
                    if length == 0:
                        continue
                    head_keys, values = self.head_kv(head)  # type: ignore[attr-defined]
                    quantized = roundtrip(head_keys[None, None], key_bits, axis_key, group)[0, 0] if keys else None
                    values = roundtrip(values[None, None], value_bits, axis_value, group)[0, 0]
                    index = torch.arange(length, device=values.device)
                    self._write_rows(torch.full_like(index, head), index, quantized, values)
        self.key_threshold = self.value_threshold = self.seen_tokens  # type: ignore[attr-defined]
        self.updates_since_flush = 0

    def _advance_kivi(self) -> None:
        """KIVI: keys of positions ``[key_threshold, floor(seen / R) * R)`` per channel (groups of ``G`` positions),
        values of positions ``[value_threshold, seen - R)`` per token."""
        spec, seen = self.kv_quant, self.seen_tokens  # type: ignore[attr-defined]
        new_key = seen // spec.residual_length * spec.residual_length
        if new_key > self.key_threshold:
            heads, slots, keys, _, positions = self._stored_rows(self.key_threshold, new_key)
            groups = heads * (new_key // spec.group_size + 1) + positions // spec.group_size  # per head and group
            self._write_rows(heads, slots, kivi_keys(keys, groups, spec.key_bits), None)
            self.key_threshold = new_key
        new_value = max(0, seen - spec.residual_length)
        if new_value > self.value_threshold:
            self._quantize_values_below(new_value)

    def _quantize_values_below(self, new_value: int) -> None:
        """KIVI: quantize the stored values of positions ``[value_threshold, new_value)``, per token."""
        heads, slots, _, values, _ = self._stored_rows(self.value_threshold, new_value)
        self._write_rows(heads, slots, None, kivi_values(values, self.kv_quant.group_size, self.kv_quant.value_bits))
        self.value_threshold = new_value

    def _stored_rows(
        self, low: int, high: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The stored tokens of positions ``[low, high)``: ``(heads, slots)`` ``[n]`` and their keys, values ``[n, D]``
        and positions ``[n]`` int64 (only those rows are read: a decoding step's quantization costs its own tokens)."""
        positions = self.padded_positions().long()  # type: ignore[attr-defined]
        lengths = torch.tensor(self.head_lengths(), device=positions.device)  # type: ignore[attr-defined]
        stored = torch.arange(positions.shape[1], device=positions.device)[None, :] < lengths[:, None]
        heads, slots = (stored & (positions >= low) & (positions < high)).nonzero(as_tuple=True)
        keys, values = self._read_rows(heads, slots)
        return heads, slots, keys, values, positions[heads, slots]

    def _stored_dense(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``[H, S, D]`` keys and values of a dense layer, in slot order."""
        return self.dense_kv()  # type: ignore[attr-defined]

    def _read_rows(self, heads: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Stored keys and values ``[n, D]`` of (``heads[i]``, ``slots[i]``) (backend)."""
        raise NotImplementedError

    def _write_rows(
        self, heads: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor | None, values: torch.Tensor | None
    ) -> None:
        """Overwrite stored rows: ``keys`` / ``values`` ``[n, D]`` of (``heads[i]``, ``slots[i]``) (backend)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ bytes
    def stored_bytes(self) -> int:
        """Packed bytes of the kept tokens (docs/kv_quant.md): per head, codes ``ceil(bits x quantized elements /
        8)`` + scales and zero points ``2 x groups x itemsize`` + full-precision residual ``D x itemsize`` per token,
        for keys and values apart.  Groups: transformers schemes ``ceil(quantized elements / G)``; KIVI keys ``D``
        per distinct ``position // G`` among the quantized keys, values ``D / G`` per quantized token."""
        if not self.is_initialized:  # type: ignore[attr-defined]
            return 0
        spec = self.kv_quant
        itemsize = torch.empty((), dtype=self.dtype).element_size()  # type: ignore[attr-defined]
        key_dim = self.token_head_bytes() // itemsize - self._value_dim()  # type: ignore[attr-defined]
        value_dim = self._value_dim()
        total = 0
        for positions in self.positions:  # type: ignore[attr-defined]
            quantized_keys = positions < self.key_threshold
            quantized_values = positions < self.value_threshold
            count_keys, count_values = int(quantized_keys.sum()), int(quantized_values.sum())
            if spec.scheme == "kivi":
                key_groups = key_dim * int(torch.unique(positions[quantized_keys] // spec.group_size).numel())
                value_groups = count_values * (value_dim // spec.group_size)
            else:
                key_groups = -(-count_keys * key_dim // spec.group_size)
                value_groups = -(-count_values * value_dim // spec.group_size)
            total += quantized_bytes(count_keys * key_dim, spec.key_bits, key_groups, itemsize)
            total += quantized_bytes(count_values * value_dim, spec.value_bits, value_groups, itemsize)
            total += (positions.numel() - count_keys) * key_dim * itemsize
            total += (positions.numel() - count_values) * value_dim * itemsize
        return total

    def _value_dim(self) -> int:
        raise NotImplementedError


class QuantizedHeadwiseLayer(QuantizedStorage, HeadwiseLayer):
    """The torch backend's layer with quantized storage (:class:`QuantizedStorage`)."""

    def __init__(self, kv_quant: KVQuantConfig, expand_factor: int = 1) -> None:
        HeadwiseLayer.__init__(self, expand_factor)
        self._setup_quant(kv_quant)

    def reset(self) -> None:
        kv_quant = self.kv_quant
        HeadwiseLayer.__init__(self, self.expand_factor)
        self.key_channels, self.dropped_key_channels, self.appended_keys = None, 0, None
        self._setup_quant(kv_quant)

    def _read_rows(self, heads: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.key_buffer is not None and self.value_buffer is not None
        return self.key_buffer[0, heads, slots], self.value_buffer[0, heads, slots]

    def _write_rows(
        self, heads: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor | None, values: torch.Tensor | None
    ) -> None:
        assert self.key_buffer is not None and self.value_buffer is not None
        if keys is not None:
            self.key_buffer[0, heads, slots] = keys.to(self.key_buffer.dtype)
        if values is not None:
            self.value_buffer[0, heads, slots] = values.to(self.value_buffer.dtype)

    def _value_dim(self) -> int:
        assert self.value_buffer is not None
        return int(self.value_buffer.shape[-1])


class QuantizedPagedLayer(QuantizedStorage, PagedLayer):
    """The paged backend's layer with quantized storage (:class:`QuantizedStorage`): rows are rewritten in their
    pages, so the varlen / Triton attention paths read the dequantized states."""

    def __init__(
        self, kv_quant: KVQuantConfig, expand_factor: int = 1, page_size: int = 16, impl: str = "auto"
    ) -> None:
        PagedLayer.__init__(self, expand_factor, page_size, impl)
        self._setup_quant(kv_quant)

    def reset(self) -> None:
        kv_quant = self.kv_quant
        PagedLayer.__init__(self, self.expand_factor, self.page_size, self.impl)
        self.key_channels, self.dropped_key_channels, self.appended_keys = None, 0, None
        self._setup_quant(kv_quant)

    def _read_rows(self, heads: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.k_pool is not None and self.v_pool is not None
        flat = self.slot_matrix()[heads, slots]
        return self._flat(self.k_pool).index_select(0, flat), self._flat(self.v_pool).index_select(0, flat)

    def _write_rows(
        self, heads: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor | None, values: torch.Tensor | None
    ) -> None:
        assert self.k_pool is not None and self.v_pool is not None
        flat = self.slot_matrix()[heads, slots]
        if keys is not None:
            self._flat(self.k_pool).index_copy_(0, flat, keys.to(self.k_pool.dtype))
        if values is not None:
            self._flat(self.v_pool).index_copy_(0, flat, values.to(self.v_pool.dtype))

    def _value_dim(self) -> int:
        return self.head_dim


def hold_quantization(cache: KVBenchCache, held: bool) -> None:
    """Hold (or release) the quantization of ``cache``'s quantized layers: a compressed prefill fed in chunks holds it
    for every chunk but the last, so its chunks attend over full-precision states and the prompt is quantized once,
    after the last chunk's attention, as the references' one-shot prefill does (a no-op for other caches)."""
    for layer in cache.layers:
        if isinstance(layer, QuantizedStorage):
            layer.quantization_held = held


class QuantizedKVBenchCache(KVBenchCache):
    """A :class:`~kvbench.cache.kv_cache.KVBenchCache` whose evictable layers store quantized KV (``kv_quant``): same
    arguments, plus the checked :class:`~kvbench.config.KVQuantConfig` (its scheme is not ``none``).  Sliding-window
    layers stay unquantized."""

    def __init__(self, num_layers: int, kv_quant: KVQuantConfig, **kwargs: Any) -> None:
        self.kv_quant = kv_quant
        super().__init__(num_layers, **kwargs)

    def _paged_layer(self) -> CacheLayerMixin:
        return QuantizedPagedLayer(self.kv_quant, self.expand_factor, page_size=self.page_size or DEFAULT_PAGE_SIZE)

    def _evictable_layer(self) -> CacheLayerMixin:
        return (
            self._paged_layer()
            if self.backend == "paged"
            else QuantizedHeadwiseLayer(self.kv_quant, self.expand_factor)
        )


def kv_quant_model_problem(spec: KVQuantConfig, head_dim: int, kv_heads: int) -> str | None:
    """Why ``spec`` cannot quantize a model's cache of ``kv_heads`` heads of ``head_dim`` channels, or ``None``: KIVI's
    value groups must divide the head dim; transformers' groups must divide a token's elements over the heads (else
    no tensor of the layer's shape divides into groups)."""
    if spec.scheme == "kivi" and head_dim % spec.group_size:
        return (
            f"kv_quant.group_size={spec.group_size} does not divide the model's head dim {head_dim}: KIVI quantizes "
            "values per token in groups of group_size channels (use a divisor of the head dim, e.g. 32)"
        )
    if spec.scheme in ("quanto", "hqq") and (head_dim * kv_heads) % spec.group_size:
        return (
            f"kv_quant.group_size={spec.group_size} does not divide a token's {head_dim} x {kv_heads} key elements: "
            "transformers' QuantizedCache groups the layer's elements (use a divisor of the head dim)"
        )
    return None
