"""Quantized KV storage in a pooled decode batch (``kv_quant`` with ``run.decode_batch``): the samples of a
:class:`~kvbench.cache.pool.PooledLayer` keep quantizing as their own layers would.

A sample joins with its quantization state (its :class:`~kvbench.cache.quantized.QuantizedStorage` layer's thresholds
and residual count); each pooled step appends one full-precision token per row, the pooled attention reads the rows
as they are, and :meth:`QuantizedPooledLayer.attention_done` (called right after it, before the batch's decode policy)
quantizes what each sample's scheme says, on that sample's rows only -- through :class:`SampleRows`, which shows one
sample's rows to :class:`~kvbench.cache.quantized.QuantizedStorage`'s own quantization code, so batch 1 and the pool
run the same arithmetic on the same rows.  A leaving sample takes its state back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvbench.cache.base import EvictableLayer
from kvbench.cache.pool import PooledLayer
from kvbench.cache.quantized import QuantizedStorage

#: The quantization state a sample carries between its own layer and the pool.
STATE_FIELDS = ("kv_quant", "key_threshold", "value_threshold", "pending", "updates_since_flush")


class SampleRows(QuantizedStorage):
    """Sample ``sample``'s rows of a quantized pool, as a layer for :class:`QuantizedStorage`'s quantization (its
    state in :attr:`state`, read and written back around each use)."""

    def __init__(self, pool: QuantizedPooledLayer, sample: int) -> None:
        self.pool, self.sample = pool, sample
        self.first, self.heads = sample * pool.heads_per_sample, pool.heads_per_sample
        for name in STATE_FIELDS:
            setattr(self, name, pool.states[sample][name])
        self.seen_tokens = pool.sample_seen[sample]
        self.dtype, self.is_initialized = pool.dtype, True

    def save(self) -> None:
        """Write the state back into the pool's record of the sample."""
        self.pool.states[self.sample] = {name: getattr(self, name) for name in STATE_FIELDS}

    def head_lengths(self) -> list[int]:
        return self.pool.host_lengths[self.first : self.first + self.heads]

    @property
    def is_ragged(self) -> bool:
        return len(set(self.head_lengths())) > 1

    def padded_kv(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The sample's rows: keys ``[H, S_max, D]``, values and positions ``[H, S_max]`` (gathered copies)."""
        pool, width = self.pool, max(self.head_lengths(), default=0)
        slots = pool.slot_matrix()[self.first : self.first + self.heads, :width].reshape(-1)
        assert pool.k_pool is not None and pool.v_pool is not None and pool.pos_pool is not None
        keys = pool._flat(pool.k_pool).index_select(0, slots).view(self.heads, width, pool.head_dim)
        values = pool._flat(pool.v_pool).index_select(0, slots).view(self.heads, width, pool.value_dim)
        return keys, values, pool.pos_pool.index_select(0, slots).view(self.heads, width)

    def dense_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values, _ = self.padded_kv()
        return keys, values

    def padded_positions(self) -> torch.Tensor:
        """``[H, S_max]`` positions of the sample's rows (stale past a row's length)."""
        pool, width = self.pool, max(self.head_lengths(), default=0)
        assert pool.pos_pool is not None
        slots = pool.slot_matrix()[self.first : self.first + self.heads, :width]
        return pool.pos_pool.index_select(0, slots.reshape(-1)).view(slots.shape)

    def _read_rows(self, heads: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pool = self.pool
        assert pool.k_pool is not None and pool.v_pool is not None
        flat = pool.slot_matrix()[self.first + heads, slots]
        return pool._flat(pool.k_pool).index_select(0, flat), pool._flat(pool.v_pool).index_select(0, flat)

    def head_kv(self, head: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pool.head_kv(self.first + head)

    def _write_rows(
        self, heads: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor | None, values: torch.Tensor | None
    ) -> None:
        pool = self.pool
        assert pool.k_pool is not None and pool.v_pool is not None
        flat = pool.slot_matrix()[self.first + heads, slots]
        if keys is not None:
            pool._flat(pool.k_pool).index_copy_(0, flat, keys.to(pool.dtype))
            copy = pool._float_rows()
            if copy is not None:  # the float32 key copy follows, as a step's append writes it
                copy.index_copy_(0, flat, keys.to(pool.dtype).float())
        if values is not None:
            pool._flat(pool.v_pool).index_copy_(0, flat, values.to(pool.dtype))


class QuantizedPooledLayer(PooledLayer):
    """A :class:`~kvbench.cache.pool.PooledLayer` whose samples store quantized KV (module docstring).  Same
    arguments; the samples' states in :attr:`states` (one dict of :data:`STATE_FIELDS` per sample, join order)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.states: list[dict[str, Any]] = []

    def admit(self, layer: EvictableLayer) -> None:
        if not isinstance(layer, QuantizedStorage):
            raise TypeError(f"a quantized pool admits quantized layers, not {type(layer).__name__}")
        layer.attention_done()
        self.states.append({name: getattr(layer, name) for name in STATE_FIELDS})
        super().admit(layer)

    def release(self, sample: int, layer: EvictableLayer) -> None:
        self.attention_done()
        super().release(sample, layer)
        for name, value in self.states.pop(sample).items():
            setattr(layer, name, value)

    def append_rows(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """One token per row (:meth:`PooledLayer.append_rows`); each sample's scheme notes what to quantize."""
        self.attention_done()
        for sample, seen in enumerate(self.sample_seen):
            rows = SampleRows(self, sample)
            rows.note_update(seen - rows.key_threshold, 1)
            rows.save()
        super().append_rows(key_states, value_states)

    def attention_done(self) -> None:
        """Quantize what each sample's last append called for (the pooled attention has read the new rows)."""
        for sample in range(len(self.states)):
            if self.states[sample]["pending"] is not None:
                rows = SampleRows(self, sample)
                rows.attention_done()
                rows.save()

    def keep(self, indices: Sequence[torch.Tensor] | torch.Tensor, ordered: bool = False) -> None:
        """:meth:`PooledLayer.keep`; the transformers schemes then re-quantize each sample's kept rows (kvpress)."""
        self.attention_done()
        super().keep(indices, ordered)
        for sample, state in enumerate(self.states):
            if state["kv_quant"].scheme != "kivi":
                rows = SampleRows(self, sample)
                rows._requantize_all()
                rows.save()

    def evict_slots(self, slots: torch.Tensor, heads: Sequence[int] | None = None) -> torch.Tensor:
        self.attention_done()
        return super().evict_slots(slots, heads)
