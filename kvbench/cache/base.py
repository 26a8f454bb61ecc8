"""What every kvbench cache layer shares, below both storage backends (:mod:`kvbench.cache.kv_cache`'s torch layers,
:mod:`kvbench.cache.paged`'s pages) and the sliding window (:mod:`kvbench.cache.sliding`): the declared layer
interface :class:`EvictableLayer`, what ``update`` returns (:class:`LayerKV`, with the ragged per-head view
:class:`RaggedKV`), the checked ``keep`` indices, and the logical-length layer base class.

Imports flow one way: ``cache.base`` <- ``cache.{kv_cache,paged,sliding}`` <- ``attention``.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from transformers.cache_utils import CacheLayerMixin

from kvbench.cache.appended_keys import AppendedKeyChannels


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
class LayerKV:
    """What a kvbench cache layer's ``update`` returns for the keys, and (a second instance) for the values: the layer
    itself, which attention dispatches on (:meth:`EvictableLayer.attention_kv`, :attr:`EvictableLayer.attention_plan`),
    and that side's states.

    Attributes
    ----------
    layer:
        The cache layer that was updated.
    states:
        Torch and sliding layers: what the new queries attend over, dense ``[1, H, S, D]`` or :class:`RaggedKV`
        per-head ``[1, 1, S_h, D]`` views.  Paged layers: the ``[1, H, q, D]`` states just appended (after GQA
        expansion), which the first chunk attends over as they are.
    first_chunk:
        True when the layer held nothing before this chunk (plain causal prefill over ``states``).
    """

    layer: EvictableLayer
    states: torch.Tensor | RaggedKV
    first_chunk: bool = False


@runtime_checkable
class EvictableLayer(Protocol):
    """The interface every kvbench cache layer implements (torch :class:`~kvbench.cache.kv_cache.HeadwiseLayer`, paged
    :class:`~kvbench.cache.paged.PagedLayer`, :class:`~kvbench.cache.sliding.SlidingWindowLayer`), for one sequence
    (batch size 1) of ``H`` stored heads: what the eviction session, the decode policies, attention and the records
    use, and nothing else.  Lengths are per stored head; positions are the kept tokens' true positions."""

    #: Tokens seen (prompt + generated), whatever was evicted.
    seen_tokens: int
    #: Whether the layer is a sliding window (never evicted).
    is_sliding: bool
    #: The attention paths of a paged layer (:func:`kvbench.kernels.paths.plan_attention`); ``None``: attention runs
    #: on the tensors :meth:`attention_kv` returns.
    attention_plan: Any

    # -- append, and what attention reads
    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[LayerKV, LayerKV]:
        """Append ``[1, H_kv, q, D]`` new keys and values; returns one :class:`LayerKV` for each, except dense
        states, which are returned as the ``[1, H, S, D]`` tensors themselves (some models reshape or cast the keys
        and values before attention; the attention function finds their layer through the cache)."""
        ...

    def attention_kv(self, keys: LayerKV, values: LayerKV) -> tuple[torch.Tensor | RaggedKV, torch.Tensor | RaggedKV]:
        """The keys and values the chunk just appended attends over, dense ``[1, H, S, D]`` or per head
        (:class:`RaggedKV`), from what :meth:`update` returned."""
        ...

    # -- what is stored
    @property
    def num_heads(self) -> int: ...

    @property
    def is_ragged(self) -> bool: ...

    @property
    def positions(self) -> list[torch.Tensor]: ...

    def head_lengths(self) -> list[int]: ...

    def stored_tokens(self) -> int: ...

    def head_kv(self, head: int) -> tuple[torch.Tensor, torch.Tensor]: ...

    def dense_kv(self) -> tuple[torch.Tensor, torch.Tensor]: ...

    # -- keep / evict
    def keep(self, indices: Sequence[torch.Tensor] | torch.Tensor, ordered: bool = False) -> None:
        """Keep only the given stored slots of each head (per head 1-D indices) and free the rest: in slot order, or
        in the order given when ``ordered`` (a decode policy that stores kvpress's cache order)."""
        ...

    def evict_slots(self, slots: torch.Tensor, heads: Sequence[int] | None = None) -> torch.Tensor:
        """Evict one token of each of ``heads`` in place (its last token moves into slot ``slots[i]``)."""
        ...

    def reserve(self, extra_tokens: int) -> None:
        """Make room for ``extra_tokens`` more tokens per head ahead of time."""
        ...

    def rewrite_keys(self, keys: torch.Tensor, positions: torch.Tensor) -> None:
        """Overwrite every stored key ``[H, S, D]`` and position ``[H, S]`` of a dense layer (key re-rotation)."""
        ...

    def rewrite_values(self, values: Sequence[torch.Tensor]) -> None:
        """Overwrite every stored value: per head ``[S_h, D]`` in slot order (merged values: MergingPress, CaM)."""
        ...

    # -- key channels (ThinK: a layer may store fewer key channels than the model's head dim)
    #: ``[H, D_k]`` int64 the key channels each stored head keeps, ascending (``None``: all ``D``).
    key_channels: torch.Tensor | None

    #: ``[H, D_k]`` the query channels attention uses (:func:`select_query_channels`) when the layer hands over keys
    #: of its kept channels only (``prune_appended=True``); ``None``: the keys handed over are ``D`` wide.
    query_channels: torch.Tensor | None

    def prune_key_channels(self, channels: torch.Tensor, prune_appended: bool = False) -> None:
        """Keep only key channels ``channels`` ``[H, D_k]`` of every stored head's stored tokens.

        ``prune_appended=False`` (default, kvpress's ThinKPress): tokens appended later keep all ``D`` channels (the
        pruned ones in :class:`~kvbench.cache.appended_keys.AppendedKeyChannels`), and the layer hands attention
        full-width keys whose pruned context channels are zero.  ``True``: later tokens store the kept channels
        only, and attention uses the matching query channels (:attr:`query_channels`)."""
        ...

    # -- bytes (docs/results.md)
    def token_head_bytes(self) -> int:
        """Key + value bytes of one stored token of one head (``(D_k + D_v) * itemsize``)."""
        ...

    def full_token_head_bytes(self) -> int:
        """:meth:`token_head_bytes` with every key channel (what a full cache holds per token and head)."""
        ...

    def stored_bytes(self) -> int:
        """Key + value bytes of the kept tokens (the same on every backend)."""
        ...

    def allocated_bytes(self) -> int:
        """Key + value bytes the layer's storage holds (spare capacity, free pages included)."""
        ...


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


def gather_key_channels(states: torch.Tensor, channels: torch.Tensor) -> torch.Tensor:
    """``states`` ``[1, H, q, D]`` reduced to each head's ``channels`` ``[H, D_k]``: ``[1, H, q, D_k]``."""
    heads, width = channels.shape
    index = channels.to(states.device)[None, :, None, :].expand(1, heads, states.shape[2], width)
    return states.gather(-1, index)


def select_query_channels(query: torch.Tensor, channels: torch.Tensor) -> torch.Tensor:
    """The query channels matching a layer's stored key channels: ``query`` ``[1, H_q, q, D]`` with ``channels``
    ``[H, D_k]`` (the ``H_q / H`` query heads of a group share their stored head's) -> ``[1, H_q, q, D_k]``.

    Since a dropped key channel contributes nothing to ``q . k``, the logits equal those of the full query against
    keys whose dropped channels are zero (kvpress's ThinKPress); the softmax scale stays the model's.
    """
    groups = query.shape[1] // channels.shape[0]
    return gather_key_channels(query, channels.repeat_interleave(groups, dim=0))


def sorted_keep_indices(
    indices: Sequence[torch.Tensor] | torch.Tensor, lengths: list[int], device: torch.device, ordered: bool = False
) -> list[torch.Tensor]:
    """Validate and sort the per-head slot indices given to ``keep`` (shared by every storage backend).

    Parameters
    ----------
    indices:
        Per head a 1-D integer tensor of unique slot indices (``0 <= i < S_h``), or an ``[H, k]`` tensor.
    lengths:
        Stored tokens per head ``S_h``.
    ordered:
        Keep each head's indices in the order given (validated, not sorted): the kept tokens are stored in that
        order (:attr:`kvbench.eviction.base.DecodePolicy.keeps_selection_order`).

    Returns
    -------
    Per head, sorted (or, when ``ordered``, as given) ``[k_h]`` int64 indices on ``device``.
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
    for head, given in enumerate(per_head):
        given = given.to(device=device, dtype=torch.long)
        idx = torch.sort(given).values
        if idx.numel() and (idx[0] < 0 or idx[-1] >= lengths[head]):
            raise IndexError(f"head {head}: slot index out of range [0, {lengths[head]})")
        if idx.numel() > 1 and bool((idx[1:] == idx[:-1]).any()):
            raise ValueError(f"head {head}: duplicate slot indices")
        sorted_idx.append(given if ordered else idx)
    return sorted_idx


class LogicalLengthLayer(CacheLayerMixin):
    """What every kvbench storage backend shares: lengths are *logical* (tokens seen, whatever was evicted),
    eviction goes through ``keep()``, and transformers' tail-``crop`` is refused."""

    is_sliding = False
    is_compileable = False
    is_croppable = False
    #: Tokens this layer has seen (prompt + generated); subclasses keep it up to date in ``update``.
    seen_tokens: int = 0
    #: Attention over stored tensors (:meth:`attention_kv`); the paged layer sets its planned kernel paths.
    attention_plan: Any = None
    #: ``[H, D_k]`` the key channels each stored head keeps (``None``: all); set by ``prune_key_channels``.
    key_channels: torch.Tensor | None = None
    #: Key channels dropped per stored head (0 unless ``prune_key_channels`` ran).
    dropped_key_channels: int = 0
    #: The pruned channels of the tokens appended after the pruning (``prune_appended=False``), else ``None``.
    appended_keys: AppendedKeyChannels | None = None

    @property
    def query_channels(self) -> torch.Tensor | None:
        """The query channels attention must select: the kept ones when the keys handed over are ``D_k`` wide
        (``prune_appended=True``), else ``None`` (full-width keys, zero in the context's pruned channels)."""
        return self.key_channels if self.appended_keys is None else None

    def prune_key_channels(self, channels: torch.Tensor, prune_appended: bool = False) -> None:
        """Storage that keeps every key channel (a sliding window, never evicted) refuses to prune them."""
        raise NotImplementedError(f"{type(self).__name__} keeps every key channel")

    def full_token_head_bytes(self) -> int:
        """Key + value bytes of one token of one head with every key channel (a full cache's)."""
        if self.dropped_key_channels == 0:
            return self.token_head_bytes()  # type: ignore[attr-defined]
        itemsize = torch.empty((), dtype=self.dtype).element_size()  # type: ignore[attr-defined]
        return self.token_head_bytes() + self.dropped_key_channels * itemsize  # type: ignore[attr-defined]

    def _check_key_channels(self, channels: torch.Tensor, head_dim: int, prune_appended: bool) -> torch.Tensor:
        """``channels`` as ``[H, D_k]`` int64 on the layer's device, checked (once per layer: no second pruning); the
        store of later tokens' pruned channels is started unless ``prune_appended``."""
        if self.key_channels is not None:
            raise ValueError("this layer's key channels were already pruned")
        heads = self.num_heads  # type: ignore[attr-defined]
        if channels.dim() != 2 or channels.shape[0] != heads or not 0 < channels.shape[1] <= head_dim:
            shape = tuple(channels.shape)
            raise ValueError(f"key channels must be [{heads}, D_k] with 0 < D_k <= {head_dim}, got {shape}")
        channels = torch.sort(channels.to(device=self.device, dtype=torch.long), dim=1).values  # type: ignore[attr-defined]
        if bool((channels[:, 0] < 0).any()) or bool((channels[:, -1] >= head_dim).any()):
            raise IndexError(f"key channel out of range [0, {head_dim})")
        if channels.shape[1] > 1 and bool((channels[:, 1:] == channels[:, :-1]).any()):
            raise ValueError("duplicate key channels")
        self.dropped_key_channels = head_dim - channels.shape[1]
        if not prune_appended:  # kvpress: later tokens stay whole (their pruned channels kept aside)
            self.appended_keys = AppendedKeyChannels(channels, head_dim, self.dtype, self.device)  # type: ignore[attr-defined]
        return channels

    def rewrite_values(self, values: Sequence[torch.Tensor]) -> None:
        """Overwrite every stored value in place, ``values[h]`` ``[S_h, D]`` in head ``h``'s slot order: values no
        token produced (a merging method folds evicted values into kept ones, issue #58); keys, positions and bytes
        unchanged.  One implementation for both backends: the paged pool (``v_pool``) or the torch buffer."""
        v_pool = getattr(self, "v_pool", None)
        for head, head_values in enumerate(values):
            if v_pool is not None:  # paged (and the batched pool): the head's slots in the flat page pool
                flat = self._flat(v_pool)  # type: ignore[attr-defined]
                flat.index_copy_(0, self._slots(head), head_values.to(flat.dtype))  # type: ignore[attr-defined]
            else:  # torch: slots 0 .. S_h - 1 of the head's row (the layer's values are views of the buffer)
                length = self.host_lengths[head]  # type: ignore[attr-defined]
                self.value_buffer[0, head, :length] = head_values.to(self.value_buffer.dtype)  # type: ignore[attr-defined]

    def _refuse_pruned(self, operation: str) -> None:
        """Refuse an operation that writes full-width keys once the key channels were pruned."""
        if self.key_channels is not None:
            raise ValueError(f"{operation} needs full-width keys; this layer's key channels were pruned")

    def _appended_keep(self, sorted_indices: Sequence[torch.Tensor]) -> None:
        """:meth:`AppendedKeyChannels.keep` when the store is kept (after ``keep``)."""
        if self.appended_keys is not None:
            self.appended_keys.keep(sorted_indices)

    def _appended_evict(self, heads: torch.Tensor, slots: torch.Tensor, last: torch.Tensor) -> None:
        """:meth:`AppendedKeyChannels.evict` when the store is kept (after ``evict_slots``)."""
        if self.appended_keys is not None:
            self.appended_keys.evict(heads, slots.long(), last)

    def _full_width(self, kept_keys: torch.Tensor, heads: torch.Tensor | None = None) -> torch.Tensor:
        """Stored keys ``[n, S, D_k]`` of ``heads`` as attention and scorers read them: full width (zero pruned context
        channels, appended tokens whole) when :attr:`appended_keys` is kept, else as stored."""
        return kept_keys if self.appended_keys is None else self.appended_keys.full_keys(kept_keys, heads)

    def _appended_bytes(self) -> int:
        """Bytes of the appended tokens' pruned channels (0 unless :attr:`appended_keys` is kept)."""
        if self.appended_keys is None:
            return 0
        tokens = self.appended_keys.appended_tokens(self.host_lengths)  # type: ignore[attr-defined]
        return tokens * self.appended_keys.extra_token_bytes()

    def _appended_allocated(self) -> int:
        """Bytes the store of appended tokens' pruned channels holds (0 when none)."""
        return 0 if self.appended_keys is None else self.appended_keys.allocated_bytes()

    def attention_kv(self, keys: LayerKV, values: LayerKV) -> tuple[torch.Tensor | RaggedKV, torch.Tensor | RaggedKV]:
        """What :meth:`update` returned is what the chunk attends over (dense or per-head views)."""
        return keys.states, values.states

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

    def _evicting_heads(self, heads: Sequence[int] | None) -> tuple[list[int], torch.Tensor]:
        """The heads of a one-token eviction (``evict_slots``; ``None``: every head), as a host list and an ``[n]``
        int64 index on the layer's device."""
        host_heads = list(range(self.num_heads)) if heads is None else list(heads)  # type: ignore[attr-defined]
        if heads is None:
            return host_heads, torch.arange(len(host_heads), device=self.device)
        return host_heads, torch.tensor(host_heads, dtype=torch.long, device=self.device)

    def _count_evicted(self, host_heads: list[int], rows: torch.Tensor, every_head: bool) -> None:
        """The bookkeeping of a one-token eviction from ``host_heads`` (``rows`` on the device): one token fewer per
        head in ``lengths`` and ``host_lengths``, and one row copied per head in :attr:`stats`."""
        lengths: torch.Tensor = self.lengths  # type: ignore[attr-defined]
        if every_head:
            lengths -= 1
        else:
            lengths[rows] -= 1
        for head in host_heads:
            self.host_lengths[head] -= 1  # type: ignore[attr-defined]
        self.stats.rows_copied += len(host_heads)  # type: ignore[attr-defined]

    def _incoming(self, key_states: torch.Tensor, value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The common start of ``update``: initialise on first use, check batch size 1, and repeat KV heads per
        query head when the layer stores query-head granularity, and keep only the layer's key channels when they were
        pruned.  Returns ``[1, H, q, D_k]`` keys and ``[1, H, q, D]`` values."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if key_states.shape[0] != 1:
            raise ValueError(f"kvbench caches hold batch size 1, got {key_states.shape[0]}")
        if self.expand_factor > 1:
            key_states = key_states.repeat_interleave(self.expand_factor, dim=1)
            value_states = value_states.repeat_interleave(self.expand_factor, dim=1)
        if self.key_channels is not None:  # a pruned layer stores every later key's kept channels in its storage,
            if self.appended_keys is not None:  # and the pruned ones aside (kvpress: later keys stay whole)
                self.appended_keys.append(key_states, self.host_lengths)  # type: ignore[attr-defined]
            key_states = gather_key_channels(key_states, self.key_channels)
        return key_states, value_states
