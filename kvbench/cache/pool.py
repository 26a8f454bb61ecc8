"""One page pool per decode batch and model layer (issue #46): every (sample, head) pair of the batch is one *row*
with its own block-table row and length, so one attention call and one decode-policy step cover all samples.

A :class:`PooledLayer` is a :class:`~kvbench.cache.paged.PagedLayer` whose stored "heads" are the batch's rows: sample
``b`` (in the order it joined) owns rows ``b * H .. (b + 1) * H - 1``, ``H`` its stored heads.  Each row keeps its own
length (ragged per-head budgets kept exactly), its own pages and the logical slot order its sample's own layer had
(decode policies break ties by slot, so slots must not move).

* :meth:`PooledLayer.admit` -- a sample joins: its layer's kept tokens are copied into pages of the shared pool (the
  sample's own buffers are freed; what the restore needs is remembered);
* :meth:`PooledLayer.append_rows` -- a decoding step's ``[B, H_kv, 1, D]`` keys and values, one token per row at each
  sample's own position (one vectorised write of ``B * H`` rows);
* :meth:`PooledLayer.release` -- a sample leaves: its rows are written back into its own layer (as batch 1 would hold
  them: same slots, lengths, positions, seen tokens, and on the torch backend the buffer capacity batch 1's growth
  gives) and its pages return to the pool's free list for the next sample (continuous batching).

Key and value head dims may differ (a method that stores fewer key channels): the pools are sized apart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from kvbench.cache.base import EvictableLayer
from kvbench.cache.kv_cache import HeadwiseLayer
from kvbench.cache.paged import DEFAULT_PAGE_SIZE, GROWTH_FRACTION, PagedLayer
from kvbench.kernels.paths import AttentionPlan, plan_attention


class PooledLayer(PagedLayer):
    """One model layer's page pool shared by the samples of a decode batch (module docstring).

    Parameters
    ----------
    heads_per_sample:
        Stored heads of every sample's layer (``H``; the rows of sample ``b`` are ``b * H .. (b + 1) * H - 1``).
    key_dim, value_dim:
        Head dims of the stored keys and values.
    dtype, device:
        Of the stored states (the samples' layers').
    expand_factor:
        Repeat factor of incoming KV heads (query-head granularity), as the samples' layers.
    page_size:
        Tokens per page.
    """

    def __init__(
        self,
        heads_per_sample: int,
        key_dim: int,
        value_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        expand_factor: int = 1,
        page_size: int = DEFAULT_PAGE_SIZE,
    ) -> None:
        super().__init__(expand_factor, page_size, impl="torch")
        self.heads_per_sample = heads_per_sample
        self.head_dim, self.value_dim = key_dim, value_dim
        self.dtype, self.device = dtype, device
        self._allocate_pool(0)
        self.attention_plan = (
            plan_attention(device, dtype, page_size, key_dim)
            if key_dim == value_dim
            else AttentionPlan("torch_gather", "torch_gather")
        )
        self.block_table = torch.zeros((0, 1), dtype=torch.int32, device=device)
        self.lengths = torch.zeros(0, dtype=torch.int32, device=device)
        #: Per row, the tokens its sample has seen (the next token's position), ``[R]`` int64 on the device, and per
        #: sample on the host.
        self.row_seen = torch.zeros(0, dtype=torch.long, device=device)
        self.sample_seen: list[int] = []
        #: Per sample (host, int64), the slots per head its own torch layer would hold now: its capacity when it
        #: joined, grown and shrunk by the rules of batch 1 (:func:`grown_capacities`, :meth:`keep`).
        self.capacities = torch.zeros(0, dtype=torch.long)
        #: The float32 keys of :meth:`float_key_pages` (CPU, a pool of another dtype), kept step after step, and
        #: whether they are in step with the pool.
        self._float_keys: torch.Tensor | None = None
        self._float_synced = False
        self.is_initialized = True

    # ------------------------------------------------------------------ storage with separate key / value widths
    def _allocate_pool(self, num_pages: int) -> None:
        self._keys_changed()
        self.k_pool = torch.zeros((num_pages, self.page_size, 1, self.head_dim), dtype=self.dtype, device=self.device)
        self.v_pool = torch.zeros((num_pages, self.page_size, 1, self.value_dim), dtype=self.dtype, device=self.device)
        self.pos_pool = torch.empty(num_pages * self.page_size, dtype=torch.int32, device=self.device)

    def _flat(self, pool: torch.Tensor) -> torch.Tensor:
        """``[num_pages * page_size, D]`` view of a pool (its own width: keys and values may differ)."""
        return pool.view(-1, pool.shape[-1])

    def page_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys ``[R, W * page_size, D_k]`` and values ``[R, W * page_size, D_v]`` of every row, its ``W`` pages in
        block-table order (``W`` pages hold the longest row): one ``index_select`` of whole pages per pool, contiguous.
        Slots past a row's length hold stale, finite data (pages are zeroed when allocated): mask with :attr:`lengths`.
        """
        assert self.k_pool is not None and self.v_pool is not None and self.block_table is not None
        pages = math.ceil(max(self.host_lengths, default=0) / self.page_size)
        table = self.block_table[:, :pages].reshape(-1).long()  # [R * W] physical pages, row after row
        rows, span = self.num_stored_heads, pages * self.page_size

        def gather(pool: torch.Tensor) -> torch.Tensor:
            return pool.view(pool.shape[0], -1).index_select(0, table).view(rows, span, pool.shape[-1])

        return gather(self.k_pool), gather(self.v_pool)

    def page_map(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Where the rows' pages lie, for computing straight over the pool as it lies in memory.

        Returns
        -------
        ``pages`` ``[R * W]``: the physical page of each row's ``W`` logical pages in order, row after row (``W`` pages
        hold the longest row; a row's unused entries point at ``num_pages``, a spare page past the pool);
        ``owner`` ``[P]``: the row each physical page belongs to (a free page: row 0); and ``W``.
        """
        assert self.block_table is not None and self.lengths is not None
        size, rows, num_pages = self.page_size, self.num_stored_heads, self.num_pages
        width = math.ceil(max(self.host_lengths, default=0) / size)  # pages of the longest row
        table = self.block_table[:, :width].long()  # [R, W]
        used = torch.arange(width, device=self.device) < (self.lengths[:, None] + size - 1) // size  # [R, W]
        pages = torch.where(used, table, torch.full_like(table, num_pages)).reshape(-1)  # [R * W]
        owner = torch.zeros(num_pages + 1, dtype=torch.long, device=self.device)
        owner.index_put_((pages,), torch.arange(rows, device=self.device).repeat_interleave(width))
        return pages, owner[:num_pages], width

    def row_products(self, queries: torch.Tensor) -> torch.Tensor:
        """``[R, G, S_max]`` float32 products of each row's queries ``queries`` ``[R, G, D_k]`` (float32) with its
        stored keys in float32 (what a decode policy scores with; slot-aligned, stale past a row's length: mask with
        :attr:`lengths`).  Computed page by page over the pool (:meth:`page_map`), as the pooled attention reads it:
        no gathered copy of the rows' keys, and the float32 keys in a buffer kept between steps
        (:meth:`float_key_pages`)."""
        pages, owner, width = self.page_map()
        rows, groups, size = queries.shape[0], queries.shape[1], self.page_size
        keys = self.float_key_pages()  # [P, page, D_k]
        # Keys times queries (not queries times keys): on CPU 3x faster for one query per row (a GEMV per page).
        products = torch.bmm(keys, queries.index_select(0, owner).transpose(1, 2))  # [P, page, G]
        by_row = torch.cat([products, products.new_zeros((1, size, groups))]).index_select(0, pages)
        by_row = by_row.view(rows, width, size, groups).permute(0, 3, 1, 2).reshape(rows, groups, width * size)
        return by_row[:, :, : max(self.host_lengths, default=0)]

    def float_key_pages(self) -> torch.Tensor:
        """The key pool as ``[P, page, D_k]`` float32: the pool itself when it is float32; elsewhere than CPU a
        converted copy; on CPU a float32 copy of the pool kept between steps (a fresh CPU buffer that size costs
        more in page faults than the conversion itself), converted whole after any change but a step's append and
        in-place eviction, which write their rows into it too (:meth:`append_rows`, :meth:`evict_slots`)."""
        assert self.k_pool is not None
        keys = self.k_pool.view(self.num_pages, self.page_size, self.head_dim)
        if keys.dtype == torch.float32:
            return keys
        if keys.device.type != "cpu":
            return keys.float()
        if self._float_keys is None or self._float_keys.shape != keys.shape:
            self._float_keys = torch.empty(keys.shape, dtype=torch.float32, device=keys.device)
            self._float_synced = False
        if not self._float_synced:
            self._float_keys.copy_(keys)
            self._float_synced = True
        return self._float_keys

    def _float_rows(self) -> torch.Tensor | None:
        """``[P * page, D_k]`` view of the float32 copy when it is in step with the pool (else ``None``)."""
        return self._float_keys.view(-1, self.head_dim) if self._float_synced and self._float_keys is not None else None

    def evict_slots(self, slots: torch.Tensor, heads: Sequence[int] | None = None) -> torch.Tensor:
        """:meth:`PagedLayer.evict_slots`, the float32 key copy moved the same way (the evicted rows' block-table
        entries still point where the moved tokens were)."""
        last = super().evict_slots(slots, heads)
        copy = self._float_rows()
        if copy is not None:
            assert self.block_table is not None
            _, rows = self._evicting_heads(heads)
            size = self.page_size

            def flat(logical: torch.Tensor) -> torch.Tensor:
                return self.block_table[rows, logical // size].long() * size + logical % size  # type: ignore[index]

            copy[flat(slots.long())] = copy[flat(last)]
        return last

    def _keys_changed(self) -> None:
        """Keys were written otherwise than by a step: the float32 copy is converted whole when next read."""
        self._float_synced = False

    def update(self, *args: Any, **kwargs: Any) -> Any:
        self._keys_changed()
        return super().update(*args, **kwargs)

    def rewrite_keys(self, keys: torch.Tensor, positions: torch.Tensor) -> None:
        self._keys_changed()
        super().rewrite_keys(keys, positions)

    def prune_key_channels(self, channels: torch.Tensor, prune_appended: bool = False) -> None:
        self._keys_changed()
        super().prune_key_channels(channels, prune_appended)

    def padded_kv(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Keys ``[R, S_max, D_k]``, values ``[R, S_max, D_v]`` and positions ``[R, S_max]`` of every row (slots past a
        row's length hold stale data: mask them with :attr:`lengths`), gathered page by page (:meth:`page_rows`)."""
        assert self.pos_pool is not None and self.block_table is not None
        width = max(self.host_lengths, default=0)
        keys, values = self.page_rows()
        table = self.block_table[:, : math.ceil(width / self.page_size)].reshape(-1).long()
        positions = self.pos_pool.view(-1, self.page_size).index_select(0, table).view(keys.shape[0], -1)
        return keys[:, :width], values[:, :width], positions[:, :width]

    def _grow_pool(self, needed: int, exact: bool = False) -> None:
        """:meth:`PagedLayer._grow_pool`, the new pages zeroed (so a masked slot never multiplies a NaN)."""
        old = self.num_pages
        self._keys_changed()
        super()._grow_pool(needed, exact)
        assert self.k_pool is not None and self.v_pool is not None
        self.k_pool[old:].zero_()
        self.v_pool[old:].zero_()

    def dense_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.is_ragged:
            raise ValueError("pooled rows differ in length; use padded_kv()")
        keys, values, _ = self.padded_kv()
        return keys, values

    def token_head_bytes(self) -> int:
        assert self.k_pool is not None
        return (self.head_dim + self.value_dim) * self.k_pool.element_size()

    def keep(self, indices: Sequence[torch.Tensor] | torch.Tensor, ordered: bool = False) -> None:
        """:meth:`PagedLayer.keep` over every row; a sample whose heads lost tokens is one whose own torch layer
        batch 1 would have reallocated to its new longest head (its simulated capacity follows)."""
        before = torch.tensor(self.host_lengths)
        self._keys_changed()
        super().keep(indices, ordered)
        after = torch.tensor(self.host_lengths)
        heads = self.heads_per_sample
        shrunk = (after != before).view(-1, heads).any(dim=1)
        self.capacities = torch.where(shrunk, after.view(-1, heads).amax(dim=1), self.capacities)

    # ------------------------------------------------------------------ the batch
    @property
    def num_samples(self) -> int:
        return len(self.sample_seen)

    @property
    def seen_tokens(self) -> int:  # type: ignore[override]
        """The most tokens any sample has seen (per row: :attr:`row_seen`)."""
        return max(self.sample_seen, default=0)

    @seen_tokens.setter
    def seen_tokens(self, value: int) -> None:  # PagedLayer.__init__ sets it; the pool reads its samples' instead
        pass

    @property
    def any_sample_ragged(self) -> bool:
        """Whether some sample's heads differ in length (the pool's rows differ anyway, sample to sample)."""
        heads = self.heads_per_sample
        lengths = self.host_lengths
        return any(len(set(lengths[first : first + heads])) > 1 for first in range(0, len(lengths), heads))

    def admit(self, layer: EvictableLayer) -> None:
        """A sample joins the batch: its ``layer``'s kept tokens go into pages of this pool, in its slot order, as
        the last rows; the layer's own buffers are freed (:meth:`release` writes the rows back)."""
        lengths = layer.head_lengths()
        if len(lengths) != self.heads_per_sample:
            raise ValueError(f"a sample with {len(lengths)} stored heads joins a pool of {self.heads_per_sample}")
        keys, values, positions = layer.padded_kv()  # [H, S, D]
        heads, first = len(lengths), self.num_stored_heads
        self.pages.extend([] for _ in range(heads))
        self.host_lengths.extend([0] * heads)
        self.num_stored_heads += heads
        assert self.block_table is not None and self.lengths is not None
        self.block_table = torch.cat([self.block_table, self.block_table.new_zeros((heads, self.block_table.shape[1]))])
        self._ensure_pages(self.host_lengths[:first] + lengths)
        width = keys.shape[1]
        index = torch.arange(width, device=self.device)
        rows = torch.arange(first, first + heads, device=self.device)
        dst = self.block_table[rows][:, index // self.page_size].long() * self.page_size + index % self.page_size
        stored = index < torch.tensor(lengths, device=self.device)[:, None]  # [H, S]
        dst = dst[stored]
        assert self.k_pool is not None and self.v_pool is not None and self.pos_pool is not None
        self._keys_changed()
        self._flat(self.k_pool).index_copy_(0, dst, keys[stored].to(self.dtype))
        self._flat(self.v_pool).index_copy_(0, dst, values[stored].to(self.dtype))
        self.pos_pool.index_copy_(0, dst, positions[stored].to(torch.int32))
        self.host_lengths[first:] = lengths
        self.lengths = torch.cat([self.lengths, torch.tensor(lengths, dtype=torch.int32, device=self.device)])
        self.sample_seen.append(layer.seen_tokens)
        self.row_seen = torch.cat([self.row_seen, self.row_seen.new_full((heads,), layer.seen_tokens)])
        self.capacities = torch.cat([self.capacities, torch.tensor([_vacate(layer)])])
        self._positions_cache = self._slot_cache = None

    def append_rows(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """One decoding step: ``[B, H_kv, 1, D]`` new keys and values, one token per row at its sample's next
        position (GQA-expanded as the samples' layers); one write of ``B * H`` rows."""
        samples = key_states.shape[0]
        if samples != self.num_samples or key_states.shape[2] != 1:
            raise ValueError(
                f"pooled append of {tuple(key_states.shape)} states to a pool of {self.num_samples} samples "
                "(one token per sample)"
            )
        if self.expand_factor > 1:
            key_states = key_states.repeat_interleave(self.expand_factor, dim=1)
            value_states = value_states.repeat_interleave(self.expand_factor, dim=1)
        self._ensure_pages([length + 1 for length in self.host_lengths])
        assert self.k_pool is not None and self.v_pool is not None and self.pos_pool is not None
        size = self.page_size
        slots = torch.tensor(
            [pages[n // size] * size + n % size for pages, n in zip(self.pages, self.host_lengths, strict=True)],
            device=self.device,
        )
        new_keys = key_states.reshape(-1, self.head_dim).to(self.dtype)
        self._flat(self.k_pool).index_copy_(0, slots, new_keys)
        copy = self._float_rows()
        if copy is not None:  # the float32 copy follows (float_key_pages)
            copy.index_copy_(0, slots, new_keys.float())
        self._flat(self.v_pool).index_copy_(0, slots, value_states.reshape(-1, self.value_dim).to(self.dtype))
        self.pos_pool.index_copy_(0, slots, self.row_seen.to(torch.int32))
        assert self.lengths is not None
        self.lengths += 1
        self.host_lengths = [length + 1 for length in self.host_lengths]
        self.row_seen += 1
        self.sample_seen = [seen + 1 for seen in self.sample_seen]
        tallest = torch.tensor(self.host_lengths).view(samples, self.heads_per_sample).amax(dim=1)
        self.capacities = grown_capacities(self.capacities, tallest)
        self._positions_cache = self._slot_cache = None

    def release(self, sample: int, layer: EvictableLayer) -> None:
        """Sample ``sample`` (its index among the pool's samples) leaves: its rows are written back into its own
        ``layer`` and its pages return to the free list; later samples move up by one."""
        heads = self.heads_per_sample
        first = sample * heads
        rows = list(range(first, first + heads))
        lengths = self.host_lengths[first : first + heads]
        width = max(lengths, default=0)
        slots = self.slot_matrix()[first : first + heads, :width].reshape(-1)  # this sample's rows only
        assert self.k_pool is not None and self.v_pool is not None and self.pos_pool is not None
        _restore(
            layer,
            self._flat(self.k_pool).index_select(0, slots).view(heads, width, self.head_dim),
            self._flat(self.v_pool).index_select(0, slots).view(heads, width, self.value_dim),
            self.pos_pool.index_select(0, slots).view(heads, width),
            lengths,
            self.sample_seen[sample],
            int(self.capacities[sample]),
        )
        for row in rows:
            self.free_pages.extend(reversed(self.pages[row]))
        keep = [row for row in range(self.num_stored_heads) if row < first or row >= first + heads]
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        assert self.block_table is not None and self.lengths is not None
        self.pages = [self.pages[row] for row in keep]
        self.host_lengths = [self.host_lengths[row] for row in keep]
        self.block_table = self.block_table.index_select(0, index)
        self.lengths = self.lengths.index_select(0, index)
        self.row_seen = self.row_seen.index_select(0, index)
        self.num_stored_heads -= heads
        del self.sample_seen[sample]
        self.capacities = torch.cat([self.capacities[:sample], self.capacities[sample + 1 :]])
        self._positions_cache = self._slot_cache = None


def _vacate(layer: EvictableLayer) -> int:
    """Free a joining sample's own buffers (its pooled rows replace them); returns the capacity (slots per head)
    they had, which batch 1's growth starts from."""
    if isinstance(layer, HeadwiseLayer):
        assert layer.key_buffer is not None and layer.value_buffer is not None and layer.position_buffer is not None
        capacity = int(layer.key_buffer.shape[2])
        layer.key_buffer = layer.key_buffer[:, :, :0].clone()
        layer.value_buffer = layer.value_buffer[:, :, :0].clone()
        layer.position_buffer = layer.position_buffer[:, :0].clone()
        layer.keys = layer.values = layer.head_keys = layer.head_values = None
        return capacity
    if isinstance(layer, PagedLayer):
        layer._allocate_pool(0)
        layer.pages = [[] for _ in range(layer.num_stored_heads)]
        layer.free_pages = []
        layer._positions_cache = layer._slot_cache = None
        return 0
    raise TypeError(f"a pooled decode batch stores torch or paged layers, not {type(layer).__name__}")


def grown_capacities(capacities: torch.Tensor, tallest: torch.Tensor) -> torch.Tensor:
    """Per sample, the capacity its torch layer has after an append left its longest head at ``tallest`` tokens
    (:meth:`HeadwiseLayer._ensure_capacity`'s rule: grow to ``max(tokens, C + ceil(C / 8))`` when full)."""
    assert GROWTH_FRACTION == 0.125  # ceil(C * 1/8) == (C + 7) // 8 exactly
    grown = torch.maximum(tallest, capacities + (capacities + 7) // 8)
    return torch.where(tallest > capacities, grown, capacities)


def _restore(
    layer: EvictableLayer,
    keys: torch.Tensor,
    values: torch.Tensor,
    positions: torch.Tensor,
    lengths: list[int],
    seen: int,
    capacity: int,
) -> None:
    """Write a leaving sample's rows ``[H, S, D]`` back into its own layer, slot for slot."""
    heads, width = keys.shape[0], keys.shape[1]
    if isinstance(layer, HeadwiseLayer):
        slots = max(capacity, width)
        layer.key_buffer = keys.new_empty((1, heads, slots, keys.shape[-1]))
        layer.value_buffer = values.new_empty((1, heads, slots, values.shape[-1]))
        layer.position_buffer = positions.new_empty((heads, slots))
        layer.key_buffer[0, :, :width] = keys
        layer.value_buffer[0, :, :width] = values
        layer.position_buffer[:, :width] = positions
        layer.host_lengths = list(lengths)
        layer.lengths = torch.tensor(lengths, dtype=torch.long, device=keys.device)
        layer.seen_tokens = seen
        layer._refresh_views()
        return
    assert isinstance(layer, PagedLayer)
    # Exact pages per head, in order (as a repack leaves them).
    size = layer.page_size
    counts = [math.ceil(length / size) for length in lengths]
    layer._allocate_pool(sum(counts))
    layer.pages, first = [], 0
    for count in counts:
        layer.pages.append(list(range(first, first + count)))
        first += count
    table = torch.zeros((heads, max(1, max(counts, default=0))), dtype=torch.int32)
    for head, pages in enumerate(layer.pages):
        table[head, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
    layer.block_table = table.to(keys.device)
    layer.host_lengths = list(lengths)
    layer.lengths = torch.tensor(lengths, dtype=torch.int32, device=keys.device)
    layer.free_pages = []
    layer._positions_cache = layer._slot_cache = None
    index = torch.arange(width, device=keys.device)
    stored = index < layer.lengths[:, None]
    dst = layer.slot_matrix()[stored]
    assert layer.k_pool is not None and layer.v_pool is not None and layer.pos_pool is not None
    layer._flat(layer.k_pool).index_copy_(0, dst, keys[stored])
    layer._flat(layer.v_pool).index_copy_(0, dst, values[stored])
    layer.pos_pool.index_copy_(0, dst, positions[stored])
    layer.seen_tokens = seen
    layer._positions_cache = layer._slot_cache = None
