"""The one attention function kvbench registers with transformers (``attn_implementation="kvbench"``).

Because "kvbench" is not a key of transformers' mask registry, models pass ``attention_mask=None`` to it, and it
builds the right causal mask itself from each layer's (and each head's) own stored length.  The new ``q`` query
tokens are always the last ``q`` entries of every head's storage (they were just appended), so the mask is
*bottom-right* causal: query ``i`` of the chunk sees stored slots ``0 .. S_h - q + i``.  This is correct

* in prefill (``S_h == q``: plain causal attention),
* for a multi-token question fed on top of a compressed context (``q > 1``, ``S_h > q``),
* in decoding (``q == 1``: attend to everything stored).

Every cache layer's ``update`` returns :class:`~kvbench.cache.base.LayerKV` (the layer and that side's states), and
attention dispatches on the layer (:class:`~kvbench.cache.base.EvictableLayer`), not on the type of the key: a layer
with an attention plan (``KVBenchCache(backend="paged")``) goes through
:func:`kvbench.attention.paged.paged_attention` (varlen / Triton on CUDA, the same per-head SDPA as ragged layers
otherwise); the others hand over what the chunk attends over (:meth:`~kvbench.cache.base.EvictableLayer.attention_kv`):
dense views go through transformers' own ``sdpa_attention_forward`` (identical numerics to ``sdpa`` when nothing is
evicted), per-head views loop over stored heads, each with its GQA group of query heads.  A layer that stores fewer
key channels (ThinK) hands over full-width keys whose pruned context channels are zero and whose later tokens are
whole (kvpress's ThinKPress), or with ``prune_appended`` keys of the kept channels only, attended with the matching
query channels (:attr:`~kvbench.cache.base.EvictableLayer.query_channels`,
:func:`~kvbench.cache.base.select_query_channels`); on every path, at the model's softmax scale.  While the session's
``eager_attention`` is true (KVCompose's prefill and replay: kvpress forces ``eager`` attention for them) every layer
is computed as transformers' ``eager_attention_forward`` (:func:`kvbench.attention.extras.detailed_attention`), whose
bfloat16 outputs round otherwise than SDPA's.

Eviction hooks in here, not through monkeypatching: the generation loop passes a ``kvbench_session`` keyword
argument through the model's forward; after computing a layer's attention this function hands the session the
layer's post-RoPE queries, and the session may compress that layer's cache (prefill) or apply its decode policy.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Protocol

import torch
from transformers import AttentionInterface

from kvbench.attention.extras import (
    AttentionDetails,
    attend_within_window_by_position,
    detailed_attention,
    ragged_detailed_attention,
)
from kvbench.attention.ops import bottom_right_causal_mask, dense_attention, ragged_attention
from kvbench.attention.paged import paged_attention
from kvbench.attention.pooled import PooledKV, pooled_attention
from kvbench.cache.base import LayerKV, RaggedKV, on_device, select_query_channels
from kvbench.cache.batched import BatchedKV
from kvbench.cache.sliding import sliding_causal_mask

__all__ = ["ATTENTION_NAME", "AttentionObserver", "bottom_right_causal_mask", "kvbench_attention_forward"]

#: The name to pass as ``attn_implementation`` (registered on import of this module).
ATTENTION_NAME = "kvbench"


class AttentionObserver(Protocol):
    """What the attention function calls back after each layer (implemented by the eviction session)."""

    def after_attention(self, module: torch.nn.Module, query: torch.Tensor, scaling: float) -> None:
        """Called with ``query`` ``[1, H_q, q, D]`` (post-RoPE) once the layer's output is computed."""


def kvbench_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: LayerKV | BatchedKV | PooledKV | torch.Tensor | RaggedKV,
    value: LayerKV | BatchedKV | PooledKV | torch.Tensor | RaggedKV,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal attention over a kvbench cache layer (see module docstring).

    Parameters
    ----------
    query:
        ``[1, H_q, q, D]`` post-RoPE queries of the new tokens.
    key, value:
        What the cache layer's ``update`` returned (:class:`~kvbench.cache.base.LayerKV`), a batched step's
        :class:`~kvbench.cache.batched.BatchedKV` (per-sample rows) or :class:`~kvbench.attention.pooled.PooledKV`
        (the batch's shared page pool: one call for all samples), or tensors no kvbench cache layer returned (dense
        ``[1, H, S, D]`` or :class:`RaggedKV`), attended as they are.
    attention_mask:
        Must be ``None``: kvbench runs one unpadded sequence and builds its own masks.
    kwargs:
        ``kvbench_session`` (optional) receives the queries after the output is computed; ``kvbench_cache``
        (optional, else the session's) gives each layer's sliding window and positions; the per-model details
        ``sliding_window``, ``softcap`` and ``s_aux`` (sinks) are honoured (:mod:`kvbench.attention.extras`).

    Returns
    -------
    ``([1, q, H_q, D], None)``: the attention output and no attention weights.
    """
    if attention_mask is not None:
        raise ValueError("kvbench attention expects attention_mask=None (batch size 1, no padding)")
    if isinstance(key, PooledKV):  # a decode batch's shared page pool: one call for every sample (issue #46)
        return pooled_attention(module, query, key, scaling, kwargs), None
    if isinstance(key, BatchedKV):
        return _batched_rows(module, query, key, scaling, dropout, kwargs), None
    if not isinstance(key, LayerKV):
        # Dense tensors: a kvbench layer's dense states (returned as tensors, since some models reshape them before
        # attention), found through the cache and the module's layer index; else tensors of another cache or none.
        owner = _cache_layer(module, kwargs) if isinstance(key, torch.Tensor) else None
        holder = owner if owner is not None else _GivenTensors(isinstance(key, RaggedKV))
        key, value = LayerKV(holder, key), LayerKV(holder, value)  # type: ignore[arg-type]
    assert isinstance(value, LayerKV)
    if query.shape[0] != 1:
        raise ValueError(f"kvbench attention runs batch size 1, got {query.shape[0]}")
    details = AttentionDetails.from_kwargs(kwargs)
    session = kwargs.get("kvbench_session")
    cache = getattr(session, "cache", None) or kwargs.get("kvbench_cache")
    layer_idx = getattr(module, "layer_idx", None)
    layer, cache_window = key.layer, None
    channels = getattr(layer, "query_channels", None)
    if channels is not None:  # ThinK, prune_appended: the keys handed over are D_k wide; the matching query channels
        scaling = scaling if scaling is not None else query.shape[-1] ** -0.5  # the model's scale, not D_k's
        query = select_query_channels(query, channels)
    if cache is not None and layer_idx is not None:
        cache_window = getattr(cache, "windows", [None] * len(cache.layers))[int(layer_idx)]
    if details.window is None and cache_window is not None:
        # Some models (PhiMoE) put the window in the mask only, which kvbench builds itself: take the layer's.
        details = replace(details, window=cache_window)
    with on_device(query.device):  # this layer's device (a device map spreads layers over GPUs)
        evictable = not layer.is_sliding and not isinstance(layer, _GivenTensors)
        if details.window is not None and cache is not None and layer_idx is not None and evictable:
            # A sliding layer kept evictable (compress_sliding): the window is applied on the true positions.
            output = _windowed_by_position(query, key, value, scaling, details)
            _attention_done(layer)
            if session is not None:
                session.after_attention(module, query, scaling if scaling is not None else query.shape[-1] ** -0.5)
            return output, None
        if details.window is not None and (layer.attention_plan is not None or layer.is_ragged):
            raise NotImplementedError(
                f"model layer {layer_idx} uses sliding-window attention (window {details.window}) over per-head "
                f"storage ({type(layer).__name__}) without a kvbench session to read its positions from"
            )
        return _attend_and_observe(module, query, key, value, scaling, dropout, session, details)


def _cache_layer(module: torch.nn.Module, kwargs: dict[str, Any]) -> Any:
    """The kvbench cache layer of ``module`` (its ``layer_idx``) in the forward's session or cache, if any."""
    session = kwargs.get("kvbench_session")
    cache = getattr(session, "cache", None) or kwargs.get("kvbench_cache")
    layer_idx = getattr(module, "layer_idx", None)
    layers = getattr(cache, "layers", None)
    if layers is None or layer_idx is None or not 0 <= int(layer_idx) < len(layers):
        return None
    return layers[int(layer_idx)]


class _GivenTensors:
    """The stand-in layer of keys and values handed over as tensors, dense or :class:`RaggedKV` (no kvbench cache
    layer updated them): attended as they are."""

    is_sliding = False
    attention_plan = None

    def __init__(self, is_ragged: bool) -> None:
        self.is_ragged = is_ragged

    @staticmethod
    def attention_kv(keys: LayerKV, values: LayerKV) -> tuple[torch.Tensor | RaggedKV, torch.Tensor | RaggedKV]:
        return keys.states, values.states


def _batched_rows(
    module: torch.nn.Module,
    query: torch.Tensor,
    batch: BatchedKV,
    scaling: float | None,
    dropout: float,
    kwargs: dict[str, Any],
) -> torch.Tensor:
    """A batched decoding step (:mod:`kvbench.cache.batched`): row ``b`` of ``query`` ``[B, H_q, q, D]`` attends over
    sample ``b``'s own storage with its own session, exactly as a batch-1 forward; returns ``[B, q, H_q, D]``."""
    if query.shape[0] != batch.batch_size:
        raise ValueError(f"batched attention: {query.shape[0]} query rows for {batch.batch_size} samples")
    rows = []
    for row in range(batch.batch_size):
        row_kwargs = {**kwargs, "kvbench_session": batch.sessions[row], "kvbench_cache": batch.caches[row]}
        output, _ = kvbench_attention_forward(
            module, query[row : row + 1], batch.keys[row], batch.values[row], None, scaling, dropout, **row_kwargs
        )
        rows.append(output)
    return torch.cat(rows, dim=0)


def _windowed_by_position(
    query: torch.Tensor, key: LayerKV, value: LayerKV, scaling: float | None, details: AttentionDetails
) -> torch.Tensor:
    """Sliding-window attention over an evictable layer (heads may differ in length and hold non-contiguous
    positions): per stored head, query ``p`` sees the kept keys at positions ``p - window < k <= p``."""
    layer = key.layer
    keys, values = _per_head_kv(key, value)
    query_positions = torch.arange(layer.seen_tokens - query.shape[2], layer.seen_tokens, device=query.device)
    assert details.window is not None
    return attend_within_window_by_position(
        query, keys, values, layer.positions, query_positions, details.window, scaling, details
    )


def _per_head_kv(key: LayerKV, value: LayerKV) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per stored head ``[1, 1, S_h, D]`` keys and values of a layer's ``update`` result."""
    keys, values = key.layer.attention_kv(key, value)
    if isinstance(keys, RaggedKV):
        assert isinstance(values, RaggedKV)
        return keys.heads, values.heads
    assert isinstance(values, torch.Tensor)
    return list(keys.split(1, dim=1)), list(values.split(1, dim=1))


def _attend_and_observe(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: LayerKV,
    value: LayerKV,
    scaling: float | None,
    dropout: float,
    session: AttentionObserver | None,
    details: AttentionDetails,
) -> tuple[torch.Tensor, None]:
    """The attention output for the cache layer (its kernels when it has an attention plan, else the dense or
    per-head views it hands over), then the session's callback."""
    effective_scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    eager = bool(getattr(session, "eager_attention", False))  # KVCompose's prefill and replay (kvpress's eager)
    if eager or details.needs_eager or details.window is not None:
        output = _detailed(module, query, key, value, effective_scaling, details, eager)
    elif key.layer.attention_plan is not None:
        output = paged_attention(module, query, key, value, scaling, dropout)
    else:
        keys, values = key.layer.attention_kv(key, value)
        if isinstance(keys, RaggedKV):
            assert isinstance(values, RaggedKV)
            output = ragged_attention(query, keys, values, scaling, dropout)
        else:
            assert isinstance(values, torch.Tensor)
            output = dense_attention(module, query, keys, values, scaling, dropout)
    _attention_done(key.layer)
    if session is not None:
        session.after_attention(module, query, effective_scaling)
    return output, None


def _attention_done(layer: Any) -> None:
    """Tell a layer that quantizes its storage after attention (``kv_quant``: :mod:`kvbench.cache.quantized`) that
    the new states were used: it quantizes them now, before the session's scorers read the layer."""
    done = getattr(layer, "attention_done", None)
    if done is not None:
        done()


def _detailed(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: LayerKV,
    value: LayerKV,
    scaling: float,
    details: AttentionDetails,
    eager: bool = False,
) -> torch.Tensor:
    """Attention with a sliding window, soft-capping or sinks (inference: no dropout); returns ``[1, q, H_q, D]``.

    A sliding layer without soft-capping or sinks keeps SDPA (a boolean window mask); the others, and every layer
    when ``eager`` (the session's :attr:`~kvbench.inference.eviction.EvictionSession.eager_attention`), are computed
    eagerly (:func:`kvbench.attention.extras.detailed_attention`: transformers' ``eager_attention_forward`` bit for
    bit).  Paged storage is read back as dense or per-head tensors.
    """
    keys, values = key.layer.attention_kv(key, value)
    if isinstance(keys, RaggedKV):
        assert isinstance(values, RaggedKV)
        return ragged_detailed_attention(query, keys, values, scaling, details, bottom_right_causal_mask)
    assert isinstance(values, torch.Tensor)
    query_length, key_length = query.shape[2], keys.shape[2]
    mask = None
    if details.window is not None and key_length > 1:
        mask = sliding_causal_mask(query_length, key_length, details.window, query.device)
    elif query_length > 1:
        mask = bottom_right_causal_mask(query_length, key_length, query.device)
    if eager or details.needs_eager:
        return detailed_attention(query, keys, values, scaling, mask, details)
    groups = query.shape[1] // keys.shape[1]
    output = torch.nn.functional.scaled_dot_product_attention(
        query,
        keys.repeat_interleave(groups, dim=1),
        values.repeat_interleave(groups, dim=1),
        attn_mask=mask[None, None] if mask is not None else None,
        scale=scaling,
    )
    return output.transpose(1, 2).contiguous()


AttentionInterface.register(ATTENTION_NAME, kvbench_attention_forward)
