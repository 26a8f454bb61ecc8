"""EntropyGatedChunkKV: ChunkKV's chunks gated by the entropy of their scores, as NVIDIA/kvpress 0.5.5 ships it
(``EntropyGatedChunkKVPress``, issue #58).

Reproduces ``kvpress/presses/entropy_gated_chunkkv_press.py`` over any scorer (``press``): the wrapped scores summed
over the KV heads (in the scorer's dtype, then float32) are cut into chunks of ``chunk_length`` tokens (the last one
shorter); a chunk's score is its mean, its entropy the normalised entropy of its token scores (rebased to be
non-negative).  Going through the chunks by decreasing score, each is kept whole, except one that is both important
(score at least the median) and spiky (entropy below the median), which keeps only its top
``low_entropy_chunk_length`` tokens; once the budget is spent the rest go, and a budget left over is topped up with
the best remaining tokens: exactly the budget is kept, the same tokens on every head.

The budget is the layer's (``<n>/layer``, or kvpress's ``<c>cr``: ``max(1, int(S (1 - c)))``); the wrapped scorer's
protected window (SnapKV's) is scored ``max + 1`` first, as kvpress pads it.  ``method=entropy_chunkkv``
(``conf/method/entropy_chunkkv.yaml``); ``method.params.press`` picks the scorer.  Parity:
``tests/methods/test_entropy_chunkkv.py`` (recordings ``EntropyGatedChunkKVPress_*``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from kvbench.eviction.base import EvictionMethod, PromptRows, TokenScorer, WindowObservation
from kvbench.eviction.over_press import OverPress
from kvbench.eviction.params import bounded
from kvbench.eviction.selection import SelectedCountAllocator, pad_protected
from kvbench.eviction.threshold import in_reference_dtype
from kvbench.eviction.token_scores import aggregate_groups

REFERENCE = "NVIDIA/kvpress kvpress/presses/entropy_gated_chunkkv_press.py@0.5.5 (EntropyGatedChunkKVPress)"
#: kvpress's epsilon.
EPSILON = 1e-8


def normalised_entropy(scores: torch.Tensor) -> torch.Tensor:
    """``[n, L]`` -> ``[n]``: each row's entropy of its (rebased, normalised) scores over ``log L``, in ``[0, 1]``."""
    rebased = scores - scores.amin(dim=1, keepdim=True).clamp(max=0.0)
    p = rebased / (rebased.sum(dim=1, keepdim=True) + EPSILON)
    return (-(p * (p + EPSILON).log()).sum(dim=1) / math.log(scores.shape[1])).clamp(0.0, 1.0)


def entropy_gated_chunks(scores: torch.Tensor, budget: int, chunk: int, spiky_keep: int) -> torch.Tensor:
    """``[S]`` bool: the tokens kept from the head-summed float32 ``scores`` ``[S]`` (module docstring)."""
    length = scores.shape[0]
    full, rest = divmod(length, chunk)
    bounds = [(index * chunk, min(index * chunk + chunk, length)) for index in range(math.ceil(length / chunk))]
    chunk_tokens = scores[: full * chunk].view(full, chunk)
    chunk_scores, entropy = chunk_tokens.mean(dim=1), normalised_entropy(chunk_tokens)
    if rest:
        tail = scores[full * chunk :]
        tail_entropy = torch.zeros(1, device=scores.device) if rest == 1 else normalised_entropy(tail[None])
        chunk_scores, entropy = torch.cat([chunk_scores, tail.mean()[None]]), torch.cat([entropy, tail_entropy])
    important = (chunk_scores >= chunk_scores.median()).tolist()
    spiky = (entropy < entropy.median()).tolist()
    keep = torch.zeros(length, dtype=torch.bool, device=scores.device)
    for index in torch.argsort(chunk_scores, descending=True).tolist():
        if budget <= 0:
            break
        start, end = bounds[index]
        count = min(end - start, budget)
        if important[index] and spiky[index]:
            count = min(count, spiky_keep)
        if count == end - start:
            keep[start:end] = True
        else:
            keep[torch.topk(scores[start:end], count).indices + start] = True
        budget -= count
    if budget > 0:
        leftover = (~keep).nonzero().squeeze(-1)
        if leftover.numel():
            keep[leftover[torch.topk(scores[leftover], min(budget, leftover.numel())).indices]] = True
    return keep


class EntropyGatedScorer(TokenScorer):
    """The wrapped scores on the kept tokens (every head alike), ``-inf`` elsewhere."""

    def __init__(self, inner: TokenScorer, gqa_agg: str, window: int, sinks: int, chunk: int, spiky_keep: int):
        self.inner, self.gqa_agg, self.window, self.sinks = inner, gqa_agg, window, sinks
        self.chunk, self.spiky_keep = chunk, spiky_keep

    def prompt_rows(self, model_dtype: torch.dtype) -> PromptRows:
        return self.inner.prompt_rows(model_dtype)

    def score(self, observation: WindowObservation) -> torch.Tensor:
        scores = aggregate_groups(self.inner.score(observation), observation.num_heads, self.gqa_agg)
        budget = observation.layer_budget
        if budget is None or budget >= observation.context_length:
            return scores
        padded = in_reference_dtype(self.inner, pad_protected(scores, self.window, self.sinks), observation)
        keep = entropy_gated_chunks(padded.sum(dim=0).float(), budget, self.chunk, self.spiky_keep)
        return torch.where(keep[None], scores.float(), float("-inf"))


@dataclass(frozen=True)
class EntropyGatedChunkKV(OverPress, family="entropy_chunkkv"):
    """EntropyGatedChunkKVPress's knobs (kvpress's names); the wrapped scorer (``press``) scores the tokens."""

    #: Tokens per chunk (kvpress's ``chunk_length``).
    chunk_length: int = bounded(10, 2)
    #: Tokens an important but spiky chunk keeps (kvpress's ``low_entropy_chunk_length``, below ``chunk_length``).
    low_entropy_chunk_length: int = bounded(4, 1)

    def build(self, method_cfg: Any) -> EvictionMethod:
        """The wrapped scorer's method with the gated chunk selection; the wrapper protects its window and sinks."""
        if self.low_entropy_chunk_length >= self.chunk_length:
            raise ValueError(
                f"method.params.low_entropy_chunk_length={self.low_entropy_chunk_length} must be below "
                f"chunk_length={self.chunk_length} (kvpress's EntropyGatedChunkKVPress)"
            )
        inner = self.build_inner(method_cfg)
        assert inner.scorer is not None
        scorer = EntropyGatedScorer(
            inner.scorer,
            inner.gqa_agg,
            inner.window if inner.keep_window else 0,
            inner.sink_tokens,
            self.chunk_length,
            self.low_entropy_chunk_length,
        )
        return dataclasses.replace(
            inner,
            family=self.family,
            scorer=scorer,
            head_allocator=SelectedCountAllocator(),
            keep_window=False,
            sink_tokens=0,
            settings=self.settings_of(inner, REFERENCE),
        )
