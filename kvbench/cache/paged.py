"""Paged per-head KV storage (the GPU cache backend), with a pure-torch path so its logic runs and is tested on CPU.

Layout (one :class:`PagedLayer` per decoder layer, batch size 1, ``H`` stored heads, head dim ``D``):

* ``k_pool`` / ``v_pool``: ``[num_pages, page_size, 1, D]`` -- a pool of fixed-size pages.  Each stored head is
  one *sequence* of the varlen attention kernels (heads folded into the batch dimension, one KV head per sequence,
  the ``G`` query heads of its GQA group as that sequence's query heads).  This is exactly the paged layout of
  ``torch.nn.attention.varlen.varlen_attn(..., block_table=..., seqused_k=...)`` and of flash-attn's
  ``flash_attn_with_kvcache``.
* ``pos_pool``: ``[num_pages * page_size]`` int32, the true position of the token in each slot.
* ``block_table``: ``[H, max_pages]`` int32, logical page ``j`` of head ``h`` -> physical page; host mirror
  ``pages[h]``.  ``lengths``: ``[H]`` int32 tokens stored per head (device), host mirror ``host_lengths``.

Why pages rather than AdaKV's flattened ragged buffer: appending a token to a flattened buffer shifts every later
head (AdaKV copies the whole cache at every decode step, prior-art 9.2); with pages an append writes ``H`` rows
(:func:`kvbench.kernels.paged_append`), and a new page is taken from a free list every ``page_size`` tokens.
Only when the free list is empty does the pool grow (by at least 1/8 of its size, so the copy is amortised O(1)
per token), and :meth:`PagedLayer.reserve` pre-allocates decode headroom so the decode loop never grows the pool.

Compaction after eviction (:meth:`PagedLayer.keep`): kept tokens stay in slot order (or the order given).  When the
freed memory is large the layer repacks into a new pool sized exactly to the kept pages (``sum_h ceil(k_h /
page_size)`` pages, so held bytes <= kept bytes + ``H * (page_size - 1)`` token slots); smaller evictions compact each
head in place inside its own pages and return emptied pages to the free list.  A decoding step's one-token eviction
(:meth:`PagedLayer.evict_slots`) moves each head's last token into its evicted slot: ``H`` rows, no rebuild.

Attention over this layout (:func:`kvbench.attention.paged.paged_attention`) runs the path
:func:`kvbench.kernels.paths.plan_attention` chose when the layer was allocated (:attr:`PagedLayer.attention_plan`):
on CUDA ``varlen_attn`` with the block table when ``page_size`` is a multiple of 256 (the FlashAttention-2 paged-KV
constraint) and this torch's ``varlen_attn`` takes a block table, else the split-K Triton kernel
:func:`kvbench.kernels.paged_decode_attention` for one-token decoding; the rest gathers each head.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from kvbench import kernels
from kvbench.cache.base import LayerKV, LogicalLengthLayer, RaggedKV, StorageStats, sorted_keep_indices
from kvbench.kernels.paths import AttentionPlan, plan_attention

#: Default page size on CPU and for the Triton decode kernel (vLLM's default block size).
DEFAULT_PAGE_SIZE = 16
#: Repack into an exact-size pool after eviction when the pool holds more than this factor of the used pages.
REPACK_SLACK = 1.02
#: The pool grows by at least this fraction of its size when it runs out of pages (amortised O(1) appends).
GROWTH_FRACTION = 0.125


class PagedLayer(LogicalLengthLayer):
    """One layer's paged per-head KV storage, batch size 1; same kvbench API as
    :class:`~kvbench.cache.kv_cache.HeadwiseLayer` (``positions``, ``head_kv``, ``dense_kv``, ``keep``,
    ``stored_bytes``...).

    Parameters
    ----------
    expand_factor:
        Repeat factor applied to incoming KV heads (query-head granularity), as in ``HeadwiseLayer``.
    page_size:
        Tokens per page.
    impl:
        Kernel implementation for append / compaction: ``auto`` (Triton on CUDA), ``triton`` or ``torch``.
    """

    def __init__(self, expand_factor: int = 1, page_size: int = DEFAULT_PAGE_SIZE, impl: str = "auto") -> None:
        super().__init__()
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.expand_factor = expand_factor
        self.page_size = page_size
        self.impl = impl
        self.seen_tokens = 0
        self.num_stored_heads = 0
        self.head_dim = 0
        self.k_pool: torch.Tensor | None = None
        self.v_pool: torch.Tensor | None = None
        self.pos_pool: torch.Tensor | None = None
        self.block_table: torch.Tensor | None = None
        self.lengths: torch.Tensor | None = None
        self.pages: list[list[int]] = []
        self.host_lengths: list[int] = []
        self.free_pages: list[int] = []
        #: Pool rebuilds (growth, repack) and rows they, compaction and one-token evictions copied.
        self.stats = StorageStats()
        self._positions_cache: list[torch.Tensor] | None = None
        self._slot_cache: torch.Tensor | None = None
        #: Attention paths after the first chunk, chosen when the pools are allocated (:func:`plan_attention`).
        self.attention_plan: AttentionPlan | None = None

    # ------------------------------------------------------------------ transformers' CacheLayerMixin contract
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Allocate empty pools from the first states ``[1, H_kv, q, D]``."""
        if key_states.shape[0] != 1:
            raise ValueError(
                f"kvbench caches hold one sequence (batch size 1), got batch size {key_states.shape[0]}; "
                "run samples one at a time"
            )
        if value_states.shape[-1] != key_states.shape[-1]:
            raise ValueError("the paged backend needs equal key and value head dims")
        self.dtype, self.device = key_states.dtype, key_states.device
        self.num_stored_heads = key_states.shape[1] * self.expand_factor
        self.head_dim = key_states.shape[-1]
        self._allocate_pool(0)
        self.attention_plan = plan_attention(self.device, self.dtype, self.page_size, self.head_dim)
        self.block_table = torch.zeros((self.num_stored_heads, 1), dtype=torch.int32, device=self.device)
        self.lengths = torch.zeros(self.num_stored_heads, dtype=torch.int32, device=self.device)
        self.pages = [[] for _ in range(self.num_stored_heads)]
        self.host_lengths = [0] * self.num_stored_heads
        self.free_pages = []
        self.keys = self.values = None
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[LayerKV, LayerKV]:
        """Append ``q`` tokens ``[1, H_kv, q, D]`` to every head (O(H * q) rows written); returns the new keys and
        values (after GQA expansion) as :class:`LayerKV` for the attention function
        (:func:`kvbench.attention.paged.paged_attention` reads the pools through the layer)."""
        key_states, value_states = self._incoming(key_states, value_states)
        new_tokens = key_states.shape[2]
        first_chunk = all(length == 0 for length in self.host_lengths)
        self._ensure_pages([length + new_tokens for length in self.host_lengths])
        assert self.k_pool is not None and self.v_pool is not None and self.pos_pool is not None
        assert self.block_table is not None and self.lengths is not None
        if new_tokens == 1 and not kernels.use_triton(self.kernel_impl, key_states):
            self._append_one_on_host(key_states, value_states)
        else:
            kernels.paged_append(
                self._flat(self.k_pool),
                self._flat(self.v_pool),
                self.pos_pool,
                key_states[0],
                value_states[0],
                self.block_table,
                self.lengths,
                self.seen_tokens,
                self.page_size,
                impl=self.kernel_impl,
            )
        self.lengths += new_tokens
        self.host_lengths = [length + new_tokens for length in self.host_lengths]
        self.seen_tokens += new_tokens
        self._positions_cache = self._slot_cache = None
        return LayerKV(self, key_states, first_chunk), LayerKV(self, value_states, first_chunk)

    def attention_kv(self, keys: LayerKV, values: LayerKV) -> tuple[torch.Tensor | RaggedKV, torch.Tensor | RaggedKV]:
        """The stored keys and values read back: the first chunk's new states as they are, else dense
        ``[1, H, S, D]`` or per-head (:class:`RaggedKV`) gathered copies."""
        if keys.first_chunk:
            return keys.states, values.states
        if self.is_ragged:
            return self.ragged_kv()
        dense_keys, dense_values = self.dense_kv()
        return dense_keys[None], dense_values[None]

    def _append_one_on_host(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """The torch decode append: slots from the host page lists (no block-table lookups on the device), then
        three ``index_copy_`` of ``H`` rows -- same result as :func:`kvbench.kernels.paged_append`."""
        assert self.k_pool is not None and self.v_pool is not None and self.pos_pool is not None
        size = self.page_size
        slots = torch.tensor(
            [pages[n // size] * size + n % size for pages, n in zip(self.pages, self.host_lengths, strict=True)],
            device=self.device,
        )
        self._flat(self.k_pool).index_copy_(0, slots, key_states[0, :, 0].to(self.k_pool.dtype))
        self._flat(self.v_pool).index_copy_(0, slots, value_states[0, :, 0].to(self.v_pool.dtype))
        self.pos_pool.index_fill_(0, slots, self.seen_tokens)

    def reset(self) -> None:
        self.__init__(self.expand_factor, self.page_size, self.impl)  # type: ignore[misc]
        self.key_channels, self.dropped_key_channels, self.appended_keys = None, 0, None

    @property
    def kernel_impl(self) -> str:
        """The append / copy kernels' implementation: :attr:`impl`, or ``torch`` once the key channels were pruned
        (the Triton kernels take one head dim for keys and values)."""
        return self.impl if self.key_channels is None else "torch"

    # ------------------------------------------------------------------ page management
    def _flat(self, pool: torch.Tensor) -> torch.Tensor:
        """``[num_pages * page_size, D]`` view of a pool."""
        return pool.view(-1, pool.shape[-1])

    @property
    def num_pages(self) -> int:
        """Pages in the pool (used + free)."""
        return 0 if self.k_pool is None else int(self.k_pool.shape[0])

    def _allocate_pool(self, num_pages: int) -> None:
        shape = (num_pages, self.page_size, 1, self.head_dim)
        key_width = self.head_dim if self.key_channels is None else self.key_channels.shape[1]
        self.k_pool = torch.empty((*shape[:3], key_width), dtype=self.dtype, device=self.device)
        self.v_pool = torch.empty(shape, dtype=self.dtype, device=self.device)
        self.pos_pool = torch.empty(num_pages * self.page_size, dtype=torch.int32, device=self.device)

    def _grow_pool(self, needed: int, exact: bool = False) -> None:
        """Add ``needed`` free pages (at least ``GROWTH_FRACTION`` of the pool unless ``exact``): one pool copy."""
        assert self.k_pool is not None and self.v_pool is not None and self.pos_pool is not None
        old = self.num_pages
        extra = needed if exact else max(needed, math.ceil(old * GROWTH_FRACTION))
        grown_k = self.k_pool.new_empty((old + extra, *self.k_pool.shape[1:]))  # keeps a pruned key width
        grown_v = self.v_pool.new_empty((old + extra, *self.v_pool.shape[1:]))
        grown_pos = self.pos_pool.new_empty((old + extra) * self.page_size)
        grown_k[:old] = self.k_pool
        grown_v[:old] = self.v_pool
        grown_pos[: old * self.page_size] = self.pos_pool
        self.k_pool, self.v_pool, self.pos_pool = grown_k, grown_v, grown_pos
        self.stats.reallocations += 1
        self.stats.rows_copied += self.stored_tokens()
        self.free_pages.extend(range(old + extra - 1, old - 1, -1))  # pop() hands out low pages first

    def _ensure_pages(self, target_lengths: list[int]) -> None:
        """Give every head enough pages for ``target_lengths`` tokens; update the block table (small write)."""
        wanted = [
            math.ceil(length / self.page_size) - len(pages)
            for length, pages in zip(target_lengths, self.pages, strict=True)
        ]
        needed = sum(max(0, w) for w in wanted)
        if needed == 0:
            return
        if needed > len(self.free_pages):
            self._grow_pool(needed - len(self.free_pages))
        # Hand out the last ``needed`` free pages in pop() order, head after head: list slices on the host (a loop
        # over heads, not pages) and one vectorised block-table write.
        counts = [max(0, w) for w in wanted]
        taken = self.free_pages[len(self.free_pages) - needed :][::-1]
        del self.free_pages[len(self.free_pages) - needed :]
        starts, offset = [], 0
        for head, count in enumerate(counts):
            starts.append(len(self.pages[head]))
            self.pages[head].extend(taken[offset : offset + count])
            offset += count
        assert self.block_table is not None
        width = max(len(pages) for pages in self.pages)
        if width > self.block_table.shape[1]:
            table = torch.zeros(
                (self.num_stored_heads, max(width, 2 * self.block_table.shape[1])),
                dtype=torch.int32,
                device=self.device,
            )
            table[:, : self.block_table.shape[1]] = self.block_table
            self.block_table = table
        per_head = torch.tensor(counts)
        rows = torch.repeat_interleave(torch.arange(self.num_stored_heads), per_head)
        first = torch.cumsum(per_head, 0) - per_head  # index in ``taken`` of each head's first new page
        cols = torch.arange(needed) - torch.repeat_interleave(first - torch.tensor(starts), per_head)
        index = (rows.to(self.device), cols.to(self.device))
        self.block_table.index_put_(index, torch.tensor(taken, dtype=torch.int32).to(self.device))

    def reserve(self, extra_tokens: int) -> None:
        """Pre-allocate pages so every head can take ``extra_tokens`` more tokens without growing the pool."""
        if not self.is_initialized or extra_tokens <= 0:
            return
        needed = sum(
            max(0, math.ceil((length + extra_tokens) / self.page_size) - len(pages))
            for length, pages in zip(self.host_lengths, self.pages, strict=True)
        )
        if needed > len(self.free_pages):
            self._grow_pool(needed - len(self.free_pages), exact=True)

    def slot_matrix(self) -> torch.Tensor:
        """``[H, S_max]`` int64 flat pool slot of every stored token (entries past a head's length are
        meaningless); one vectorised lookup of the block table, cached until the next append or eviction."""
        if self._slot_cache is None:
            assert self.block_table is not None
            index = torch.arange(max(self.host_lengths, default=0), device=self.device)
            pages = self.block_table[:, index // self.page_size].long()
            self._slot_cache = pages * self.page_size + index % self.page_size
        return self._slot_cache

    def _slots(self, head: int, index: torch.Tensor | None = None) -> torch.Tensor:
        """Flat pool slots ``[n]`` (int64) of logical tokens ``index`` (default: all) of ``head``."""
        if index is None:
            return self.slot_matrix()[head, : self.host_lengths[head]]
        pages = torch.tensor(self.pages[head], dtype=torch.long, device=self.device)
        if pages.numel() == 0:
            return torch.empty(0, dtype=torch.long, device=self.device)
        return pages[index // self.page_size] * self.page_size + index % self.page_size

    # ------------------------------------------------------------------ kvbench API (same as HeadwiseLayer)
    @property
    def num_heads(self) -> int:
        """Number of stored heads."""
        return self.num_stored_heads

    @property
    def is_ragged(self) -> bool:
        """Whether heads currently differ in length."""
        return len(set(self.host_lengths)) > 1

    def head_lengths(self) -> list[int]:
        """Stored tokens per head."""
        return list(self.host_lengths)

    def stored_tokens(self) -> int:
        """Stored tokens summed over heads."""
        return sum(self.host_lengths)

    @property
    def positions(self) -> list[torch.Tensor]:
        """True positions of the stored tokens, per head ``[S_h]`` int32 (gathered, cached until the next change)."""
        if self._positions_cache is None:
            assert self.pos_pool is not None or not self.is_initialized
            self._positions_cache = [
                self.pos_pool.index_select(0, self._slots(head))  # type: ignore[union-attr]
                for head in range(self.num_stored_heads)
            ]
        return self._positions_cache

    def head_kv(self, head: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of one head: two ``[S_h, D]`` tensors (gathered copies)."""
        assert self.k_pool is not None and self.v_pool is not None
        slots = self._slots(head)
        keys = self._full_width(self._flat(self.k_pool).index_select(0, slots)[None], torch.tensor([head]))[0]
        return keys, self._flat(self.v_pool).index_select(0, slots)

    def dense_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values as ``[H, S, D]`` (only while all heads have the same length)."""
        if self.is_ragged:
            raise ValueError("layer is ragged (heads differ in length); use head_kv(h)")
        assert self.k_pool is not None and self.v_pool is not None
        slots = self.slot_matrix().reshape(-1)
        keys = self._flat(self.k_pool).index_select(0, slots).view(self.num_stored_heads, -1, self.k_pool.shape[-1])
        values = self._flat(self.v_pool).index_select(0, slots).view(self.num_stored_heads, -1, self.head_dim)
        return self._full_width(keys), values

    def padded_kv(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Keys ``[H, S_max, D]``, values ``[H, S_max, D]`` and positions ``[H, S_max]`` (gathered in one
        vectorised lookup; slots past a head's length hold stale data: mask them with :attr:`lengths`)."""
        assert self.k_pool is not None and self.v_pool is not None and self.pos_pool is not None
        slots = self.slot_matrix()
        shape = (self.num_stored_heads, slots.shape[1], self.head_dim)
        flat = slots.reshape(-1)
        keys = self._full_width(self._flat(self.k_pool).index_select(0, flat).view(*shape[:2], self.k_pool.shape[-1]))
        values = self._flat(self.v_pool).index_select(0, flat).view(shape)
        return keys, values, self.pos_pool.index_select(0, flat).view(slots.shape)

    def padded_positions(self) -> torch.Tensor:
        """``[H, S_max]`` int32 positions by slot (entries past a head's length are stale)."""
        assert self.pos_pool is not None
        slots = self.slot_matrix()
        return self.pos_pool.index_select(0, slots.reshape(-1)).view(slots.shape)

    def ragged_kv(self) -> tuple[RaggedKV, RaggedKV]:
        """Per-head ``[1, 1, S_h, D]`` copies (what the torch reference attention runs on)."""
        pairs = [self.head_kv(head) for head in range(self.num_stored_heads)]
        return RaggedKV([k[None, None] for k, _ in pairs]), RaggedKV([v[None, None] for _, v in pairs])

    def token_head_bytes(self) -> int:
        """Key + value bytes of one token of one head (``(D_k + D) * itemsize``, ``D_k = D`` unless the key channels
        were pruned; 0 before the first update)."""
        if self.k_pool is None:
            return 0
        return (self.k_pool.shape[-1] + self.head_dim) * self.k_pool.element_size()

    def prune_key_channels(self, channels: torch.Tensor, prune_appended: bool = False) -> None:
        """Keep only key channels ``channels`` ``[H, D_k]`` of every head: a new ``[P, page_size, 1, D_k]`` key pool
        (each page reduced to its head's channels; later appends too, their other channels aside unless
        ``prune_appended``): :meth:`kvbench.cache.base.EvictableLayer.prune_key_channels`.  Attention then reads the
        pools back through the torch gather path, recorded in the plan (varlen / Triton take one head dim)."""
        assert self.k_pool is not None
        channels = self._check_key_channels(channels, self.head_dim, prune_appended)
        page_head = torch.zeros(self.num_pages, dtype=torch.long)  # free pages: any head's channels
        for head, pages in enumerate(self.pages):
            page_head[pages] = head
        index = channels[page_head.to(self.device)]  # [P, D_k]
        shape = (self.num_pages, self.page_size, 1, channels.shape[1])
        self.k_pool = self.k_pool.gather(-1, index[:, None, None, :].expand(shape))
        self.key_channels = channels
        plan = self.attention_plan
        if plan is not None and (plan.decode, plan.chunk) != ("torch_gather", "torch_gather"):
            reason = "pruned key channels" + ("" if prune_appended else " (appended keys kept whole)")
            self.attention_plan = AttentionPlan("torch_gather", "torch_gather", reason, ("decode", "chunk"))
        self.stats.reallocations += 1
        self.stats.rows_copied += self.stored_tokens()

    def stored_bytes(self) -> int:
        """Key + value bytes of the kept tokens: ``sum_h S_h * D * 2 * itemsize`` (the same number as the torch
        backend's for the same kept tokens, appended tokens of a pruned layer included)."""
        return self.stored_tokens() * self.token_head_bytes() + self._appended_bytes()

    def allocated_bytes(self) -> int:
        """Bytes held by the K and V pools: used and free pages (positions and block table excluded)."""
        if not self.is_initialized:
            return 0
        assert self.k_pool is not None and self.v_pool is not None
        pools = (self.k_pool.numel() + self.v_pool.numel()) * self.v_pool.element_size()  # one dtype
        return pools + self._appended_allocated()

    def keep(self, indices: Sequence[torch.Tensor] | torch.Tensor, ordered: bool = False) -> None:
        """Keep only the given stored slots of each head (per head 1-D indices, or ``[H, k]``) and compact: in slot
        order, or in the order given when ``ordered`` (:meth:`HeadwiseLayer.keep`).

        Repacks into an exact-size pool when the pool would otherwise exceed ``REPACK_SLACK`` times the used
        pages; otherwise compacts each head inside its own pages and frees its emptied trailing pages.
        """
        sorted_idx = sorted_keep_indices(indices, self.host_lengths, self.device, ordered)
        new_lengths = [int(idx.numel()) for idx in sorted_idx]
        new_pages = sum(math.ceil(length / self.page_size) for length in new_lengths)
        src = torch.cat([self._slots(head, idx) for head, idx in enumerate(sorted_idx)])
        if self.num_pages > REPACK_SLACK * new_pages:
            self._repack(src, new_lengths, new_pages)
        else:
            self._compact_in_place(src, new_lengths)
        self._appended_keep(sorted_idx)
        self.host_lengths = new_lengths
        self.lengths = torch.tensor(new_lengths, dtype=torch.int32, device=self.device)
        self.stats.rows_copied += sum(new_lengths)
        self._positions_cache = self._slot_cache = None

    def rewrite_keys(self, keys: torch.Tensor, positions: torch.Tensor) -> None:
        """Overwrite every stored key and position in place (key re-rotation: Finch): ``keys`` ``[H, S, D]`` and
        ``positions`` ``[H, S]`` for a dense layer of ``S`` tokens per head (values are unchanged)."""
        assert self.k_pool is not None and self.pos_pool is not None
        self._refuse_pruned("rewrite_keys")
        if self.is_ragged or tuple(keys.shape[:2]) != (self.num_heads, self.host_lengths[0]):
            raise ValueError(f"rewrite_keys needs [H, S, D] keys of a dense layer, got {tuple(keys.shape)}")
        slots = self.slot_matrix().reshape(-1)
        self._flat(self.k_pool).index_copy_(0, slots, keys.reshape(-1, self.head_dim).to(self.k_pool.dtype))
        self.pos_pool.index_copy_(0, slots, positions.reshape(-1).to(self.pos_pool.dtype))
        self._positions_cache = None

    def evict_slots(self, slots: torch.Tensor, heads: Sequence[int] | None = None) -> torch.Tensor:
        """Evict one token from each of ``heads`` in place: its last stored token moves into slot ``slots[i]``
        (same contract as :meth:`kvbench.cache.kv_cache.HeadwiseLayer.evict_slots`).

        One vectorised copy of ``n`` rows inside the pool, no rebuild and no host synchronisation; a head whose
        last page empties returns it to the free list.

        Parameters
        ----------
        slots:
            ``[n]`` int64 logical slot to evict of each evicting head.
        heads:
            The ``n`` evicting heads, ascending (default: every head).

        Returns
        -------
        ``[n]`` the logical slot each evicting head's last token came from.
        """
        assert self.k_pool is not None and self.v_pool is not None and self.pos_pool is not None
        assert self.block_table is not None and self.lengths is not None
        host_heads, rows = self._evicting_heads(heads)
        last = self.lengths[rows].long() - 1
        size = self.page_size

        def flat(logical: torch.Tensor) -> torch.Tensor:
            return self.block_table[rows, logical // size].long() * size + logical % size  # type: ignore[index]

        dst, src = flat(slots.long()), flat(last)
        for pool in (self._flat(self.k_pool), self._flat(self.v_pool), self.pos_pool):
            pool[dst] = pool[src]
        self._appended_evict(rows, slots, last)
        self._count_evicted(host_heads, rows, every_head=heads is None)
        for head in host_heads:  # a head whose last page emptied returns it
            if len(self.pages[head]) > math.ceil(self.host_lengths[head] / size):
                self.free_pages.append(self.pages[head].pop())
        self._positions_cache = self._slot_cache = None
        return last

    def _repack(self, src: torch.Tensor, new_lengths: list[int], new_pages: int) -> None:
        """Copy the kept rows ``src`` into a new pool of exactly ``new_pages`` pages; the old pool is freed."""
        assert self.k_pool is not None and self.v_pool is not None and self.pos_pool is not None
        old_k, old_v, old_pos = self.k_pool, self.v_pool, self.pos_pool
        self._allocate_pool(new_pages)
        self.pages, dst_parts, first = [], [], 0
        for length in new_lengths:
            count = math.ceil(length / self.page_size)
            self.pages.append(list(range(first, first + count)))
            dst_parts.append(torch.arange(length, device=self.device) + first * self.page_size)
            first += count
        dst = torch.cat(dst_parts)
        kernels.copy_rows(
            self._flat(old_k), self._flat(old_v), src, self._flat(self.k_pool), self._flat(self.v_pool), dst,
            impl=self.kernel_impl,
        )  # fmt: skip
        self.pos_pool.index_copy_(0, dst, old_pos.index_select(0, src))
        self.stats.reallocations += 1
        self.free_pages = []
        width = max(1, max(len(pages) for pages in self.pages))
        table = torch.zeros((self.num_stored_heads, width), dtype=torch.int32)
        for head, pages in enumerate(self.pages):
            table[head, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        self.block_table = table.to(self.device)

    def _compact_in_place(self, src: torch.Tensor, new_lengths: list[int]) -> None:
        """Move each head's kept rows to the front of its own pages (gather first, so overlaps are safe)."""
        assert self.k_pool is not None and self.v_pool is not None and self.pos_pool is not None
        dst = torch.cat([self._slots(head, torch.arange(n, device=self.device)) for head, n in enumerate(new_lengths)])
        flat_k, flat_v = self._flat(self.k_pool), self._flat(self.v_pool)
        kept_k, kept_v = flat_k.index_select(0, src), flat_v.index_select(0, src)
        identity = torch.arange(src.numel(), device=self.device)
        kernels.copy_rows(kept_k, kept_v, identity, flat_k, flat_v, dst, impl=self.kernel_impl)
        self.pos_pool.index_copy_(0, dst, self.pos_pool.index_select(0, src))
        for head, length in enumerate(new_lengths):
            keep_pages = math.ceil(length / self.page_size)
            self.free_pages.extend(self.pages[head][keep_pages:])
            del self.pages[head][keep_pages:]
