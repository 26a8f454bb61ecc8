"""DMS (Łańcucki et al., 2025, arXiv 2506.05345) as NVIDIA/kvpress 0.5.5 ships it: ``DMSPress`` over any scorer,
evicting by a score threshold (issue #58).

Reproduces ``kvpress/presses/dms_press.py`` (kvpress's dense-prefill DMS, without the paper's trained evictors):

* prefill: the wrapped scorer scores every prompt token; the last ``sliding_window_size`` tokens are kept, and of the
  others every token scored below the threshold is evicted (``scores < threshold`` in the scores' dtype), per head:
  the kept count varies by head, layer and sample.  The threshold is the budget, ``budget=<t>thr``
  (:mod:`kvbench.eviction.threshold`); ``64L`` means nothing to DMS and is refused naming that form.
* ``decoding: true``: the tokens stored later (a question appended in question-agnostic mode, generated tokens) are
  scored as they arrive, by the wrapped scorer on their own keys (kvpress scores ``keys[:, :, -q_len:]``), and each
  token leaving the sliding window is evicted if its score is below the threshold
  (:class:`ThresholdDecodePolicy`); kvpress's pipeline then runs the press while generating too.

What differs from kvpress, by design: kvpress masks the evicted keys (their attention weight underflows to 0, the
cache keeps its size); kvbench removes them, so the stored bytes are what the run reports.  A wrapped scorer that
protects a window of its own (SnapKV: kvpress pads it with the scores' maximum) keeps that window here whatever the
threshold; kvpress keeps it unless the threshold exceeds every score of the layer.

``method=dms`` (``conf/method/dms.yaml``: KNorm, window 128); ``method.params.press`` picks the scorer, whose knobs
ride along.  Parity: ``tests/methods/test_dms.py`` (recordings ``DMSPress_*`` in ``tests/fixtures/reference/kvpress``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from kvbench.eviction.base import DecodePolicy, DecodeState, EvictionMethod, TokenScorer, WindowObservation
from kvbench.eviction.over_press import OverPress
from kvbench.eviction.params import bounded
from kvbench.eviction.threshold import ThresholdScorer
from kvbench.eviction.token_scores import aggregate_groups

if TYPE_CHECKING:  # type hints only: importing the cache would import transformers
    from kvbench.cache.kv_cache import HeadwiseLayer

REFERENCE = "NVIDIA/kvpress kvpress/presses/dms_press.py@0.5.5 (DMSPress)"


@dataclass
class ThresholdDecodeState(DecodeState):
    """Per layer, the scores ``[H, n]`` (float32) of the tokens in the sliding window, oldest first, and the dtype the
    scorer returns (the threshold is compared in it)."""

    window_scores: dict[int, torch.Tensor] = field(default_factory=dict)
    score_dtype: dict[int, torch.dtype] = field(default_factory=dict)


class ThresholdDecodePolicy(DecodePolicy):
    """DMS while decoding (module docstring): new tokens scored on arrival, evicted below the threshold when they
    leave the last ``window`` tokens."""

    evicts_on_append = True

    def __init__(self, scorer: TokenScorer, gqa_agg: str, window: int) -> None:
        self.scorer, self.gqa_agg, self.window = scorer, gqa_agg, window

    def new_state(self) -> ThresholdDecodeState:
        return ThresholdDecodeState()

    def start_layer(
        self,
        state: DecodeState,
        layer_idx: int,
        layer: HeadwiseLayer,
        head_budgets: list[int],
        scores: list[torch.Tensor] | None = None,
    ) -> None:
        """The window's scores are the prefill's of the last ``min(S, window)`` prompt tokens (kept on every head)."""
        assert isinstance(state, ThresholdDecodeState) and scores is not None
        super().start_layer(state, layer_idx, layer, head_budgets, scores)
        recent = min(layer.seen_tokens, self.window)
        state.window_scores[layer_idx] = torch.stack([head[len(head) - recent :] for head in scores])

    def step(
        self, state: DecodeState, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor, scaling: float
    ) -> None:
        self.append(state, layer_idx, layer, query, scaling)

    def append(
        self, state: DecodeState, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor, scaling: float
    ) -> None:
        """``query`` ``[H_q, q, D]``: score the ``q`` new tokens (the last ``q`` slots of every head), then evict the
        tokens leaving the window below the threshold."""
        assert isinstance(state, ThresholdDecodeState) and state.threshold is not None
        new = query.shape[1]
        heads = [layer.head_kv(head) for head in range(layer.num_heads)]
        keys = torch.stack([head_keys[-new:] for head_keys, _ in heads])
        values = torch.stack([head_values[-new:] for _, head_values in heads])
        raw = self.scorer.score(WindowObservation(layer_idx, 0, query, keys, values, scaling))
        state.score_dtype[layer_idx] = raw.dtype
        scores = aggregate_groups(raw.float(), layer.num_heads, self.gqa_agg)
        buffer = torch.cat([state.window_scores[layer_idx], scores], dim=1)
        leaving = buffer.shape[1] - self.window
        if leaving <= 0:
            state.window_scores[layer_idx] = buffer
            return
        state.window_scores[layer_idx] = buffer[:, leaving:]
        threshold = float(torch.tensor(state.threshold, dtype=raw.dtype))
        first = layer.seen_tokens - self.window - leaving  # the leaving tokens' positions: first .. first + leaving
        evicted = buffer[:, :leaving] < threshold  # [H, leaving]
        if not bool(evicted.any()):
            return
        keep = []
        for head, positions in enumerate(layer.positions):
            offsets = positions.long() - first
            leaving_here = (offsets >= 0) & (offsets < leaving)
            dropped = leaving_here & evicted[head].to(positions.device)[offsets.clamp(0, leaving - 1)]
            keep.append(torch.nonzero(~dropped).flatten())
        layer.keep(keep)


@dataclass(frozen=True)
class DMS(OverPress, family="dms"):
    """DMS's knobs (kvpress's ``DMSPress``); the threshold is the budget (``budget=<t>thr``)."""

    #: The most recent tokens never evicted (kvpress's ``sliding_window_size``).
    sliding_window_size: int = bounded(128, 0)
    #: Also evict while decoding (kvpress's ``decoding``): each token leaving the window, below the threshold.
    decoding: bool = False

    def build(self, method_cfg: Any) -> EvictionMethod:
        """The wrapped scorer under a threshold, with the sliding window protected (and the decode policy)."""
        inner = self.build_inner(method_cfg)
        assert inner.scorer is not None
        policy = ThresholdDecodePolicy(inner.scorer, inner.gqa_agg, self.sliding_window_size) if self.decoding else None
        return dataclasses.replace(
            inner,
            family=self.family,
            scorer=ThresholdScorer(inner.scorer, inner.window, self.sliding_window_size),
            decode_policy=policy,
            settings=self.settings_of(inner, REFERENCE),
        )
