"""StreamingLLM (Xiao et al., 2023): attention sinks plus a recent window, in prefill and in decoding.

Every head keeps the first ``sink_tokens`` positions (4 in the paper) and the most recent ``budget - sinks``.
With ``params.decode_eviction`` the cache is cut back to that after every later forward, as mit-han-lab/streaming-llm's
``StartRecentKVCache.__call__`` does after each model call: a decoding step, and a multi-token forward after the
prefill (question-agnostic mode's question) at once.  ``params.evict_on_append: false`` is kvbench's earlier
behaviour: the appended tokens stay until the first decoding step, which cuts back to the cap at once.

``params.scores: kvpress`` (the ``streamingllm_kvpress`` preset) scores as NVIDIA/kvpress 0.5.5's
``StreamingLLMPress``: with ``k`` the layer budget, 1 for the first ``sink_tokens`` and for the tokens from
``sink_tokens + S - k`` on, 0 in between (:class:`KvpressSinkScorer`), and nothing else protected (no window), so a
budget of ``sink_tokens`` or fewer keeps sinks only, as kvpress (kvbench's default, ``recency``, also keeps the last
prompt token: the window of 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from kvbench.eviction.base import (
    DecodePolicy,
    DecodeState,
    EvictionMethod,
    TokenScorer,
    WindowObservation,
    common_knobs,
)
from kvbench.eviction.decoding import evict_lowest, evict_to_caps, one_token_evictions
from kvbench.eviction.family import FamilyMethod
from kvbench.eviction.params import choice

if TYPE_CHECKING:  # type hints only: importing the cache would import transformers
    from kvbench.cache.kv_cache import HeadwiseLayer

#: ``params.scores``: the paper's recency order, or kvpress's ``StreamingLLMPress`` scores.
SCORES = ("recency", "kvpress")


class RecencyScorer(TokenScorer):
    """Score = position: the most recent tokens win (sinks are protected by the session)."""

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """``[H, S]`` scores equal to the token position."""
        heads, context = observation.keys.shape[0], observation.context_length
        return torch.arange(context, dtype=torch.float32, device=observation.keys.device).expand(heads, context)


class KvpressSinkScorer(TokenScorer):
    """kvpress's ``StreamingLLMPress.score``: ``[H, S]`` ones, zero for the ``S - k`` tokens after the first
    ``n_sink`` (``k`` the layer budget, kvpress's ``int(S (1 - c))``; the zeros cut at ``S``)."""

    def __init__(self, n_sink: int) -> None:
        self.n_sink = n_sink

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """``[H, S]`` float32 scores (module docstring); every token scores 1 without a layer budget."""
        heads, context = observation.keys.shape[0], observation.context_length
        scores = torch.ones(heads, context, dtype=torch.float32, device=observation.keys.device)
        if observation.layer_budget is not None:
            pruned = context - int(observation.layer_budget)
            scores[:, self.n_sink : self.n_sink + max(pruned, 0)] = 0
        return scores


class SinkWindowDecode(DecodePolicy):
    """While decoding (and after an append, when ``evict_on_append``), keep each head at its cap: the sinks plus
    the most recent tokens."""

    #: Rows are independent (sinks and recency by each row's positions): a decode batch's pool steps in one call.
    steps_sample_rows = True

    def __init__(self, sink_tokens: int, evict_on_append: bool = True) -> None:
        self.sink_tokens = sink_tokens
        self.evicts_on_append = evict_on_append

    def step(
        self, state: DecodeState, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor, scaling: float
    ) -> None:
        """Evict the oldest non-sink token of each head over its cap, in place (one slot per head, vectorised);
        a head further over its cap (a lowered cap) keeps its sinks and most recent tokens by position."""
        caps = state.layer_caps(layer_idx)
        lengths = layer.head_lengths()
        heads = one_token_evictions(lengths, caps)
        if heads == []:
            return
        if heads is not None and all(caps[head] > self.sink_tokens for head in heads):
            positions = layer.padded_positions()  # [H, S_max]
            # The slot of the oldest token that is not a sink: the lowest rank once sinks rank +inf.
            ranked = positions.float().masked_fill(positions < self.sink_tokens, float("inf"))
            stored = None
            if layer.is_ragged:
                assert layer.lengths is not None
                stored = torch.arange(positions.shape[1], device=positions.device) < layer.lengths[:, None]
            evict_lowest(layer, heads, ranked, stored)
            return

        def sinks_and_recent(head: int, length: int, cap: int) -> torch.Tensor:
            positions = layer.positions[head].long()
            # Sinks first (earliest first, at most ``cap`` of them), then the most recent tokens.
            ranked = torch.where(positions < self.sink_tokens, 2 * layer.seen_tokens - positions, positions)
            return torch.topk(ranked, cap).indices

        evict_to_caps(layer, caps, sinks_and_recent)


@dataclass(frozen=True)
class StreamingLLM(FamilyMethod, family="streamingllm"):
    """StreamingLLM's hyper-parameters are ``params.sink_tokens`` and the budget; one switch (module docstring)."""

    #: No scores to reduce over a GQA group.
    unused_knobs: ClassVar[frozenset[str]] = frozenset({"gqa_agg"})

    #: Cut back to sinks + recent right after a multi-token append (the reference); false = kvbench's earlier
    #: behaviour (the first decoding step cuts back to the cap).
    evict_on_append: bool = True
    #: The prefill's scores: ``recency`` (the paper's code: sinks and the window protected, the most recent tokens
    #: next) or ``kvpress`` (kvpress's ``StreamingLLMPress``: 1 for the sinks and the last ``k - sinks``, nothing
    #: protected; module docstring).
    scores: str = choice("recency", SCORES)

    def build(self, method_cfg: Any) -> EvictionMethod:
        """Sinks + recent window; evicts in decoding too when ``method.params.decode_eviction``."""
        knobs = common_knobs(method_cfg, self)
        policy = SinkWindowDecode(knobs["sink_tokens"], self.evict_on_append) if self.decode_eviction else None
        kvpress = self.scores == "kvpress"
        settings: dict[str, Any] = {"evict_on_append": self.evict_on_append}
        if kvpress:  # recorded only when set: the settings of a run with the default stay as they were
            settings["scores"] = self.scores
        return EvictionMethod(
            scorer=KvpressSinkScorer(knobs["sink_tokens"]) if kvpress else RecencyScorer(),
            decode_policy=policy,
            settings=settings,
            # Position alone decides: no GQA reduction; the window sizes the protected recent tokens.
            ignored_knobs=frozenset({"gqa_agg"}),
            **{**knobs, "keep_window": not kvpress},  # kvpress protects nothing: its scores keep the sinks
        )
