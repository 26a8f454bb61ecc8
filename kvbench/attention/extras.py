"""Per-model attention details the plain SDPA path cannot express, honoured by kvbench's attention function.

Some models hand their attention function more than queries, keys, values and a scale:

* ``softcap`` (Gemma-2, VaultGemma): logits are soft-capped, ``tanh(logits / softcap) * softcap``, before the mask;
* ``s_aux`` (gpt-oss, GraniteSWA, MiMo-V2-Flash...): one learned *sink* logit per query head joins the softmax as an
  extra column and is dropped after it (the probabilities of the real keys then sum to less than one);
* ``sliding_window`` (see :mod:`kvbench.cache.sliding`): the mask of a multi-token chunk also hides keys more than
  ``window - 1`` positions back.

The scale (Gemma's ``query_pre_attn_scalar``, ...) already arrives as ``scaling``.  :func:`detailed_attention` is the
eager computation these models' own ``eager_attention_forward`` do (float32 softmax; with sinks, the max-subtracted
softmax in the logits' dtype as gpt-oss's), for one group of stored heads; :func:`ragged_detailed_attention` runs it
per stored head of a ragged layer.  Eviction scorers keep the references' convention: they score with plain scaled
dot-product attention, whatever the model's attention adds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kvbench.cache.base import RaggedKV


@dataclass(frozen=True)
class AttentionDetails:
    """The per-model extras of one attention call.

    Attributes
    ----------
    softcap:
        Logit soft-capping value, or ``None``.
    sinks:
        ``[H_q]`` learned sink logits (one per query head), or ``None``.
    window:
        Sliding window of the layer, or ``None`` (full attention).
    """

    softcap: float | None = None
    sinks: torch.Tensor | None = None
    window: int | None = None

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> AttentionDetails:
        """Read ``softcap``, ``s_aux`` (or ``sinks`` when it is one logit per head) and ``sliding_window``."""
        sinks = kwargs.get("s_aux")
        if sinks is None and isinstance(kwargs.get("sinks"), torch.Tensor) and kwargs["sinks"].dim() == 1:
            sinks = kwargs["sinks"]
        softcap = kwargs.get("softcap")
        window = kwargs.get("sliding_window")
        return cls(
            softcap=float(softcap) if softcap is not None else None,
            sinks=sinks,
            window=int(window) if window is not None else None,
        )

    @property
    def needs_eager(self) -> bool:
        """Whether logits must be materialised (soft-capping or sinks change the softmax itself)."""
        return self.softcap is not None or self.sinks is not None


def detailed_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float,
    mask: torch.Tensor | None,
    details: AttentionDetails,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Eager attention with soft-capping and sinks.

    Parameters
    ----------
    query:
        ``[1, H_q, q, D]``.
    key, value:
        ``[1, H, S, D]`` with ``H`` dividing ``H_q`` (each stored head serves ``H_q // H`` query heads).
    mask:
        ``[q, S]`` boolean, True where a query may attend a key; ``None``: every key.
    sinks:
        ``[H_q]`` sink logits of these query heads (``None``: ``details.sinks``).

    Returns
    -------
    ``[1, q, H_q, D]``.
    """
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    logits = torch.matmul(query, key.transpose(2, 3)) * scaling
    if details.softcap is not None:
        logits = torch.tanh(logits / details.softcap) * details.softcap
    if mask is not None:
        logits = logits.masked_fill(~mask, torch.finfo(logits.dtype).min)
    sinks = details.sinks if sinks is None else sinks
    if sinks is not None:
        sink_column = sinks.to(logits.dtype).reshape(1, -1, 1, 1).expand(1, -1, logits.shape[2], 1)
        combined = torch.cat([logits, sink_column], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values
        probs = torch.softmax(combined, dim=-1, dtype=combined.dtype)[..., :-1]
    else:
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    output = torch.matmul(probs.to(value.dtype), value)
    return output.transpose(1, 2).contiguous()


def ragged_detailed_attention(
    query: torch.Tensor,
    keys: RaggedKV,
    values: RaggedKV,
    scaling: float,
    details: AttentionDetails,
    causal_mask: Any,
) -> torch.Tensor:
    """:func:`detailed_attention` per stored head of a ragged layer (each with its GQA group of query heads).

    ``causal_mask(q, S, device)`` builds each head's ``[q, S]`` mask.  Returns ``[1, q, H_q, D]``.
    """
    query_length = query.shape[2]
    groups = query.shape[1] // keys.num_heads
    outputs = []
    for head, (head_k, head_v) in enumerate(zip(keys.heads, values.heads, strict=True)):
        rows = slice(head * groups, (head + 1) * groups)
        mask = causal_mask(query_length, head_k.shape[2], query.device) if query_length > 1 else None
        head_sinks = details.sinks[rows] if details.sinks is not None else None
        outputs.append(detailed_attention(query[:, rows], head_k, head_v, scaling, mask, details, head_sinks))
    return torch.cat(outputs, dim=2)


def attend_within_window_by_position(
    query: torch.Tensor,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    key_positions: list[torch.Tensor],
    query_positions: torch.Tensor,
    window: int,
    scaling: float | None,
    details: AttentionDetails,
) -> torch.Tensor:
    """Sliding-window attention over stored heads whose kept tokens need not be contiguous (an evicted sliding layer).

    Parameters
    ----------
    query:
        ``[1, H_q, q, D]``; stored head ``h`` serves query heads ``h*g .. h*g+g-1``.
    keys, values:
        Per stored head ``[1, 1, S_h, D]``.
    key_positions:
        Per stored head ``[S_h]`` true positions of the stored tokens.
    query_positions:
        ``[q]`` true positions of the queries.

    Returns
    -------
    ``[1, q, H_q, D]``: query at ``p`` attends the stored keys at ``p - window < k <= p``.
    """
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    groups = query.shape[1] // len(keys)
    outputs = []
    for head, (head_k, head_v, positions) in enumerate(zip(keys, values, key_positions, strict=True)):
        rows = slice(head * groups, (head + 1) * groups)
        k_pos = positions.to(query_positions.device, torch.long)[None, :]
        q_pos = query_positions[:, None]
        mask = (k_pos <= q_pos) & (k_pos > q_pos - window)
        head_sinks = details.sinks[rows] if details.sinks is not None else None
        outputs.append(detailed_attention(query[:, rows], head_k, head_v, scale, mask, details, head_sinks))
    return torch.cat(outputs, dim=2)
