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
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from kvbench.cache import RaggedKV, on_device
from kvbench.paged import PagedKV, paged_attention

#: The name to pass as ``attn_implementation`` (registered on import of this module).
ATTENTION_NAME = "kvbench"


class AttentionObserver(Protocol):
    """What the attention function calls back after each layer (implemented by the eviction session)."""

    def after_attention(self, module: torch.nn.Module, query: torch.Tensor, scaling: float) -> None:
        """Called with ``query`` ``[1, H_q, q, D]`` (post-RoPE) once the layer's output is computed."""


def bottom_right_causal_mask(query_length: int, key_length: int, device: torch.device) -> torch.Tensor:
    """Boolean ``[q, S]`` mask, True where query ``i`` may attend key ``j``: ``j <= S - q + i``."""
    if key_length < query_length:
        raise ValueError(f"cache holds {key_length} tokens, fewer than the {query_length} new queries")
    rows = torch.arange(query_length, device=device)[:, None]
    cols = torch.arange(key_length, device=device)[None, :]
    return cols <= rows + (key_length - query_length)


def _dense_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float | None,
    dropout: float,
) -> torch.Tensor:
    """Attention over ``[1, H_kv', S, D]`` keys (all heads the same length); returns ``[1, q, H_q, D]``."""
    query_length, key_length = query.shape[2], key.shape[2]
    mask = None
    if 1 < query_length < key_length:
        mask = bottom_right_causal_mask(query_length, key_length, query.device)[None, None]
    groups = query.shape[1] // key.shape[1]
    # sdpa_attention_forward reads the GQA factor from the module; the stored head count may differ from the
    # model's (query-head granularity), so give it a view with the right factor.
    output, _ = sdpa_attention_forward(
        _GroupView(module, groups), query, key, value, mask, dropout=dropout, scaling=scaling, is_causal=True
    )
    return output


def _ragged_attention(
    query: torch.Tensor, keys: RaggedKV, values: RaggedKV, scaling: float | None, dropout: float
) -> torch.Tensor:
    """Attention over per-head sequences of different lengths; returns ``[1, q, H_q, D]``."""
    query_length = query.shape[2]
    groups = query.shape[1] // keys.num_heads
    outputs = []
    for head, (head_k, head_v) in enumerate(zip(keys.heads, values.heads, strict=True)):
        head_q = query[:, head * groups : (head + 1) * groups]  # [1, g, q, D]
        key_length = head_k.shape[2]
        mask = None
        is_causal = False
        if query_length > 1:
            if key_length == query_length:
                is_causal = True
            else:
                mask = bottom_right_causal_mask(query_length, key_length, query.device)[None, None]
        out = torch.nn.functional.scaled_dot_product_attention(
            head_q,
            head_k.expand(1, groups, key_length, head_k.shape[-1]),
            head_v.expand(1, groups, key_length, head_v.shape[-1]),
            attn_mask=mask,
            dropout_p=dropout,
            is_causal=is_causal,
            scale=scaling,
        )
        outputs.append(out)
    return torch.cat(outputs, dim=1).transpose(1, 2).contiguous()


class _GroupView:
    """Proxy exposing a module with a different ``num_key_value_groups`` (for sdpa_attention_forward)."""

    def __init__(self, module: torch.nn.Module, groups: int) -> None:
        self._module = module
        self.num_key_value_groups = groups

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


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
        output = _ragged_attention(query, key, value, scaling, dropout)
    else:
        assert isinstance(value, torch.Tensor)
        output = _dense_attention(module, query, key, value, scaling, dropout)
    if session is not None:
        effective_scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
        session.after_attention(module, query, effective_scaling)
    return output, None


AttentionInterface.register(ATTENTION_NAME, kvbench_attention_forward)
