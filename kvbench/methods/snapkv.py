"""SnapKV (Li et al., 2024) and PyramidKV (Cai et al., 2024): observation-window voting with pooling.

* Indicator: the last ``window`` prompt queries' attention over the keys, summed over the window, smoothed by a
  1-D pooling (max, kernel 7); per stored head (query-head scores aggregated per GQA group, ``method.gqa_agg``).
* SnapKV: uniform layer budgets.  PyramidKV: a linear schedule, largest at layer 0, with the average kept at the
  requested budget (``beta`` = 20, the KVCache-Factory formula); it falls back to uniform when the context is
  shorter than twice the budget outside the window, as the original code does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kvbench.methods.base import (
    EvictionMethod,
    StaticLayerAllocator,
    TokenScorer,
    UniformLayerAllocator,
    WindowObservation,
    common_knobs,
    parse_params,
    pool_scores,
    register_method,
)


class WindowVoteScorer(TokenScorer):
    """SnapKV's indicator: window attention summed over window queries, then pooled along the sequence."""

    def __init__(self, kernel_size: int, pooling: str) -> None:
        self.kernel_size = kernel_size
        self.pooling = pooling

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """``[H_q, S]`` pooled vote of the window queries."""
        votes = observation.window_attention.sum(dim=1)  # [H_q, S]
        return pool_scores(votes, self.kernel_size, self.pooling)


class PyramidLayerAllocator(StaticLayerAllocator):
    """PyramidKV's linear per-layer schedule around the average budget (window included in each layer's budget).

    With ``avg`` the mean budget per layer, ``w`` the window and ``base = avg - w``: the smallest layer gets
    ``base // beta + w``, the largest ``2 * base - base // beta + w``, linearly in between (layer 0 largest).
    The integer steps leave a small remainder, which is spread over the layers so the total is exact.
    """

    def __init__(self, beta: int, window: int) -> None:
        self.beta = beta
        self.window = window

    def plan(self, total: int, num_layers: int, context_length: int) -> list[int]:
        avg = total // num_layers
        base = avg - self.window
        if num_layers == 1 or base <= 0 or context_length < 2 * base:
            return UniformLayerAllocator().plan(total, num_layers, context_length)
        smallest = base // self.beta
        largest = 2 * base - smallest
        if largest >= context_length - self.window:
            largest = context_length - self.window
            smallest = 2 * base - largest
        step = (largest - smallest) / (num_layers - 1)
        budgets = [round(largest - layer * step) + self.window for layer in range(num_layers)]
        # Make the sum exactly `total`: spread the rounding remainder one token at a time.
        remainder = total - sum(budgets)
        order = range(num_layers) if remainder > 0 else range(num_layers - 1, -1, -1)
        for layer in list(order)[: abs(remainder)]:
            budgets[layer] += 1 if remainder > 0 else -1
        return budgets


@dataclass
class SnapKVParams:
    """SnapKV has no hyper-parameters beyond the common knobs (window, kernel_size, pooling)."""


@dataclass
class PyramidKVParams:
    """PyramidKV's slope."""

    beta: int = 20


@register_method("snapkv")
def build_snapkv(method_cfg: Any) -> EvictionMethod:
    """SnapKV: window vote + pooling, uniform budgets."""
    parse_params(SnapKVParams, method_cfg.params, "snapkv")
    return EvictionMethod(
        scorer=WindowVoteScorer(int(method_cfg.kernel_size), str(method_cfg.pooling)), **common_knobs(method_cfg)
    )


@register_method("pyramidkv")
def build_pyramidkv(method_cfg: Any) -> EvictionMethod:
    """PyramidKV: SnapKV's indicator with the pyramid layer schedule."""
    params = parse_params(PyramidKVParams, method_cfg.params, "pyramidkv")
    if params.beta < 1:
        raise ValueError(f"method.params.beta must be >= 1, got {params.beta}")
    return EvictionMethod(
        scorer=WindowVoteScorer(int(method_cfg.kernel_size), str(method_cfg.pooling)),
        layer_allocator=PyramidLayerAllocator(params.beta, int(method_cfg.window)),
        **common_knobs(method_cfg),
    )
