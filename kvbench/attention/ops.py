"""Attention over stored keys and values, the operations below every cache layer (no cache logic here).

* :func:`bottom_right_causal_mask`: the ``[q, S]`` mask of new queries that are the last ``q`` stored tokens;
* :func:`dense_attention`: all stored heads the same length, through transformers' ``sdpa_attention_forward``;
* :func:`ragged_attention`: per-head sequences of different lengths, one SDPA call per stored head with its GQA group.

:mod:`kvbench.cache.paged` and :mod:`kvbench.attention.function` (the function registered with transformers) both call
these.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from kvbench.cache.base import RaggedKV

#: The largest additive bottom-right causal mask built so far, per ``(dtype, device)``: every smaller one is a view of
#: its bottom-right corner, so long CPU prefills (chunks of the same shapes, prompt after prompt) build it once.
#: At most one mask per key, covering the largest chunk asked for; the keys grow geometrically, so it may hold up to
#: twice the longest key length seen (<= 1 GiB at the automatic CPU chunk sizes of a 128K prompt in float32).  A mask
#: made under ``torch.inference_mode()`` (generation) is kept apart from one made outside it: an inference tensor
#: cannot take part in a backward pass (KVgrad's gradient replay attends outside inference mode).
_ADDITIVE_MASKS: dict[tuple[torch.dtype, torch.device, bool], torch.Tensor] = {}


def bottom_right_causal_mask(
    query_length: int, key_length: int, device: torch.device, dtype: torch.dtype = torch.bool
) -> torch.Tensor:
    """``[q, S]`` mask of query ``i`` over key ``j``, allowed where ``j <= S - q + i``.

    ``dtype=torch.bool`` (default): True where allowed, a new tensor.  A floating ``dtype``: the additive mask SDPA
    converts a boolean one into (``0`` where allowed, ``-inf`` elsewhere) -- bit for bit what SDPA would use, without
    the boolean ``[q, S]`` pass and its conversion; a read-only view of a cached mask (:data:`_ADDITIVE_MASKS`).
    """
    if key_length < query_length:
        raise ValueError(f"cache holds {key_length} tokens, fewer than the {query_length} new queries")
    if dtype == torch.bool:
        return torch.ones(query_length, key_length, dtype=torch.bool, device=device).tril_(key_length - query_length)
    key = (dtype, torch.device(device), torch.is_inference_mode_enabled())
    cached = _ADDITIVE_MASKS.get(key)
    if cached is None or cached.shape[0] < query_length or cached.shape[1] < key_length:
        # Any bottom-right corner of a larger bottom-right mask is the smaller mask, so grow to cover both the old
        # and the new shape, the keys geometrically: a chunked prefill (same rows, keys growing chunk by chunk)
        # rebuilds it log2(S / chunk) times instead of once per chunk.
        rows = max(query_length, cached.shape[0] if cached is not None else 0)
        columns = max(key_length, 2 * cached.shape[1] if cached is not None else key_length)
        # triu_ keeps -inf where j >= i + K - Q + 1 (masked) and writes 0 below (allowed).
        cached = torch.full((rows, columns), float("-inf"), dtype=dtype, device=device)
        cached = _ADDITIVE_MASKS[key] = cached.triu_(columns - rows + 1)
    # Rows Q-q.., columns K-S.. of a [Q, K] bottom-right mask: -inf where j >= i + S - q + 1, the [q, S] mask.
    return cached[cached.shape[0] - query_length :, cached.shape[1] - key_length :]


def dense_attention(
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
        # On CPU the additive form SDPA would convert the boolean mask into (identical output, less time).
        dtype = query.dtype if query.device.type == "cpu" else torch.bool
        mask = bottom_right_causal_mask(query_length, key_length, query.device, dtype)[None, None]
    groups = query.shape[1] // key.shape[1]
    # sdpa_attention_forward reads the GQA factor from the module; the stored head count may differ from the
    # model's (query-head granularity), so give it a view with the right factor.
    output, _ = sdpa_attention_forward(
        _GroupView(module, groups), query, key, value, mask, dropout=dropout, scaling=scaling, is_causal=True
    )
    return output


def ragged_attention(
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
