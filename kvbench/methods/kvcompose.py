"""KVCompose (arXiv 2509.05165): attention-guided composite tokens with a budget shared over layers, as NVIDIA/kvpress
0.5.5 ships it (``KVComposePress``, and its unstructured variant ``structured=False``; issue #58).

Reproduces ``kvpress/presses/kvcompose_press.py``.  After the prefill the context is fed once more on top of itself
(one replay forward, :mod:`kvbench.inference.replay`), and each attention head's eager attention of those replayed
queries on the context is aggregated per context token (``agg_task``: max over the queries), then over each KV head's
GQA group (``agg_group``: mean), in float32; with ``add_mean_across_heads`` each head's scores get the layer's mean
over its heads added.  Each head's scores sorted (descending) are its *composite tokens*; per layer they are
aggregated over the heads (``agg_head``: mean), layer 0 takes the maximum over layers, and one top-k over every
layer's composite scores gives each layer its count (at least ``max(1, keep_token_lower_bound)``): with
``structured: true`` every head of a layer keeps that many tokens (its own best), with ``false`` the top-k runs over
every head's sorted scores and each head keeps its own count.  The budget is the total over layers: ``<c>cr`` keeps
``max(1, int(S (1 - c)))`` per layer on average (kvpress: ``int(L S (1 - c))`` over the layers, the same where
``S (1 - c)`` is whole); ``<n>/layer`` skips the allocation over layers.

kvpress's press forces transformers' ``eager`` attention for both of its forwards, the prefill and the replay; so do
kvbench's (``eager_attention``: :attr:`kvbench.inference.eviction.EvictionSession.eager_attention`, the logits in the
model dtype, a float32 softmax cast back, then the values), and only those (the question and decoding attend through
kvbench's SDPA path): in bfloat16 SDPA's layer outputs round otherwise, so the next layer's keys, queries and scores
would differ.  Hence kvcompose runs its own prefill in a sweep (``unshared_prefill``).

kvbench removes the evicted tokens and the replayed ones; kvpress's unstructured variant masks the evicted tokens and
leaves the replayed copy of the context in its cache.  ``method=kvcompose`` (a one-class method, structured);
``method.params.structured=false``.  Parity: ``tests/methods/test_kvcompose.py`` (recordings ``KVComposePress*``):
kvpress's scores bit for bit and its tokens on every head of every case, float32 and bfloat16.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from kvbench.eviction.base import WindowObservation
from kvbench.eviction.params import bounded, choice
from kvbench.eviction.recipe import ScorerMethod
from kvbench.eviction.wrappers import refuse_prefill_wrappers

AGGREGATIONS = ("max", "mean")


def aggregate(rows: list[torch.Tensor], how: str) -> torch.Tensor:
    """kvpress's ``MaxAggregator`` / ``MeanAggregator`` over ``rows`` (each ``[S]``), in float32, row by row."""
    if how == "max":
        result = torch.full_like(rows[0], float("-inf"), dtype=torch.float32)
        for row in rows:
            result = torch.maximum(result, row)
        return result
    total = torch.zeros_like(rows[0], dtype=torch.float32)
    for row in rows:
        total += row
    return total / len(rows)


@dataclass(frozen=True)
class KVCompose(ScorerMethod, family="kvcompose", reference="NVIDIA/kvpress kvpress/presses/kvcompose_press.py@0.5.5"):
    """Composite tokens over one replay of the context (module docstring)."""

    #: Every head of a layer keeps the same count (kvpress's default); ``false``: each head its own.
    structured: bool = True
    #: Over the replayed queries, per attention head: ``max`` or ``mean``.
    agg_task: str = choice("max", AGGREGATIONS)
    #: Over the attention heads of a GQA group.
    agg_group: str = choice("mean", AGGREGATIONS)
    #: Over a layer's KV heads, of their sorted scores (the composite tokens).
    agg_head: str = choice("mean", AGGREGATIONS)
    #: Add the layer's mean over its heads to each head's scores.
    add_mean_across_heads: bool = True
    #: Tokens every layer keeps at least.
    keep_token_lower_bound: int = bounded(0, 0)

    #: The session runs :meth:`replay_passes` after the prefill and compresses with :meth:`select`.
    replays_context: ClassVar[bool] = True
    #: The replay scores are kept in float32 (kvpress's aggregators).
    replay_score_dtype: ClassVar[torch.dtype] = torch.float32
    #: The prefill and the replay attend as transformers' eager attention (kvpress's press forces it for both).
    eager_attention: ClassVar[bool] = True
    #: Why a sweep's shared (SDPA) prefill cannot serve it.
    unshared_prefill: ClassVar[str | None] = "its prefill attends eagerly, as kvpress's KVComposePress forces"

    def __post_init__(self) -> None:
        refuse_prefill_wrappers(self, "kvcompose", "allocates itself")
        if self.decode_interval or self.keep_window:
            raise ValueError("kvcompose evicts once after the prefill: decode_interval and keep_window must stay off")

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """Not used: the scores come from the replay forward (:meth:`replay_scores`)."""
        raise NotImplementedError("kvcompose scores the prompt by a replay forward (kvbench.inference.replay)")

    def replay_passes(self, prompt_ids: list[int], tokenizer: Any) -> list[tuple[list[int], int, int]]:
        """One replay: the whole prompt again, scoring every prompt token."""
        return [(list(prompt_ids), 0, len(prompt_ids))]

    def replay_scores(self, queries: torch.Tensor, keys: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """``[H, end - start]`` float32 scores from the replay's queries ``[H_q, q, D]`` over the keys ``[H, S + q, D]``
        (eager attention: ``q k^T * D^-0.5``, the causal mask added, float32 softmax cast to the model dtype)."""
        heads_q, replay, dim = queries.shape
        heads, total = keys.shape[0], keys.shape[1]
        group, context = heads_q // heads, total - replay
        repeated = keys[:, None].expand(heads, group, total, dim).reshape(heads_q, total, dim)  # repeat_kv
        logits = torch.matmul(queries[None], repeated[None].transpose(2, 3)) * dim**-0.5  # [1, H_q, q, S + q]
        visible = (
            torch.arange(total, device=keys.device)[None] <= context + torch.arange(replay, device=keys.device)[:, None]
        )
        mask = torch.zeros(replay, total, dtype=logits.dtype, device=keys.device)
        logits = logits + mask.masked_fill(~visible, torch.finfo(logits.dtype).min)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32).to(queries.dtype)[0, :, :, :context]  # [H_q, q, S]
        if self.agg_task == "max":
            per_head = [probs[head].amax(dim=0).float() for head in range(heads_q)]
        else:
            per_head = [probs[head].sum(dim=0).float() / replay for head in range(heads_q)]
        grouped = [aggregate(per_head[h * group : (h + 1) * group], self.agg_group) for h in range(heads)]
        return torch.stack(grouped)[:, start:end]

    def select(
        self,
        scores: list[torch.Tensor],
        kept: int,
        per_layer: int | None,
        prefix: int = 0,
        layer_kept: int | None = None,
    ) -> list[list[torch.Tensor]]:
        """Per layer, per head, the kept token indices (sorted); ``kept`` the tokens kept over every layer and head,
        ``per_layer`` those of one layer over its heads (a ``<n>/layer`` budget), or ``None``; ``layer_kept`` (KVzip's
        per-layer count under ``<c>cr``) is not used: KVCompose selects over every layer."""
        stacked = torch.stack(scores).float()  # [L, H, S]
        layers, heads, length = stacked.shape
        if self.add_mean_across_heads:
            stacked = stacked + stacked.mean(dim=1, keepdim=True)
        floor = self.keep_token_lower_bound
        per_head = stacked.sort(dim=-1, descending=True)[0]
        per_head[..., :floor] += 1e9
        composite = torch.stack([aggregate(list(per_head[layer]), self.agg_head) for layer in range(layers)])
        composite[..., :floor] += 1e9
        composite[0] = composite.max(dim=0).values  # layer 0 keeps the most
        if per_layer is not None:
            counts = torch.full((layers, heads), min(per_layer // heads, length), dtype=torch.long)
        elif self.structured:
            top = composite.reshape(-1).topk(min(kept // heads, layers * length)).indices // length
            counts = torch.bincount(top, minlength=layers).clamp(min=max(1, floor))[:, None].expand(layers, heads)
        else:
            top = per_head.reshape(-1).topk(min(kept, layers * heads * length)).indices // length
            counts = torch.bincount(top, minlength=layers * heads).reshape(layers, heads)
        return [
            [torch.sort(torch.argsort(stacked[layer, head], descending=True)[: int(counts[layer, head])]).values
             for head in range(heads)]
            for layer in range(layers)
        ]  # fmt: skip
