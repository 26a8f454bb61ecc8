"""The one attention function kvbench registers with transformers (``attn_implementation="kvbench"``).

Because "kvbench" is not a key of transformers' mask registry, models pass ``attention_mask=None`` to it, and it
builds the right causal mask itself from each layer's (and each head's) own stored length.  The new ``q`` query
tokens are always the last ``q`` entries of every head's storage (they were just appended), so the mask is
*bottom-right* causal: query ``i`` of the chunk sees stored slots ``0 .. S_h - q + i``.  This is correct

* in prefill (``S_h == q``: plain causal attention),
* for a multi-token question fed on top of a compressed context (``q > 1``, ``S_h > q``),
* in decoding (``q == 1``: attend to everything stored).

Dense layers go through transformers' own ``sdpa_attention_forward`` (identical numerics to ``sdpa`` when
nothing is evicted); ragged layers loop over stored heads, each with its GQA group of query heads; paged layers
(``KVBenchCache(backend="paged")``) go through :func:`kvbench.paged.paged_attention` (varlen / Triton on CUDA, the
same per-head SDPA as ragged layers otherwise).

Eviction hooks in here, not through monkeypatching: the generation loop passes a ``kvbench_session`` keyword
argument through the model's forward; after computing a layer's attention this function hands the session the
layer's post-RoPE queries, and the session may compress that layer's cache (prefill) or apply its decode policy.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from transformers import AttentionInterface

from kvbench.attention_ops import bottom_right_causal_mask, dense_attention, ragged_attention
from kvbench.cache_base import RaggedKV, on_device
from kvbench.paged import PagedKV, paged_attention

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
    key: torch.Tensor | RaggedKV | PagedKV,
    value: torch.Tensor | RaggedKV | PagedKV,
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
        Dense ``[1, H, S, D]``, :class:`RaggedKV` per-head ``[1, 1, S_h, D]``, or :class:`~kvbench.paged.PagedKV`
        (paged backend), as returned by the cache.
    attention_mask:
        Must be ``None``: kvbench runs one unpadded sequence and builds its own masks.
    kwargs:
        ``kvbench_session`` (optional) receives the queries after the output is computed; ``sliding_window``
        must be unset.

    Returns
    -------
    ``([1, q, H_q, D], None)``: the attention output and no attention weights.
    """
    if attention_mask is not None:
        raise ValueError("kvbench attention expects attention_mask=None (batch size 1, no padding)")
    if kwargs.get("sliding_window") is not None:
        raise NotImplementedError(
            f"model layer {getattr(module, 'layer_idx', '?')} uses sliding-window attention "
            f"(window {kwargs['sliding_window']}), which kvbench's cache does not implement"
        )
    if query.shape[0] != 1:
        raise ValueError(f"kvbench attention runs batch size 1, got {query.shape[0]}")
    with on_device(query.device):  # this layer's device (a device map spreads layers over GPUs)
        return _attend_and_observe(module, query, key, value, scaling, dropout, kwargs.get("kvbench_session"))


def _attend_and_observe(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor | RaggedKV | PagedKV,
    value: torch.Tensor | RaggedKV | PagedKV,
    scaling: float | None,
    dropout: float,
    session: AttentionObserver | None,
) -> tuple[torch.Tensor, None]:
    """The attention output for the cache layer's storage kind, then the session's callback."""
    if isinstance(key, PagedKV):
        output = paged_attention(module, query, key, scaling, dropout)
    elif isinstance(key, RaggedKV):
        assert isinstance(value, RaggedKV)
        output = ragged_attention(query, key, value, scaling, dropout)
    else:
        assert isinstance(value, torch.Tensor)
        output = dense_attention(module, query, key, value, scaling, dropout)
    if session is not None:
        effective_scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
        session.after_attention(module, query, effective_scaling)
    return output, None


AttentionInterface.register(ATTENTION_NAME, kvbench_attention_forward)
