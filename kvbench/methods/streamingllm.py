"""StreamingLLM (Xiao et al., 2023): attention sinks plus a recent window, in prefill and in decoding.

Every head keeps the first ``sink_tokens`` positions (4 in the paper) and the most recent ``budget - sinks``.
With ``method.decode_eviction`` the cache is cut back to that after every later forward, as mit-han-lab/streaming-llm's
``StartRecentKVCache.__call__`` does after each model call: a decoding step, and a multi-token forward after the
prefill (question-agnostic mode's question) at once.  ``params.evict_on_append: false`` is kvbench's earlier
behaviour: the appended tokens stay and decoding cuts back one token per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from kvbench.methods.base import (
    DecodePolicy,
    EvictionMethod,
    TokenScorer,
    WindowObservation,
    common_knobs,
    evict_to_caps,
    register_method,
)
from kvbench.methods.params import parse_params

if TYPE_CHECKING:  # type hints only: importing the cache would import transformers
    from kvbench.cache import HeadwiseLayer


class RecencyScorer(TokenScorer):
    """Score = position: the most recent tokens win (sinks are protected by the session)."""

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """``[H, S]`` scores equal to the token position."""
        heads, context = observation.keys.shape[0], observation.context_length
        return torch.arange(context, dtype=torch.float32, device=observation.keys.device).expand(heads, context)


class SinkWindowDecode(DecodePolicy):
    """While decoding (and after an append, when ``evict_on_append``), keep each head at its cap: the sinks plus
    the most recent tokens."""

    def __init__(self, sink_tokens: int, evict_on_append: bool = True) -> None:
        self.sink_tokens = sink_tokens
        self.evicts_on_append = evict_on_append
        self.caps: dict[int, list[int]] = {}

    def start_layer(
        self, layer_idx: int, layer: HeadwiseLayer, head_budgets: list[int], scores: list[torch.Tensor] | None = None
    ) -> None:
        self.caps[layer_idx] = list(head_budgets)

    def step(self, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor, scaling: float) -> None:
        def sinks_and_recent(head: int, length: int, cap: int) -> torch.Tensor:
            positions = layer.positions[head]
            sinks = torch.nonzero(positions < self.sink_tokens).flatten()[:cap]
            recent = torch.arange(length - (cap - sinks.numel()), length, device=positions.device)
            return torch.unique(torch.cat([sinks, recent]))

        evict_to_caps(layer, self.caps[layer_idx], sinks_and_recent)


@dataclass
class StreamingParams:
    """StreamingLLM's hyper-parameters are ``method.sink_tokens`` and the budget; one switch (module docstring)."""

    #: Cut back to sinks + recent right after a multi-token append (the reference); false = kvbench's earlier
    #: behaviour (decoding cuts back one token per step).
    evict_on_append: bool = True


@register_method("streamingllm")
def build_streamingllm(method_cfg: Any) -> EvictionMethod:
    """Sinks + recent window; evicts in decoding too when ``method.decode_eviction``."""
    params = parse_params(StreamingParams, method_cfg.params, "streamingllm")
    knobs = common_knobs(method_cfg)
    policy = SinkWindowDecode(knobs["sink_tokens"], params.evict_on_append) if method_cfg.decode_eviction else None
    return EvictionMethod(
        scorer=RecencyScorer(),
        decode_policy=policy,
        settings={"evict_on_append": params.evict_on_append},
        # Position alone decides: no attention score, pooling or GQA reduction (the window is the recency itself).
        ignored_knobs=frozenset(
            {"window", "kernel_size", "pooling", "pool_padding", "gqa_agg", "gqa_reduce", "score_dtype"}
        ),
        **knobs,
    )
