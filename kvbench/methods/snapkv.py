"""SnapKV (Li et al., 2024) and PyramidKV (Cai et al., 2024): observation-window voting with pooling.

Reproduces FasterDecoding/SnapKV ``snapkv/monkeypatch/snapkv_utils.py`` (``SnapKVCluster.update_kv``) and
Zefan-Cai/KVCache-Factory ``pyramidkv/pyramidkv_utils.py`` (``SnapKVCluster``, ``PyramidKVCluster``):

* Indicator: the last ``window`` prompt queries' softmax attention over the keys (causal in the window), **summed**
  over the window rows, restricted to the candidates ``[0, S - W)``, pooled along them (max, kernel 7; average
  pooling counts its padding).  Per query head with ``gqa_granularity=query_head`` (both references' default:
  KV repeated before compression); with ``kv_head`` the group is reduced (``gqa_agg``, mean) **before** pooling,
  as KVCache-Factory's ``kv_cache_granularity=kv_head`` mode.
* Each head keeps its top ``C - W`` candidates plus the window; nothing is evicted when ``S < C``.
* PyramidKV's layer schedule (:func:`pyramid_schedule`) is integer arithmetic, in the variant of KVCache-Factory
  (default) or of AdaKV's ``pyram_mode``; ``params.schedule: sum_preserving`` is kvbench's variant whose total is
  exactly ``L x C``; ``kvpress`` is NVIDIA/kvpress's ``PyramidKVPress`` (:mod:`kvbench.methods.kvpress_pyramid`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kvbench.checks import check_choice, check_min
from kvbench.methods.base import (
    EvictionMethod,
    LayerBudgetAllocator,
    StaticLayerAllocator,
    TokenScorer,
    WindowObservation,
    common_knobs,
    score_options,
)
from kvbench.methods.family import FamilyMethod
from kvbench.methods.kvpress_pyramid import KvpressPyramidAllocator, kvpress_pyramid_budgets
from kvbench.methods.params import bounded, choice
from kvbench.methods.token_scores import ScoreOptions, VoteKnobs, window_votes, with_window_columns

PYRAMID_SCHEDULES = ("kvcache_factory", "adakv", "sum_preserving", "kvpress")


class WindowVoteScorer(TokenScorer):
    """SnapKV's indicator: window attention reduced over the window rows, candidates pooled (module docstring).

    Parameters
    ----------
    options:
        Pooling, GQA reduction and precision.
    row_reduce:
        ``sum`` (SnapKV, PyramidKV) or ``mean`` (Ada-KV's code).
    """

    window_scorer = True

    def __init__(self, options: ScoreOptions, row_reduce: str = "sum") -> None:
        self.options = options
        self.row_reduce = row_reduce

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """``[H, S]`` pooled candidate scores per stored head; the window columns are 0 (always kept)."""
        dtype = observation.model_dtype
        stats = observation.window_stats(self.options.probability_dtype(dtype))
        votes = window_votes(stats, self.row_reduce, self.options.rounding(dtype))  # [H_q, S]
        candidates = votes[:, : observation.context_length - observation.window]
        per_head = self.options.to_stored_heads(candidates, observation.num_heads, observation.model_dtype)
        return with_window_columns(per_head, observation.context_length)


def pyramid_schedule(
    average: int, window: int, beta: int, num_layers: int, context_length: int, variant: str
) -> list[int]:
    """PyramidKV's per-layer budgets (window included), or ``context_length`` for a layer that evicts nothing.

    ``average`` is the mean budget per layer ``C``; ``base = C - W``; ``min = base // beta``; ``max = 2 base - min``;
    if ``max >= S - W``: ``max = S - W``, ``min = 2 base - max``; ``steps = (max - min) // (L - 1)``; layer ``l``
    selects ``max - l * steps`` candidates and keeps the window on top.

    * ``kvcache_factory``: nothing is evicted when ``S < C``; every layer keeps ``C`` when ``S < 2 base``.
    * ``adakv`` (AdaKV ``pyram_mode``): no uniform branch; a layer evicts nothing when it would select more than
      the ``S - W`` candidates.
    * ``sum_preserving`` (kvbench): the same endpoints with a fractional step, rounded, and the remainder spread so
      the total is exactly ``L x C``; uniform when ``S < 2 base`` as KVCache-Factory.

    One layer, or a budget not above the window, is uniform (the references assume ``L > 1`` and ``C > W``).
    """
    check_choice("method.params.schedule", variant, PYRAMID_SCHEDULES)
    if variant == "kvpress":
        return kvpress_pyramid_budgets(average, window, beta, num_layers, context_length)
    base = average - window
    if variant != "adakv" and context_length < average:
        return [context_length] * num_layers
    if num_layers == 1 or base <= 0:
        return [min(average, context_length)] * num_layers
    if variant != "adakv" and context_length < 2 * base:
        return [average] * num_layers
    smallest = base // beta
    largest = 2 * base - smallest
    if largest >= context_length - window:
        largest = context_length - window
        smallest = 2 * base - largest
    if variant == "sum_preserving":
        return _sum_preserving(largest, smallest, window, average, num_layers)
    steps = (largest - smallest) // (num_layers - 1)
    selected = [largest - layer * steps for layer in range(num_layers)]
    return [context_length if count > context_length - window else count + window for count in selected]


def _sum_preserving(largest: int, smallest: int, window: int, average: int, num_layers: int) -> list[int]:
    step = (largest - smallest) / (num_layers - 1)
    budgets = [round(largest - layer * step) + window for layer in range(num_layers)]
    remainder = average * num_layers - sum(budgets)
    order = range(num_layers) if remainder > 0 else range(num_layers - 1, -1, -1)
    for layer in list(order)[: abs(remainder)]:
        budgets[layer] += 1 if remainder > 0 else -1
    return budgets


class PyramidLayerAllocator(StaticLayerAllocator):
    """PyramidKV's linear per-layer schedule (:func:`pyramid_schedule`), largest at layer 0.

    The mean per-layer budget ``C`` is ``total // num_layers`` (window included).
    """

    def __init__(self, beta: int, window: int, schedule: str = "kvcache_factory") -> None:
        check_min("method.params.beta", beta, 1)
        check_choice("method.params.schedule", schedule, PYRAMID_SCHEDULES)
        self.beta = beta
        self.window = window
        self.schedule = schedule

    def plan(self, total: int, num_layers: int, context_length: int) -> list[int]:
        window = min(self.window, context_length)
        return pyramid_schedule(total // num_layers, window, self.beta, num_layers, context_length, self.schedule)


@dataclass
class PyramidKV(VoteKnobs, FamilyMethod, family="pyramidkv"):
    """PyramidKV's knobs: SnapKV's, the slope and the schedule variant (:func:`pyramid_schedule`)."""

    beta: int = bounded(20, low=1)
    schedule: str = choice("kvcache_factory", PYRAMID_SCHEDULES)

    def build(self, method_cfg: Any) -> EvictionMethod:
        """PyramidKV: SnapKV's indicator with the pyramid layer schedule."""
        options = score_options(method_cfg, self)
        allocator: LayerBudgetAllocator = (  # kvpress: kvbench.methods.kvpress_pyramid
            KvpressPyramidAllocator(self.beta, int(method_cfg.window))
            if self.schedule == "kvpress"
            else PyramidLayerAllocator(self.beta, int(method_cfg.window), self.schedule)
        )
        return EvictionMethod(
            scorer=WindowVoteScorer(options),
            layer_allocator=allocator,
            settings={"gqa_reduce": options.gqa_reduce, "beta": self.beta, "schedule": self.schedule},
            **common_knobs(method_cfg),
        )
