"""kvpress's decoding presses over any scorer (NVIDIA/kvpress 0.5.5; issues #43 item 8 and #54 item 1):
``method.params.decode_interval`` (``decode_target``, ``decode_ratio``).

``method=knorm method.params.decode_interval=4``: besides the prefill compression, every ``decode_interval`` forwards
after the prefill (each decoding step, and a question appended in one forward, counts one; per layer) the layer's
whole cache is scored by the method's scorer and each head cut back to its target, as kvpress's ``DecodingPress``
does it (``decoding_press.py``):

* **the target** is the head's decode cap (the budget: kvpress's ``target_size``), or ``decode_target`` when set;
  ``decode_ratio=r`` is ``CompressionRatioDecodingPress``: ``max(1, int(seen (1 - r)))``, ``seen`` the tokens the
  layer has seen (kvpress's ``max(position_ids) + 1``, the current forward's included).  A cache no longer than its
  target is left as it is (kvpress's ratio 0).  The kept count is kvpress's: the ratio its bisection finds, then
  ``max(1, int(length (1 - ratio)))``.  A forward of at least the target's length compresses at once (kvpress's
  ``q_len >= target_size``).  kvpress's ``DecodingPress`` alone keeps the prefill whole: spell it with a budget that
  keeps the prompt (``budget=<S>/layer``) and ``decode_target``; ``PrefillDecodingPress`` is the prefill budget plus
  ``decode_target`` (or the budget itself: one size for both).
* **the cache order**: kvpress's compression leaves the kept tokens in ``torch.topk``'s order (descending score, its
  own order among ties) and appends new tokens after them; a scorer that pools neighbours (SnapKV) or protects the
  first rows (Expected Attention's sinks) sees them in that order, and the model's attention sums over them in it
  (bfloat16 rounds by it).  The policy stores each head's tokens in kvpress's order
  (:attr:`~kvbench.eviction.base.DecodePolicy.keeps_selection_order`: a compression keeps its rows with
  ``layer.keep(..., ordered=True)`` in ``torch.topk``'s order; after a compressed prefill the layer is reordered once
  by the top-k order of kvpress's prefill scores, recomputed from the session's) and scores the cache in it.
* **the queries**: kvpress buffers the hidden states of the forwards since the last compression (up to 256
  forwards, ``hidden_states_buffer_size``) and scores with them.  A window scorer (SnapKV,
  :attr:`~kvbench.eviction.base.TokenScorer.window_scorer`) gets the last ``method.window`` buffered queries, rotated
  -- as kvpress's ``SnapKVPress`` does with the current forward's rotary tables -- at the current forward's last
  positions (one position for all of them after a single-token step), the causal mask of a ``window``-row window
  (kvpress's ``triu(k_len - window + 1)``), their mean, its pooling, and the cache's last ``window`` rows scored
  ``max + 1`` (they stay: the tokens since the last compression, then the tail of kvpress's previous top-k order).
  Fewer buffered rows than the window: kvpress's ``SnapKVPress`` asserts more;
  kvbench runs kvpress's steps on the rows there are (``UnassertedSnapKVPress`` in
  ``scripts/reference/record_kvpress_compositions.py``, recorded).  A scorer of pre-RoPE queries (Expected
  Attention) gets the buffered pre-RoPE queries, and kvpress's ``q_len`` (the future positions start) is the number
  of buffered rows.  The pre-RoPE queries are kvpress's: ``q_proj`` of each forward's hidden states, handed over by
  a forward pre-hook on the model path (:func:`kvbench.inference.hidden_states.capture_decode_queries`); without
  them (hand-built tensors; ``kvbench.press``, whose record refresh after each forward ends the hooks) the stored
  post-RoPE queries are un-rotated (float32 to ~1e-7, bfloat16 rounded differently).

Heads of unequal lengths (an Ada-KV prefill; kvpress's caches never are) are scored head by head on their own
tokens: no padding enters a softmax.  Parity: ``tests/methods/test_kvpress_decoding.py``,
``tests/parity/test_kvpress_claims.py`` (every compression step of kvpress's recorded decoding presses, float32 and
bfloat16), counts in ``docs/methods/kvpress-support.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from kvbench.eviction.base import DecodePolicy, DecodeState, TokenScorer, WindowObservation
from kvbench.eviction.prerope import rotate_half, unrotate
from kvbench.eviction.token_scores import aggregate_groups, round_to
from kvbench.kernels.reference import attention_logits, stats_of_probs

if TYPE_CHECKING:  # type hints only: importing the cache would import transformers
    from kvbench.cache.kv_cache import HeadwiseLayer

#: kvpress's ``hidden_states_buffer_size``: the forwards whose queries are buffered between two compressions.
BUFFER_FORWARDS = 256


@dataclass
class IntervalDecodeState(DecodeState):
    """One sample's :class:`IntervalDecodingPolicy` state, per layer: the forwards counted since its last compression,
    the buffered ``(queries [H_q, q, D], positions [q], pre-RoPE queries [H_q, q, D] or None)`` of those forwards
    (``pending``: the current forward's pre-RoPE queries, handed over before its attention), each head's positions in
    kvpress's cache order, and the prefill scores ``[H, S]`` until the layer's order is set from them."""

    steps: dict[int, int] = field(default_factory=dict)
    buffer: dict[int, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]] = field(default_factory=dict)
    pending: dict[int, torch.Tensor] = field(default_factory=dict)
    order: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    prefill_scores: dict[int, torch.Tensor] = field(default_factory=dict)


@dataclass
class BufferedQueries:
    """The buffered queries as the pre-RoPE states of a decoding compression (a
    :class:`~kvbench.eviction.prerope.PreRopeStates`): ``queries`` ``[H_q, n, D]`` in the model dtype; ``rows`` is
    kvpress's ``q_len`` (the number of buffered rows)."""

    pre_rope: torch.Tensor
    source: str = "unrotated"

    @property
    def rows(self) -> int:
        return int(self.pre_rope.shape[1])

    def queries(self, first: int = 0, last: int | None = None) -> torch.Tensor:
        return self.pre_rope[:, first:last]

    def keys(self, first: int = 0, last: int | None = None) -> torch.Tensor:
        raise ValueError("a decoding press's scorer reads the buffered queries, not pre-RoPE keys")


def kvpress_kept(length: int, target: int) -> int | None:
    """How many of ``length`` tokens kvpress's ``DecodingPress`` keeps for ``target``: the compression ratio its
    bisection (``_find_target_compression_ratio``, 20 steps) finds, then ``max(1, int(length (1 - ratio)))``;
    ``None`` when ``length <= target`` (ratio 0: the cache is left as it is)."""
    if length <= target:
        return None
    ratio, low, high = 1.0 - target / length, 0.0, 1.0
    for _ in range(20):
        kept = int(length * (1 - ratio))
        if kept == target:
            break
        if kept > target:
            low, ratio = ratio, (ratio + high) / 2
        else:
            high, ratio = ratio, (low + ratio) / 2
    return max(1, int(length * (1 - ratio)))


def slots_in_order(positions: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """The storage slots ``[n]`` of ``order``'s positions, given each slot's position ``positions`` ``[n]``."""
    by_position = torch.argsort(positions)
    return by_position[torch.searchsorted(positions[by_position], order.to(positions.device))]


class IntervalDecodingPolicy(DecodePolicy):
    """Every ``interval`` forwards per layer, each head cut to its target by ``scorer``'s scores of the whole cache,
    as kvpress's decoding presses do (module docstring).

    Per-sample state (:class:`IntervalDecodeState`, the session's; reset per layer by :meth:`start_layer`)."""

    evicts_on_append = True
    keeps_selection_order = True

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
        self.reads_prerope_queries = scorer.window_scorer or scorer.prompt_rows(torch.float32).prerope

    def caps(self, state: IntervalDecodeState, layer_idx: int, layer: HeadwiseLayer) -> list[int]:
        """Per head, the size a compression cuts to: ``ratio``'s share of the tokens seen, ``target``, or the cap."""
        if self.ratio:
            return [max(1, int(layer.seen_tokens * (1 - self.ratio)))] * layer.num_heads
        return [self.target] * layer.num_heads if self.target else state.layer_caps(layer_idx)

    def new_state(self) -> IntervalDecodeState:
        return IntervalDecodeState()

    def take_prefill_scores(self, state: DecodeState, layer_idx: int, scores: torch.Tensor) -> None:
        assert isinstance(state, IntervalDecodeState)
        state.prefill_scores[layer_idx] = scores

    def take_prerope_queries(self, state: DecodeState, layer_idx: int, queries: torch.Tensor) -> None:
        assert isinstance(state, IntervalDecodeState)
        state.pending[layer_idx] = queries

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
        state.steps[layer_idx], state.buffer[layer_idx] = 0, []
        order = self._prefill_order(state.prefill_scores.pop(layer_idx, None), layer)
        state.order[layer_idx] = order
        if not all(torch.equal(p, o.to(p.device)) for p, o in zip(layer.positions, order, strict=True)):
            layer.keep([slots_in_order(p, o) for p, o in zip(layer.positions, order, strict=True)], ordered=True)

    def _prefill_order(self, scores: torch.Tensor | None, layer: HeadwiseLayer) -> list[torch.Tensor]:
        """Each head's positions in kvpress's order after the prefill: position order when nothing was evicted,
        else the top-k order of kvpress's prefill scores (the window's padded ``max + 1``), or -- where kvbench kept
        another set (a tie, a window wider than the budget) -- its own kept tokens by those scores."""
        positions = [p.clone() for p in layer.positions]
        if scores is None or all(len(p) == scores.shape[1] for p in positions):
            return [p.sort().values for p in positions]
        padded = self._padded(scores, scores.shape[1], layer.padded_kv()[0].dtype)
        order = []
        for head, kept in enumerate(positions):
            top = padded[head].topk(len(kept)).indices.to(kept.device)
            if torch.equal(top.sort().values, kept.sort().values):
                order.append(top)
            else:
                ranks = torch.argsort(padded[head][kept.to(padded.device)], descending=True, stable=True)
                order.append(kept[ranks.to(kept.device)])
        return order

    def _padded(self, scores: torch.Tensor, length: int, dtype: torch.dtype) -> torch.Tensor:
        """``scores`` ``[H, L]`` with a window scorer's last ``window`` columns at kvpress's ``max + 1`` (the max of
        the candidates over every head, in ``dtype``); other scorers' scores unchanged."""
        window = min(self.window, length)
        if not self.scorer.window_scorer or window == 0:
            return scores
        padded = scores.clone()
        top = scores[:, : length - window].max() if length > window else scores.new_zeros(())
        padded[:, length - window :] = round_to(top.float() + 1, dtype)
        return padded

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
        """One forward's ``query`` ``[H_q, q, D]`` (its tokens already stored, the last ``q`` slots of every head):
        buffer it, append its positions to kvpress's order, compress when due."""
        assert isinstance(state, IntervalDecodeState)
        new = layer.positions[0][-query.shape[1] :]
        buffer = state.buffer.setdefault(layer_idx, [])
        buffer.append((query, new, state.pending.pop(layer_idx, None)))
        order = state.order.get(layer_idx) or [p.new_empty(0) for p in layer.positions]
        state.order[layer_idx] = [torch.cat([o, new.to(o.device)]) for o in order]
        state.steps[layer_idx] = state.steps.get(layer_idx, 0) + 1
        caps = self.caps(state, layer_idx, layer)
        if state.steps[layer_idx] < self.interval and query.shape[1] < min(caps):
            del buffer[:-BUFFER_FORWARDS]
            return
        self._compress(state, layer_idx, layer, caps, scaling)
        state.steps[layer_idx], state.buffer[layer_idx] = 0, []

    def _compress(
        self, state: IntervalDecodeState, layer_idx: int, layer: HeadwiseLayer, caps: list[int], scaling: float
    ) -> None:
        """Cut every head longer than its target to kvpress's count, by the scores of its cache in kvpress's order;
        heads of equal length are scored together (kvpress's one ``score()`` call), others head by head."""
        lengths = layer.head_lengths()
        counts = [kvpress_kept(length, cap) for length, cap in zip(lengths, caps, strict=True)]
        if all(count is None for count in counts):
            return
        order = state.order[layer_idx]
        slots = [slots_in_order(layer.positions[h], order[h]) for h in range(layer.num_heads)]
        keys, values, _ = layer.padded_kv()  # [H, S_max, D]; each head gathered at its own slots below
        buffered = state.buffer[layer_idx]
        queries = torch.cat([entry[0] for entry in buffered], dim=1)  # [H_q, n, D]
        rows = torch.cat([entry[1].to(queries.device) for entry in buffered])
        projected = [entry[2] for entry in buffered]
        pre_rope = torch.cat(projected, dim=1) if all(p is not None for p in projected) else None  # type: ignore[misc]
        groups: dict[int, list[int]] = {}
        for head, length in enumerate(lengths):
            groups.setdefault(length, []).append(head)
        if len(groups) > 1:  # ragged heads: each on its own tokens
            groups = {head: [head] for head in range(layer.num_heads)}
        keep = list(slots)  # a head left as it is keeps every token, in kvpress's order
        new_order = list(order)
        for heads in groups.values():
            index = torch.stack([slots[h] for h in heads]).to(keys.device)  # [h, L]
            head_keys = keys[heads].gather(1, index[..., None].expand(-1, -1, keys.shape[-1]))
            head_values = values[heads].gather(1, index[..., None].expand(-1, -1, values.shape[-1]))
            group = queries.shape[0] // layer.num_heads
            query_heads = [q for h in heads for q in range(h * group, (h + 1) * group)]
            pre = None if pre_rope is None else pre_rope[query_heads]
            scores = self._scores(state, layer_idx, queries[query_heads], pre, rows, head_keys, head_values, scaling)
            for row, head in enumerate(heads):
                if counts[head] is None:
                    continue
                top = scores[row].topk(counts[head]).indices
                new_order[head] = order[head][top.to(order[head].device)]
                keep[head] = slots[head][top.to(slots[head].device)]
        layer.keep(keep, ordered=True)
        state.order[layer_idx] = new_order

    def _scores(
        self,
        state: IntervalDecodeState,
        layer_idx: int,
        queries: torch.Tensor,
        pre_rope: torch.Tensor | None,
        rows: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        scaling: float,
    ) -> torch.Tensor:
        """``[h, L]`` float32 scores of keys ``[h, L, D]`` (kvpress's cache order) from the buffered ``queries``
        ``[g h, n, D]`` at positions ``rows`` ``[n]`` (their pre-RoPE ``q_proj`` when the session handed it over,
        else un-rotated), as kvpress's decoding press hands them to the scorer."""
        if pre_rope is None and self.reads_prerope_queries:
            pre_rope = self._unrotated(state, queries, rows)
        dtype, length = queries.dtype, keys.shape[1]
        scorer = self.scorer
        if scorer.window_scorer:
            window = min(self.window, length)
            current = state.buffer[layer_idx][-1][1].to(rows.device)
            assert pre_rope is not None
            recent = self._rerotated(state, pre_rope[:, -window:], current, window)
            filler = recent.new_zeros(recent.shape[0], window - recent.shape[1], recent.shape[2])
            observation = WindowObservation(layer_idx, 0, torch.cat([recent, filler], dim=1), keys, values, scaling)
            half = dtype if dtype not in (torch.float32, torch.float64) else None
            for prob_dtype in {None, half}:
                observation.use_window_stats(window_stats(recent, keys, scaling, window, half, prob_dtype), prob_dtype)
        elif scorer.prompt_rows(dtype).prerope:
            observation = WindowObservation(layer_idx, 0, queries, keys, values, scaling, rotary=state.rotary)
            assert pre_rope is not None
            observation.prerope = BufferedQueries(pre_rope)
        else:
            observation = WindowObservation(layer_idx, 0, queries, keys, values, scaling, rotary=state.rotary)
        scores = aggregate_groups(scorer.score(observation).float(), keys.shape[0], self.gqa_agg)
        return self._padded(scores, length, dtype)

    @staticmethod
    def _tables(state: IntervalDecodeState, positions: torch.Tensor, dtype: torch.dtype):
        if state.rotary is None:
            raise ValueError(
                "method.params.decode_interval over a scorer of queries needs the model's rotary tables (kvpress "
                "re-rotates the buffered queries); this model has no single rotary embedding"
            )
        return state.rotary(positions, dtype)

    def _unrotated(self, state: IntervalDecodeState, queries: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``[H_q, n, D]`` the buffered post-RoPE ``queries`` at positions ``rows`` un-rotated, in their dtype."""
        return unrotate(queries, *self._tables(state, rows, queries.dtype)).to(queries.dtype)

    def _rerotated(
        self, state: IntervalDecodeState, pre_rope: torch.Tensor, current: torch.Tensor, window: int
    ) -> torch.Tensor:
        """kvpress's ``SnapKVPress`` window queries in a decoding press: the last ``n <= window`` buffered pre-RoPE
        rows ``[H_q, n, D]`` rotated with the current forward's rotary tables of its last ``min(q, window)``
        positions (one position broadcast over every row after a single-token step), in the model dtype."""
        count, shown = pre_rope.shape[1], min(len(current), window)
        if shown == 1:
            target = current[-1:].expand(count)
        elif shown == count:
            target = current[-count:]
        else:
            raise ValueError(
                f"method.params.decode_interval over SnapKV: kvpress scores {count} buffered queries with the rotary "
                f"tables of the current forward's last {shown} positions, which do not broadcast (kvpress raises); "
                "kvbench does not reproduce a run kvpress cannot make (choose another decode_interval or window)"
            )
        cos, sin = self._tables(state, target, pre_rope.dtype)
        return pre_rope * cos + rotate_half(pre_rope) * sin


def window_stats(
    queries: torch.Tensor,
    keys: torch.Tensor,
    scaling: float,
    window: int,
    logit_dtype: torch.dtype | None,
    prob_dtype: torch.dtype | None,
):
    """The window statistics kvpress's ``SnapKVPress.compute_window_attention`` gives ``n <= window`` query rows
    ``[H_q, n, D]`` over keys ``[H, L, D]``: row ``i`` sees keys ``0 .. L - window + i`` (its ``triu`` mask of a
    ``window``-row window), float32 softmax of logits rounded to ``logit_dtype``, the mean over the ``n`` rows."""
    count = queries.shape[1]
    padded = torch.cat([queries, queries.new_zeros(queries.shape[0], window - count, queries.shape[2])], dim=1)
    logits = attention_logits(padded, keys, scaling, logit_dtype=logit_dtype)[:, :count]
    return stats_of_probs(torch.softmax(logits, dim=-1), prob_dtype=prob_dtype, logits=logits)
