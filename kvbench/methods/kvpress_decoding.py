"""kvpress's ``DecodingPress`` over any scorer (NVIDIA/kvpress 0.5.5; issue #43 item 8): ``decode_interval``.

``method=knorm method.params.decode_interval=4``: besides the prefill compression, every ``decode_interval`` forwards
after the prefill (each decoding step, and a question appended in one forward, counts one; per layer) the layer's
whole cache is scored by the method's scorer and each head cut back to its decode cap (the budget: kvpress's
``target_size``), keeping the top of the scores (``torch.topk``).  Between two compressions the cache grows by up to
``decode_interval - 1`` tokens, as kvpress's.  The scorer sees the stored keys and values and the last
``method.params.window`` queries seen since the previous compression (kvpress buffers the hidden states of those steps).

The target is the head's decode cap (the budget), or ``method.params.decode_target`` when set: kvpress's
``target_size`` apart from the prefill's budget.  kvpress's ``DecodingPress`` alone leaves the prefill whole: spell it
with a budget that keeps the prompt (``budget=<S>/layer``) and ``decode_target``; ``PrefillDecodingPress`` is the
prefill budget plus ``decode_target``.  A budget smaller than the prompt without ``decode_target`` compresses the
prefill to the budget and decodes at the same size (kvpress's ``PrefillDecodingPress`` with one size for both).
``method.params.decode_ratio=r`` is kvpress's ``CompressionRatioDecodingPress``: each compression cuts to
``max(1, int(seen (1 - r)))`` tokens per head, ``seen`` the tokens the layer has seen so far (kvpress's
``max(position_ids) + 1``, the current forward's included); with ``budget=<S>/layer`` the prefill stays whole as
kvpress's.
The decode compressions rank by the scorer itself (not by a ``selection`` or ``rescale`` wrapper).
Parity: ``tests/methods/test_kvpress_decoding.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from kvbench.methods.base import DecodePolicy, DecodeState, TokenScorer, WindowObservation
from kvbench.methods.decoding import evict_to_caps
from kvbench.methods.token_scores import aggregate_groups

if TYPE_CHECKING:  # type hints only: importing the cache would import transformers
    from kvbench.cache.kv_cache import HeadwiseLayer


@dataclass
class IntervalDecodeState(DecodeState):
    """One sample's :class:`IntervalDecodingPolicy` state: besides the caps, per layer the forwards counted since its
    last compression and the last ``window`` queries ``[H_q, <=W, D]`` of those forwards (``None``: none yet)."""

    steps: dict[int, int] = field(default_factory=dict)
    queries: dict[int, torch.Tensor | None] = field(default_factory=dict)


class IntervalDecodingPolicy(DecodePolicy):
    """Every ``interval`` forwards per layer, each head cut to its cap (``target`` when set) by ``scorer``'s scores
    of the whole cache.

    Per-sample state (:class:`IntervalDecodeState`, the session's; reset per layer by :meth:`start_layer`): the
    forwards counted since the layer's last compression, its caps and the queries of those forwards."""

    evicts_on_append = True

    def __init__(
        self,
        scorer: TokenScorer,
        interval: int,
        gqa_agg: str = "mean",
        window: int = 32,
        target: int = 0,
        ratio: float = 0.0,
    ) -> None:
        if not 0.0 <= ratio < 1.0:
            raise ValueError(f"method.params.decode_ratio={ratio}: a compression ratio in [0, 1) (0: off)")
        if ratio and target:
            raise ValueError(
                f"method.params.decode_ratio={ratio} and decode_target={target}: the target is either a size or a "
                "ratio of the tokens seen; set one of them"
            )
        self.scorer, self.interval, self.gqa_agg, self.window, self.target = scorer, interval, gqa_agg, window, target
        self.ratio = ratio

    def caps(self, state: IntervalDecodeState, layer_idx: int, layer: HeadwiseLayer) -> list[int]:
        """Per head, the size a compression cuts to: ``ratio``'s share of the tokens seen, ``target``, or the cap."""
        if self.ratio:
            return [max(1, int(layer.seen_tokens * (1 - self.ratio)))] * layer.num_heads
        return [self.target] * layer.num_heads if self.target else state.layer_caps(layer_idx)

    def new_state(self) -> IntervalDecodeState:
        return IntervalDecodeState()

    def start_layer(
        self,
        state: DecodeState,
        layer_idx: int,
        layer: HeadwiseLayer,
        head_budgets: list[int],
        scores: list[torch.Tensor] | None = None,
    ) -> None:
        assert isinstance(state, IntervalDecodeState)
        super().start_layer(state, layer_idx, layer, head_budgets, scores)
        state.steps[layer_idx], state.queries[layer_idx] = 0, None

    def step(
        self, state: DecodeState, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor, scaling: float
    ) -> None:
        self._forward(state, layer_idx, layer, query, scaling)

    def append(
        self, state: DecodeState, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor, scaling: float
    ) -> None:
        self._forward(state, layer_idx, layer, query, scaling)

    def _forward(
        self, state: DecodeState, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor, scaling: float
    ) -> None:
        """One forward's ``query`` ``[H_q, q, D]`` (its tokens already stored): count it, compress when due."""
        assert isinstance(state, IntervalDecodeState)
        seen = state.queries.get(layer_idx)
        recent = query if seen is None else torch.cat([seen, query], dim=1)
        state.queries[layer_idx] = recent[:, -self.window :]
        state.steps[layer_idx] = state.steps.get(layer_idx, 0) + 1
        if state.steps[layer_idx] < self.interval:
            return
        state.steps[layer_idx], state.queries[layer_idx] = 0, None
        caps = self.caps(state, layer_idx, layer)
        keys, values, _ = layer.padded_kv()  # [H, S_max, D]; slots past a head's length are stale
        observation = WindowObservation(layer_idx, 0, recent, keys, values, scaling)
        scores = aggregate_groups(self.scorer.score(observation).float(), layer.num_heads, self.gqa_agg)
        evict_to_caps(layer, caps, lambda head, length, cap: scores[head, :length].topk(cap).indices)
