"""One attention call per layer for a whole decode batch (issue #46): the new query of every (sample, head) row over
that row's keys in the batch's shared page pool (:class:`kvbench.cache.pool.PooledLayer`).

The path is the pool's :attr:`~kvbench.cache.paged.PagedLayer.attention_plan`, as a paged layer's: on CUDA
``varlen_attn`` over the block table or the split-K Triton decode kernel, each row one sequence with the ``G`` query
heads of its GQA group (:func:`kvbench.attention.paged.paged_attention` on the batch's rows: the queries
``[B, H_q, 1, D]`` are the rows' groups in order); on CPU (``torch_gather``) :func:`padded_rows_attention`: one gather
of every row's keys and values, one batched product, one masked softmax, one product.  No loop over samples or heads,
no repeat of the GQA group.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from kvbench.attention.paged import paged_attention
from kvbench.cache.base import LayerKV, on_device
from kvbench.cache.pool import PooledLayer
from kvbench.kernels.paths import ATTENTION_RECORD


class PoolObserver(Protocol):
    """What the pooled attention calls back after each layer (the decode batch: its policy step)."""

    def after_pooled_attention(self, layer_idx: int, layer: PooledLayer, query: torch.Tensor, scaling: float) -> None:
        """``query`` ``[B * H_q, 1, D]``: every sample's new queries, rows in pool order."""


class PooledKV:
    """What :meth:`kvbench.inference.decode_pool.PooledCache.update` returns (as keys and as values): the layer's
    pool, with the new token of every row already stored, and the batch to call back.

    Attributes
    ----------
    layer:
        The pool.
    layer_idx:
        The model layer.
    observer:
        The decode batch (:class:`PoolObserver`), or ``None``.
    """

    def __init__(self, layer: PooledLayer, layer_idx: int, observer: PoolObserver | None) -> None:
        self.layer = layer
        self.layer_idx = layer_idx
        self.observer = observer


def padded_rows_attention(query: torch.Tensor, layer: PooledLayer, scaling: float) -> torch.Tensor:
    """The CPU path: ``query`` ``[R, G, D_k]`` (row ``r``'s ``G`` query heads) over each row's stored keys;
    returns ``[R, G, D_v]``.  Products in the model dtype and a float32 softmax cast back (transformers' eager
    attention's numerics; the identity in float32), without copying the keys or values: the logits of every physical
    page of the pool against its row's queries (one batched product over the pool as it lies in memory), gathered
    into rows for a masked softmax over each row's stored slots, scattered back to the pages, multiplied with the
    pages' values (one batched product) and summed per row.  On CPU a bf16 product is ~10x faster than the one-query
    bf16 SDPA kernel of the per-sample path."""
    assert layer.k_pool is not None and layer.v_pool is not None and layer.lengths is not None
    size, rows, groups = layer.page_size, layer.num_heads, query.shape[1]
    num_pages = layer.num_pages
    pages, owner, width = layer.page_map()  # [R * W] each row's pages (spare past its own), [P] each page's row
    keys = layer.k_pool.view(num_pages, size, -1)  # [P, page, D_k], no copy
    logits = torch.bmm(query.index_select(0, owner), keys.transpose(1, 2)) * scaling  # [P, G, page]
    by_row = torch.cat([logits, logits.new_zeros((1, groups, size))]).index_select(0, pages)  # [R * W, G, page]
    by_row = by_row.view(rows, width, groups, size).transpose(1, 2).reshape(rows, groups, width * size)
    stored = torch.arange(width * size, device=query.device) < layer.lengths[:, None]  # [R, W * page]
    probs = torch.softmax(by_row.masked_fill(~stored[:, None], float("-inf")), dim=-1, dtype=torch.float32)
    probs = probs.to(layer.v_pool.dtype).view(rows, groups, width, size).transpose(1, 2).reshape(-1, groups, size)
    by_page = probs.new_zeros((num_pages + 1, groups, size)).index_copy_(0, pages, probs)[:num_pages]  # [P, G, page]
    partial = torch.bmm(by_page, layer.v_pool.view(num_pages, size, -1))  # [P, G, D_v], no copy of the values
    output = torch.zeros((rows, groups, partial.shape[-1]), dtype=torch.float32, device=query.device)
    return output.index_add_(0, owner, partial.float()).to(layer.v_pool.dtype)


def pooled_attention(module: torch.nn.Module, query: torch.Tensor, kv: PooledKV, scaling: float | None,
                     kwargs: dict[str, Any]) -> torch.Tensor:  # fmt: skip
    """Attention of a batched decoding step's ``query`` ``[B, H_q, 1, D]`` over the pool; returns
    ``[B, 1, H_q, D_v]``, then the batch's policy step (``kv.observer``)."""
    for name in ("softcap", "s_aux", "sliding_window"):
        if kwargs.get(name) is not None:
            raise NotImplementedError(
                f"the pooled decode batch has no {name} (the batch falls back to per-sample rows for such models)"
            )
    layer = kv.layer
    samples, query_heads, query_length, dim = query.shape
    if query_length != 1 or samples != layer.num_samples:
        raise ValueError(f"pooled attention takes one query per sample, got {tuple(query.shape)}")
    effective = scaling if scaling is not None else dim**-0.5
    rows = layer.num_heads
    plan = layer.attention_plan
    assert plan is not None
    if plan.decode == "torch_gather":
        ATTENTION_RECORD.note("torch_gather", plan.fallback_of("decode"))
        out = padded_rows_attention(query.reshape(rows, samples * query_heads // rows, dim), layer, effective)
        output = out.reshape(samples, 1, query_heads, -1)
    else:
        flat = query.reshape(1, samples * query_heads, 1, dim)
        states = LayerKV(layer, flat, False)
        with on_device(query.device):  # Triton launches on the pool's device (a device map spreads layers)
            output = paged_attention(module, flat, states, states, scaling, 0.0)
        output = output.reshape(samples, 1, query_heads, -1)
    done = getattr(layer, "attention_done", None)  # quantized rows (kv_quant) are quantized once attention read them
    if done is not None:
        done()
    if kv.observer is not None:
        kv.observer.after_pooled_attention(kv.layer_idx, layer, query.reshape(-1, 1, dim), effective)
    return output
