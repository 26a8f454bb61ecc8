"""Attention over a paged per-head layer (:class:`kvbench.cache.paged.PagedLayer`).

A chunk that is the layer's first (plain prefill) runs dense SDPA on the new states; later chunks run the path
:func:`kvbench.kernels.paths.plan_attention` chose when the layer was allocated: ``varlen_attn`` over the block
table, the split-K Triton decode kernel, or (CPU, question chunks on a compressed cache) a gather of each head through
the same per-head SDPA as the ragged torch backend, so both backends give the same logits.  A kernel's error
propagates (no silent fallback); each call and fallback is counted in :data:`kvbench.kernels.paths.ATTENTION_RECORD`.
"""

from __future__ import annotations

import torch

from kvbench import kernels
from kvbench.attention.ops import dense_attention, ragged_attention
from kvbench.cache.base import LayerKV
from kvbench.cache.paged import PagedLayer
from kvbench.kernels.paths import ATTENTION_RECORD


def _varlen_paged(query: torch.Tensor, layer: PagedLayer, scaling: float | None, causal: bool) -> torch.Tensor:
    """``torch.nn.attention.varlen.varlen_attn`` over the block table; ``query`` ``[1, H_q, q, D]`` ->
    ``[1, q, H_q, D]``.  Heads are the batch: sequence ``h`` has ``q`` queries with ``G`` heads and one KV head."""
    from torch.nn.attention.varlen import varlen_attn

    _, num_q, q_len, dim = query.shape
    heads = layer.num_heads
    groups = num_q // heads
    q = query[0].reshape(heads, groups, q_len, dim).permute(0, 2, 1, 3).reshape(heads * q_len, groups, dim)
    cu_seq_q = torch.arange(0, (heads + 1) * q_len, q_len, dtype=torch.int32, device=query.device)
    max_k = max(layer.host_lengths)
    out = varlen_attn(
        q.contiguous(),
        layer.k_pool,
        layer.v_pool,
        cu_seq_q,
        None,
        q_len,
        max_k,
        scale=scaling,
        window_size=(-1, 0) if causal else (-1, -1),
        enable_gqa=True,
        seqused_k=layer.lengths,
        block_table=layer.block_table,
    )
    return out.reshape(heads, q_len, groups, dim).permute(1, 0, 2, 3).reshape(1, q_len, num_q, dim)


def paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    keys: LayerKV,
    values: LayerKV,
    scaling: float | None,
    dropout: float,
) -> torch.Tensor:
    """Causal attention of ``query`` ``[1, H_q, q, D]`` over a paged layer (``keys`` / ``values``: what its
    ``update`` returned); returns ``[1, q, H_q, D]``.

    The path is the layer's :attr:`PagedLayer.attention_plan` (see the module docstring); errors propagate.
    """
    layer = keys.layer
    assert isinstance(layer, PagedLayer)
    q_len = query.shape[2]
    if keys.first_chunk:
        ATTENTION_RECORD.note("dense_prefill", None)
        assert isinstance(keys.states, torch.Tensor) and isinstance(values.states, torch.Tensor)
        return dense_attention(module, query, keys.states, values.states, scaling, dropout)
    plan = layer.attention_plan
    assert plan is not None
    kind = "decode" if q_len == 1 else "chunk"
    path = plan.decode if q_len == 1 else plan.chunk
    if dropout != 0.0:  # training-style dropout: only the torch reference has it
        path = "torch_gather"
    ATTENTION_RECORD.note(path, plan.fallback_of(kind))
    if path == "varlen_paged":
        return _varlen_paged(query, layer, scaling, causal=q_len > 1)
    if path == "triton_decode":
        heads = layer.num_heads
        q = query[0, :, 0].reshape(heads, query.shape[1] // heads, query.shape[-1])
        out = kernels.paged_decode_attention(
            q,
            layer._flat(layer.k_pool),  # type: ignore[arg-type]
            layer._flat(layer.v_pool),  # type: ignore[arg-type]
            layer.block_table,  # type: ignore[arg-type]
            layer.lengths,  # type: ignore[arg-type]
            scaling if scaling is not None else query.shape[-1] ** -0.5,
            layer.page_size,
            max(layer.host_lengths),
        )
        return out.reshape(1, 1, query.shape[1], query.shape[-1])
    if not layer.is_ragged:
        keys, values = layer.dense_kv()
        return dense_attention(module, query, keys[None], values[None], scaling, dropout)
    keys, values = layer.ragged_kv()
    return ragged_attention(query, keys, values, scaling, dropout)
