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
    returns ``[R, G, D_v]``.  One gather of whole pages per pool (:meth:`PooledLayer.page_rows`), two batched
    products in the model dtype and a float32 softmax cast back (transformers' eager attention's numerics; the
    identity in float32); slots past a row's length are masked (their stale values are finite and weigh 0).  On CPU a
    bf16 product is ~10x faster than the one-query bf16 SDPA kernel of the per-sample path."""
    keys, values = layer.page_rows()  # [R, W * page, D]
    assert layer.lengths is not None
    logits = torch.bmm(query, keys.transpose(1, 2)) * scaling  # [R, G, W * page]
    stored = torch.arange(keys.shape[1], device=keys.device) < layer.lengths[:, None]  # [R, W * page]
    logits = logits.masked_fill(~stored[:, None], float("-inf"))
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32).to(values.dtype)
    return torch.bmm(probs, values)


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
    if kv.observer is not None:
        kv.observer.after_pooled_attention(kv.layer_idx, layer, query.reshape(-1, 1, dim), effective)
    return output
