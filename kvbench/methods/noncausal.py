"""Non-causal attention (kvpress's ``NonCausalAttnPress``, Compactor's attention part): the attention each key
receives from every prompt query of its chunk, both directions, weighted by the value norm.

Reproduces NVIDIA/kvpress ``kvpress/presses/non_causal_attention_press.py`` (``NonCausalAttnPress``, kvpress 0.5.5):

1. the context is cut into chunks of ``chunk_size`` tokens (the last one zero-padded); within a chunk every
   post-RoPE query attends to every key of the chunk, earlier and later ones: logits ``q . k`` in the model dtype,
   **unscaled** (no ``1/sqrt(D)``), softmax in float32; a key's attention is summed over the chunk's queries, then
   averaged over the KV head's GQA group (``[H_kv, S]``);
2. times the value's L2 norm, average-pooled over 3 neighbours (zero-padded edges count), then z-scored with the
   mean and standard deviation of **all heads together** (the reference comment says head-wise; the code is not).

Reference choice reproduced: in a padded last chunk, the padding keys' logits are set to ``-1e-9``, not ``-inf``,
so the zero-padded keys still draw softmax mass from the real queries of that chunk (their scores are then
dropped).  ``mask_padding: true`` (kvbench's switch) gives them ``-inf`` instead.  No token is protected; kvpress's
``compression_ratio`` c is the budget ``<max(1, int(S (1 - c)))>/layer``.  Reads every prompt query
(``O(H_q S D)`` per layer kept during prefill).  Parity: ``tests/methods/test_noncausal.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from kvbench.eviction.base import PromptRows, WindowObservation
from kvbench.eviction.params import bounded
from kvbench.eviction.recipe import ScorerMethod


def chunked_bidirectional_attention(
    queries: torch.Tensor, keys: torch.Tensor, chunk_size: int, mask_padding: bool = False
) -> torch.Tensor:
    """``[H, S]`` float32: per key, the softmax attention summed over the queries of its chunk (both directions).

    ``queries`` and ``keys`` are ``[H, S, D]`` (keys already repeated per query head); logits are unscaled.
    """
    heads, length, dim = keys.shape
    padded = math.ceil(length / chunk_size) * chunk_size
    pad = padded - length
    queries = F.pad(queries, (0, 0, 0, pad)).reshape(heads, -1, chunk_size, dim)
    keys = F.pad(keys, (0, 0, 0, pad)).reshape(heads, -1, chunk_size, dim)
    logits = queries @ keys.transpose(-2, -1)  # [H, chunks, C, C] in the inputs' dtype
    if pad:
        invalid = torch.arange(padded - chunk_size, padded, device=keys.device) >= length  # [C], last chunk
        last = logits[:, -1]
        last.masked_fill_(invalid[:, None], 0)
        last.masked_fill_(invalid[None, :], float("-inf") if mask_padding else -1e-9)
    attention = torch.softmax(logits.float(), dim=-1)
    return attention.sum(dim=-2).reshape(heads, padded)[:, :length]


def pooled_attention_scores(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, chunk_size: int, mask_padding: bool = False
) -> torch.Tensor:
    """``[H_kv, S]`` float32: the chunked non-causal attention of post-RoPE ``queries`` ``[H_q, S, D]`` on ``keys``
    ``[H_kv, S, D]``, averaged per GQA group, times the ``values``' norms, average-pooled over 3 tokens."""
    group = queries.shape[0] // keys.shape[0]
    attention = chunked_bidirectional_attention(queries, keys.repeat_interleave(group, dim=0), chunk_size, mask_padding)
    per_kv_head = attention.reshape(keys.shape[0], group, -1).mean(dim=1)
    return F.avg_pool1d(per_kv_head * values.norm(dim=-1), kernel_size=3, stride=1, padding=1)


def zscore_all_heads(scores: torch.Tensor) -> torch.Tensor:
    """``(x - mean) / max(std, 1e-6)`` with the mean and (unbiased) std of the whole ``[H, S]`` tensor."""
    return (scores - scores.mean()) / scores.std().clamp_min(1e-6)


@dataclass(frozen=True)
class NonCausalAttn(
    ScorerMethod, family="noncausal", reference="NVIDIA/kvpress kvpress/presses/non_causal_attention_press.py@0.5.5"
):
    """Chunked non-causal attention times value norms, pooled and z-scored (module docstring)."""

    #: Tokens per chunk (kvpress's default 256).
    chunk_size: int = bounded(256, 1)
    #: kvbench's switch: mask the padding keys of the last chunk with ``-inf`` (kvpress: ``-1e-9``).
    mask_padding: bool = False

    def prompt_rows(self, model_dtype: torch.dtype) -> PromptRows:
        """Every prompt query."""
        return PromptRows(queries=True)

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """``[H_kv, S]`` float32 z-scores."""
        queries, keys = observation.prompt_queries, observation.keys
        if queries is None or queries.shape[1] != keys.shape[1]:
            raise ValueError("noncausal needs every prompt query (TokenScorer.prompt_rows)")
        pooled = pooled_attention_scores(queries, keys, observation.values, self.chunk_size, self.mask_padding)
        return zscore_all_heads(pooled)
