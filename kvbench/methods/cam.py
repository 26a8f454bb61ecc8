"""CaM (Zhang et al., 2024, "CaM: Cache Merging for Memory-efficient LLMs Inference") as NVIDIA/kvpress 0.5.5 ships
it: ``CAMPress``, evicted values merged into their kept neighbours while decoding (issue #58).

Reproduces ``kvpress/presses/cam_press.py`` (a ``DecodingPress``), per layer, after every forward that follows the
prefill (a question appended in question-agnostic mode counts one, as each decoding step):

* the last query's attention over the whole cache (``softmax(q K^T / sqrt(D))`` in float32, cast to the model dtype,
  averaged over each GQA group) is added to a running sum per stored token (new tokens start at 0);
* every ``compression_interval`` forwards, once the cache holds more than ``target_size`` tokens, the wrapped scorer
  (``press``) scores the cache, **averaged over the heads**: every head keeps the same ``target_size`` tokens (its
  top-k) and of the evicted ones the ``k`` best scored (``k`` the forwards since the last compression; equal scores:
  the later token) are merge candidates;
* a candidate's merge window is the ``merge_budget`` kept tokens after it; it merges with probability
  ``clamp(A_i / mean(A_window), 0, 1)`` (``A`` the running sums; a Bernoulli draw from torch's global generator, as
  kvpress), adding ``v_i / |window|`` to each window token's value (in the cache's dtype); then the cache keeps the
  ``target_size`` tokens, values merged, and the running sums follow.

The cache holds values no token produced (:meth:`kvbench.cache.base.LogicalLengthLayer.rewrite_values`).  kvpress's
CAMPress leaves the prefill whole: spell it with a budget that keeps the prompt (``budget=<S>/layer``); a smaller
budget compresses the prefill first by the wrapped scorer (kvpress's ``PrefillDecodingPress`` of the two).
``method=cam`` (``conf/method/cam.yaml``); ``method.params.press`` picks the scorer; ``method.params.seed`` (kvbench's
switch, off: kvpress's global generator) gives each sample its own generator, so that batched decoding draws as
batch 1 does.  Parity:
``tests/methods/test_cam.py`` (recording ``CAMPress_KnormPress``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from kvbench.eviction.base import DecodePolicy, DecodeState, EvictionMethod, TokenScorer, WindowObservation
from kvbench.eviction.over_press import OverPress
from kvbench.eviction.params import bounded
from kvbench.eviction.token_scores import aggregate_groups

if TYPE_CHECKING:  # type hints only: importing the cache would import transformers
    from kvbench.cache.kv_cache import HeadwiseLayer

REFERENCE = "NVIDIA/kvpress kvpress/presses/cam_press.py@0.5.5 (CAMPress)"


@dataclass
class CamDecodeState(DecodeState):
    """Per layer: forwards since the last compression, the running attention sums ``[H, S]`` (model dtype), the last
    ``window`` queries of those forwards (what the scorer sees)."""

    steps: dict[int, int] = field(default_factory=dict)
    attention: dict[int, torch.Tensor] = field(default_factory=dict)
    queries: dict[int, torch.Tensor] = field(default_factory=dict)
    #: The sample's own generator of the Bernoulli draws (``seed`` set), created at the first draw.
    generator: torch.Generator | None = None


def last_query_attention(query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """``[H, S]`` the last query's attention per stored head as kvpress's ``_compute_current_token_attention`` and
    ``_aggregate_attention_per_kv_head``: ``softmax(q K^T / sqrt(D))`` in float32, cast to the model dtype, mean over
    each GQA group.  ``query`` ``[H_q, q, D]``, ``keys`` ``[H, S, D]``."""
    heads, length, dim = keys.shape
    group = query.shape[0] // heads
    repeated = keys[:, None].expand(heads, group, length, dim).reshape(heads * group, length, dim)  # repeat_kv
    logits = torch.matmul(query[:, -1:], repeated.transpose(-2, -1)) / math.sqrt(dim)  # [H_q, 1, S]
    probabilities = torch.softmax(logits, dim=-1, dtype=torch.float32).to(query.dtype)
    return probabilities.view(heads, group, length).mean(dim=1)


def cam_merge(
    values: torch.Tensor,
    attention: torch.Tensor,
    kept: torch.Tensor,
    merged: torch.Tensor,
    merge_budget: int,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``values`` ``[H, S, D]`` with the candidates ``merged`` ``[m]`` (ascending) merged into the windows of the kept
    tokens ``kept`` ``[n]`` (ascending) after them, each with a Bernoulli draw (module docstring); a new tensor."""
    heads, dim, size = values.shape[0], values.shape[-1], kept.numel()
    starts = torch.searchsorted(kept, merged, right=True)  # [m]: the first kept token after each candidate
    window = starts[:, None] + torch.arange(merge_budget, device=kept.device)  # [m, b]
    valid = window < size
    targets = kept[window.clamp(max=size - 1)]  # [m, b] positions
    budget = valid.sum(dim=-1)  # [m]
    window_attention = attention[:, targets.flatten()].view(heads, -1, merge_budget) * valid
    mean_attention = window_attention.sum(dim=-1) / budget.clamp(min=1)
    probability = attention[:, merged] / mean_attention
    probability = torch.where(torch.isnan(probability), torch.zeros_like(probability), probability)
    probability = torch.where(torch.isinf(probability), torch.ones_like(probability), probability).clamp(0, 1)
    draws = torch.bernoulli(probability, generator=generator)  # [H, m]: torch's global generator (kvpress) or one
    scale = (draws / budget)[..., None]
    scale = torch.where(budget[None, :, None] == 0, torch.zeros_like(scale), scale)
    contributions = (values[:, merged] * scale)[:, :, None].expand(-1, -1, merge_budget, -1) * valid[None, ..., None]
    index = targets.flatten()[None, :, None].expand(heads, -1, dim)
    return values.clone().scatter_add_(1, index, contributions.reshape(heads, -1, dim))


class CamDecodingPolicy(DecodePolicy):
    """CaM while decoding (module docstring)."""

    evicts_on_append = True

    def __init__(
        self, scorer: TokenScorer, gqa_agg: str, window: int, interval: int, target: int, budget: int, seed: int | None
    ):
        self.scorer, self.gqa_agg, self.window = scorer, gqa_agg, window
        self.interval, self.target, self.merge_budget, self.seed = interval, target, budget, seed

    def new_state(self) -> CamDecodeState:
        return CamDecodeState()

    def step(
        self, state: DecodeState, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor, scaling: float
    ) -> None:
        self.append(state, layer_idx, layer, query, scaling)

    def append(
        self, state: DecodeState, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor, scaling: float
    ) -> None:
        """One forward's ``query`` ``[H_q, q, D]`` (its tokens stored): accumulate, compress when due."""
        assert isinstance(state, CamDecodeState)
        keys, values = layer.dense_kv()  # CaM keeps every head alike
        attention = last_query_attention(query, keys)
        running = state.attention.get(layer_idx)
        if running is not None:
            attention = torch.nn.functional.pad(running, (0, attention.shape[1] - running.shape[1])) + attention
        state.attention[layer_idx] = attention
        seen = state.queries.get(layer_idx)
        state.queries[layer_idx] = (query if seen is None else torch.cat([seen, query], dim=1))[:, -self.window :]
        steps = state.steps[layer_idx] = state.steps.get(layer_idx, 0) + 1
        length = keys.shape[1]
        if not ((steps >= self.interval and length > self.target) or query.shape[1] >= self.target):
            return
        state.steps[layer_idx] = 0
        recent = state.queries.pop(layer_idx)
        evicted_count = length - self.target
        if evicted_count <= 0:
            return
        observation = WindowObservation(layer_idx, 0, recent, keys, values, scaling)
        scores = aggregate_groups(self.scorer.score(observation), layer.num_heads, self.gqa_agg).mean(dim=0)  # [S]
        evicted = scores.topk(evicted_count, largest=False).indices.sort().values
        order = scores[evicted].flip(-1).argsort(descending=True, stable=True)[:steps]  # equal scores: the later
        merged = (evicted[evicted_count - 1 - order]).sort().values
        kept = scores.topk(self.target).indices.sort().values
        if self.seed is not None and state.generator is None:
            state.generator = torch.Generator(device=keys.device).manual_seed(self.seed)
        new_values = cam_merge(values, attention, kept, merged, self.merge_budget, state.generator)
        layer.keep([kept] * layer.num_heads)
        layer.rewrite_values(list(new_values[:, kept].unbind(0)))
        state.attention[layer_idx] = attention[:, kept]


@dataclass(frozen=True)
class Cam(OverPress, family="cam"):
    """CAMPress's knobs (kvpress's names); the wrapped scorer (``press``) ranks the cache at each compression."""

    #: Forwards between two compressions (kvpress's ``compression_interval``).
    compression_interval: int = bounded(512, 1)
    #: Tokens per head a compression keeps (kvpress's ``target_size``).
    target_size: int = bounded(2048, 1)
    #: Kept tokens after an evicted one its value is spread over (kvpress's ``merge_budget``).
    merge_budget: int = bounded(32, 1)
    #: kvbench's switch: ``null`` (kvpress) draws the merges from torch's global generator, so a sample's draws depend
    #: on what ran before it (and batched decoding draws differently from batch 1); a number gives each sample its
    #: own generator seeded with it.
    seed: int | None = None

    def build(self, method_cfg: Any) -> EvictionMethod:
        """The wrapped scorer at the prefill (at the budget) and CaM's merging compressions while decoding."""
        inner = self.build_inner(method_cfg)
        assert inner.scorer is not None
        policy = CamDecodingPolicy(
            inner.scorer,
            inner.gqa_agg,
            inner.window,
            self.compression_interval,
            self.target_size,
            self.merge_budget,
            self.seed,
        )
        return dataclasses.replace(
            inner, family=self.family, decode_policy=policy, settings=self.settings_of(inner, REFERENCE)
        )
