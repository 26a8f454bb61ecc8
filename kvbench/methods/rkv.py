"""R-KV (Cai et al., 2025): redundancy-aware KV eviction while a reasoning model generates.

Reproduces Zefan-Cai/R-KV at d15c9767 (``rkv/compression/r1_kv.py`` ``R1KV.update_kv``, ``rkv/utils.py``
``compute_attention_scores`` and ``cal_similarity``, the step logic of ``rkv/modeling.py``, the defaults of
``run_math.py``): a layer's cache is compressed to the budget ``B`` (tokens per head: the layer's budget) whenever it
holds at least ``B`` tokens and the compression is due:

* at the prefill, always (the whole prompt);
* at a forward after it, when the tokens fed before that forward are a multiple of ``buffer`` (128, ``divide_length``,
  ``divide_method=step_length``): the cache grows by up to ``buffer`` generated tokens between two compressions.  A
  question appended in one forward (question-agnostic mode, which the reference does not have) is one such forward.

A compression keeps the last ``W = method.params.window`` (8) tokens of the cache and the top ``B - W`` of the others by

``Z = mix_lambda * maxpool_7(mean_w softmax(q_w k / sqrt(D))) - (1 - mix_lambda) * redundancy``

where ``q_w`` are the last ``W`` queries (kept across forwards), the logits are the max over a GQA group, the softmax
(float32, cast back to the model dtype) runs over the candidates only, and ``redundancy`` is the softmax over the cache
of each key's mean cosine similarity to the others after zeroing, per row, the most recent (``retain_direction:
last``) similarity above ``threshold`` (0.5) and the diagonal.  Every step runs in the model dtype, as the reference.

The reference's cache keeps its own order (the top-k in score order, then the window, then new tokens), and the
pooling runs over neighbours in that order: the decode state keeps that order per head (``RKVDecodeState.order``),
so kvbench scores exactly the sequence the reference scores while its storage stays in position order.

What differs (docs/methods/rkv.md): the reference's ``self.length`` counter is never reset between samples (the
compression steps of a sample depend on the samples before it); kvbench counts per sample.  Ties at the cut (bfloat16
scores) may resolve differently from ``torch.topk`` (kvbench ranks tied tokens by recency).  ``compression_content:
think`` (compress only inside the ``<think>`` part) and ``divide_method: newline`` are not implemented.
Parity: ``tests/methods/test_rkv.py`` (recordings: ``tests/fixtures/reference/rkv/``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F

from kvbench.eviction.base import (
    DecodePolicy,
    DecodeState,
    EvictionMethod,
    TokenScorer,
    WindowObservation,
    common_knobs,
)
from kvbench.eviction.family import FamilyMethod
from kvbench.eviction.params import bounded, choice

if TYPE_CHECKING:  # type hints only: importing the cache would import transformers
    from kvbench.cache.kv_cache import HeadwiseLayer

REFERENCE = "Zefan-Cai/R-KV@d15c9767e67c2bd9807128fecc35223fa2484a69 rkv/compression/r1_kv.py (R1KV), rkv/modeling.py"
RETAIN_DIRECTIONS = ("last", "first")
#: The knobs every piece of R-KV reads.
IGNORED_KNOBS = frozenset({"gqa_agg"})


@dataclasses.dataclass(frozen=True)
class RKV(FamilyMethod, family="rkv"):
    """R-KV's knobs (``method.params``); the observation window is ``method.params.window``."""

    #: R-KV's scores are per KV head (its code's layout).
    unused_knobs: ClassVar[frozenset[str]] = frozenset(IGNORED_KNOBS)

    #: Weight of the attention importance (``mix_lambda``; run_math.py's default 0.07, the README quotes 0.1).
    mix_lambda: float = bounded(0.07, 0.0, 1.0)
    #: Max-pooling kernel over the importance (R1KV's ``kernel_size``).
    pool_size: int = bounded(7, 1, odd=True)
    #: Cosine similarity above which two keys are near-duplicates (``cal_similarity``'s ``threshold``).
    threshold: float = bounded(0.5, -1.0, 1.0)
    #: Which near-duplicate each row spares: the most recent (``last``) or the reference's ``first`` reading.
    retain_direction: str = choice("last", RETAIN_DIRECTIONS)
    #: Generated tokens between two compressions (``divide_length``, the README's ``B_buffer``).
    buffer: int = bounded(128, 1)

    def build(self, method_cfg: Any) -> EvictionMethod:
        """R-KV: its score at the prefill (the window kept) and its decode-time policy."""
        knobs = common_knobs(method_cfg, self)
        return EvictionMethod(
            scorer=RKVScorer(self),
            decode_policy=RKVPolicy(self, knobs["window"]),
            settings={**dataclasses.asdict(self), "reference": REFERENCE},
            ignored_knobs=IGNORED_KNOBS,
            **knobs,
        )


def importance(queries: torch.Tensor, keys: torch.Tensor, window: int, pool_size: int) -> torch.Tensor:
    """``[H, L - window]`` attention importance of the candidates (every key but the last ``window``).

    ``queries`` ``[H_q, W', D]`` (the last ``W' <= window`` queries), ``keys`` ``[H, L, D]``, in the model dtype.
    """
    heads, dim = keys.shape[0], keys.shape[2]
    groups = queries.shape[0] // heads
    query, key = queries[None], keys[None]  # the reference's [1, heads, ...] layout
    if groups == 1:
        logits = torch.matmul(query, key.transpose(2, 3)) / math.sqrt(dim)
    else:
        grouped = query.view(1, heads, groups, queries.shape[1], dim)
        logits = (torch.matmul(grouped, key.unsqueeze(2).transpose(3, 4)) / math.sqrt(dim)).max(dim=2).values
    probs = torch.softmax(logits[:, :, -window:, :-window], dim=-1, dtype=torch.float32).mean(dim=-2)
    pooled = F.max_pool1d(probs.to(queries.dtype), kernel_size=pool_size, padding=pool_size // 2, stride=1)
    return pooled[0]


def redundancy(keys: torch.Tensor, threshold: float, retain_direction: str) -> torch.Tensor:
    """``[H, L]`` redundancy of each key: softmax over the cache of its mean cosine similarity to the others, each
    row's spared near-duplicate (and the diagonal) zeroed first.  ``keys`` ``[H, L, D]`` in the model dtype."""
    length = keys.shape[1]
    unit = keys / (keys.norm(dim=-1, keepdim=True) + 1e-8)
    similarity = torch.matmul(unit, unit.transpose(-1, -2))  # [H, L, L]
    similarity.diagonal(dim1=-2, dim2=-1).zero_()
    slots = torch.arange(length, device=keys.device)
    candidates = torch.where(similarity > threshold, slots, torch.zeros((), dtype=torch.long, device=keys.device))
    # "last": the most recent near-duplicate (0 when none); "first": the reference's min, which is 0 whenever some
    # key is not a near-duplicate (kept as the reference computes it).
    spared = candidates.max(dim=-1).values if retain_direction == "last" else candidates.min(dim=-1).values
    similarity.scatter_(-1, spared[..., None], 0.0)
    return similarity.mean(dim=1).softmax(dim=-1)


def rkv_scores(queries: torch.Tensor, keys: torch.Tensor, window: int, params: RKV) -> torch.Tensor:
    """``[H, L - window]`` R-KV's final score of the candidates (higher = keep), in the model dtype; ``keys`` in the
    reference's cache order."""
    attention = importance(queries, keys, window, params.pool_size)
    similar = redundancy(keys, params.threshold, params.retain_direction)[:, :-window]
    return attention * params.mix_lambda - similar * (1 - params.mix_lambda)


@dataclasses.dataclass(frozen=True)
class RKVScorer(TokenScorer):
    """The prefill compression: :func:`rkv_scores` of the prompt (the window's scores are ``+inf``; the session
    keeps the window anyway).

    When the layer's budget ``B`` is known (every allocator but a cascading one), the scores returned are the
    reference's ``torch.topk(Z, B - W)`` ranks (``B - W`` for its first pick down to 1, -1 for the others): the session
    then keeps exactly the reference's tokens, ties included, and the decode policy reads the reference cache's order
    from them (:meth:`RKVPolicy.start_layer`)."""

    params: RKV

    def score(self, observation: WindowObservation) -> torch.Tensor:
        keys, window = observation.keys, observation.window
        heads, length = keys.shape[0], keys.shape[1]
        scores = torch.full((heads, length), torch.inf, dtype=torch.float32, device=keys.device)
        if length <= window:
            return scores
        budget = observation.layer_budget
        if budget is not None and budget <= window < length:
            raise ValueError(f"R-KV needs a budget above method.params.window={window}, got {budget} tokens per head")
        final = rkv_scores(observation.queries, keys, window, self.params)
        if budget is None or not window < budget <= length:
            scores[:, : length - window] = final.float()
            return scores
        picks = budget - window
        top = final.topk(picks, dim=-1).indices  # [H, B - W], the reference's picks in its order
        ranks = torch.arange(picks, 0, -1, dtype=torch.float32, device=keys.device).expand(heads, -1)
        scores[:, : length - window] = torch.full_like(final, -1.0, dtype=torch.float32).scatter(1, top, ranks)
        return scores


@dataclasses.dataclass
class RKVDecodeState(DecodeState):
    """One sample's R-KV state per layer: the last ``W`` queries ``[H_q, <=W, D]`` and ``order`` ``[H, L]``, the
    stored slots in the reference cache's order."""

    queries: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)
    order: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)


class RKVPolicy(DecodePolicy):
    """The compression after the prefill (module docstring): every ``buffer`` tokens fed, back to the budget."""

    evicts_on_append = True

    def __init__(self, params: RKV, window: int) -> None:
        self.params, self.window = params, window
        #: The last prompt queries the session hands over (:meth:`take_prompt_queries`).
        self.prompt_window = window

    def new_state(self) -> RKVDecodeState:
        return RKVDecodeState()

    def take_prompt_queries(self, state: DecodeState, layer_idx: int, queries: torch.Tensor) -> None:
        """The last ``window`` prompt queries ``[H_q, <=W, D]`` (the reference's query cache after the prefill)."""
        assert isinstance(state, RKVDecodeState)
        state.queries[layer_idx] = queries

    def start_layer(
        self,
        state: DecodeState,
        layer_idx: int,
        layer: HeadwiseLayer,
        head_budgets: list[int],
        scores: list[torch.Tensor] | None = None,
    ) -> None:
        """The reference's cache order after the prefill: the kept candidates by decreasing score (``topk``'s
        order), then the window by position."""
        assert isinstance(state, RKVDecodeState)
        super().start_layer(state, layer_idx, layer, head_budgets, scores)
        orders = []
        for head, positions in enumerate(layer.positions):
            slots = torch.arange(positions.shape[0], device=positions.device)
            window = positions >= layer.seen_tokens - self.window
            if scores is None or positions.shape[0] < head_budgets[head]:  # below the budget: not compressed
                orders.append(slots)
                continue
            candidates = slots[~window]
            ranked = torch.argsort(scores[head][~window], descending=True, stable=True)
            orders.append(torch.cat([candidates[ranked], slots[window]]))
        state.order[layer_idx] = torch.stack(orders)

    def step(
        self, state: DecodeState, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor, scaling: float
    ) -> None:
        self._forward(state, layer_idx, layer, query)

    def append(
        self, state: DecodeState, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor, scaling: float
    ) -> None:
        self._forward(state, layer_idx, layer, query)

    def _forward(self, state: DecodeState, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor) -> None:
        """One forward's ``query`` ``[H_q, q, D]`` (its tokens already stored): keep the last ``W`` queries, extend
        the order, compress when due."""
        assert isinstance(state, RKVDecodeState)
        new = query.shape[1]
        seen = state.queries.get(layer_idx)
        state.queries[layer_idx] = (query if seen is None else torch.cat([seen, query], dim=1))[:, -self.window :]
        order = state.order[layer_idx]
        appended = torch.arange(order.shape[1], order.shape[1] + new, device=order.device)
        order = torch.cat([order, appended.expand(order.shape[0], -1)], dim=1)
        state.order[layer_idx] = order
        lengths = layer.head_lengths()
        if len(set(lengths)) != 1 or lengths[0] != order.shape[1]:
            raise ValueError(f"R-KV keeps the same number of tokens per head; layer {layer_idx} holds {lengths}")
        cap = int(state.caps[layer_idx].max())
        if (layer.seen_tokens - new) % self.params.buffer != 0 or lengths[0] < cap:
            return
        if cap <= self.window:
            raise ValueError(f"R-KV needs a budget above method.params.window={self.window}, got {cap} tokens per head")
        keys, _ = layer.dense_kv()  # [H, L, D], slots in position order
        in_order = keys.gather(1, order[..., None].expand(-1, -1, keys.shape[-1]))
        scores = rkv_scores(state.queries[layer_idx], in_order, self.window, self.params)
        top = scores.topk(cap - self.window, dim=-1).indices
        kept = torch.cat([order.gather(1, top), order[:, -self.window :]], dim=1)  # the reference's new cache order
        layer.keep(kept)
        state.order[layer_idx] = torch.argsort(torch.argsort(kept, dim=1), dim=1)  # the same order, new slots
