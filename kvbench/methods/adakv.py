"""Ada-KV (Feng et al., arXiv 2407.11550): head-wise adaptive budget allocation, as Ada-SnapKV and Ada-Pyramid.

* Indicator (SnapKV's, in Ada-KV's code order): window attention over all keys (causal in the window, fp32),
  **mean** over the window queries, mean over each GQA group (late paper, one cache per KV head; with
  ``gqa_granularity=query_head`` the early paper's replicated per-query-head cache), then max pooling (kernel 7)
  along the past (non-window) tokens.
* Allocation inside a layer (Algorithm 1): one top-``B`` over the concatenated scores of all heads of the layer,
  ``B = H x (budget - window)`` (the window is paid out of the budget and always kept); head ``i`` gets the
  number ``f_i`` of selected scores that are its own.
* Safeguard (two readings, ``params.alpha_reading``):

  - ``floor`` (the official code's ``floor_alpha``, default): ``B_i = (1 - alpha) f_i + alpha B/H`` -- ``alpha`` is
    the *uniform floor share*; the late paper's experiments run ``alpha = 0.2`` this way (80 % adaptive);
  - ``adaptive`` (the papers' printed formula): ``B_i = alpha f_i + (1 - alpha) B/H`` -- ``alpha`` is the
    *adaptive share*.  Both readings agree at 0.5 (the early paper's value).

  ``params.alpha = null`` takes the paper version's value (``params.paper_version``: ``early`` 0.5, ``late``
  0.2); the presets derive the version from ``run.tag`` (``adakv_early`` -> early), so the early tables run
  ``alpha = 0.5`` without touching other methods of the same sweep.
* The per-head budgets are made integral by largest remainder so a layer's total is exact; a head never gets
  more than it holds (the surplus goes to the heads with the next-best scores).
* Ada-Pyramid: PyramidKV's layer schedule (beta 20) with the same head allocation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from kvbench.methods.base import (
    EvictionMethod,
    HeadBudgetAllocator,
    TokenScorer,
    WindowObservation,
    aggregate_groups,
    common_knobs,
    parse_params,
    pool_scores,
    register_method,
)
from kvbench.methods.snapkv import PyramidLayerAllocator

ALPHA_READINGS = ("floor", "adaptive")
PAPER_ALPHA = {"early": 0.5, "late": 0.2}


class AdaWindowScorer(TokenScorer):
    """Ada-KV's indicator: window-mean attention, GQA-group aggregation, then pooling over the past tokens.

    Returns ``[H, S]`` per stored head; the window columns are 0 (the session protects them).
    """

    def __init__(self, kernel_size: int, pooling: str, gqa_agg: str) -> None:
        self.kernel_size = kernel_size
        self.pooling = pooling
        self.gqa_agg = gqa_agg

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """``[H, S]`` scores (``H`` stored heads)."""
        past = observation.context_length - observation.window
        mean = observation.window_attention.mean(dim=1)  # [H_q, S]
        grouped = aggregate_groups(mean, observation.keys.shape[0], self.gqa_agg)  # [H, S]
        scores = torch.zeros_like(grouped)
        if past > 0:
            scores[:, :past] = pool_scores(grouped[:, :past], self.kernel_size, self.pooling)
        return scores


def largest_remainder(shares: torch.Tensor, total: int) -> list[int]:
    """Round non-negative real ``shares`` ``[H]`` to integers summing to ``total`` (largest remainder first)."""
    floors = torch.floor(shares).long()
    counts = floors.tolist()
    missing = total - sum(counts)
    if missing > 0:
        order = torch.argsort(shares - floors, descending=True, stable=True).tolist()
        for head in order[:missing]:
            counts[head] += 1
    elif missing < 0:
        order = torch.argsort(shares - floors, descending=False, stable=True).tolist()
        for head in order:
            if missing == 0:
                break
            if counts[head] > 0:
                counts[head] -= 1
                missing += 1
    return counts


def adaptive_counts(scores: torch.Tensor, budget: int) -> list[int]:
    """Algorithm 1: per-head counts of the top ``budget`` entries of ``[H, n]`` scores over all heads at once.

    ``-inf`` entries (padding) are never selected while finite ones remain.
    """
    flat = scores.reshape(-1)
    budget = min(budget, int(torch.isfinite(flat).sum()))
    if budget <= 0:
        return [0] * scores.shape[0]
    top = torch.topk(flat, budget).indices
    return torch.bincount(top // scores.shape[1], minlength=scores.shape[0]).tolist()


class AdaHeadAllocator(HeadBudgetAllocator):
    """Ada-KV's head-wise adaptive allocation with the safeguard (see module docstring).

    Parameters
    ----------
    alpha:
        Safeguard value in ``[0, 1]``.
    reading:
        ``floor`` (alpha = uniform share, official code) or ``adaptive`` (alpha = adaptive share, paper formula).
    """

    def __init__(self, alpha: float, reading: str) -> None:
        if reading not in ALPHA_READINGS:
            raise ValueError(f"method.params.alpha_reading={reading!r}; valid: {', '.join(ALPHA_READINGS)}")
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"method.params.alpha must be in [0, 1], got {alpha}")
        self.alpha = alpha
        self.reading = reading

    @property
    def uniform_share(self) -> float:
        """Share of each head's budget that is uniform (the floor)."""
        return self.alpha if self.reading == "floor" else 1.0 - self.alpha

    def allocate(self, scores: torch.Tensor, budget_per_head: int) -> list[int]:
        """Per-head counts for ``[H, S]`` scores (``+inf`` protected, ``-inf`` padding); protected tokens included."""
        num_heads = scores.shape[0]
        protected = torch.isposinf(scores).sum(dim=1)  # [H]
        candidates = torch.where(torch.isposinf(scores), float("-inf"), scores)  # only the selectable tokens
        available = torch.isfinite(candidates).sum(dim=1)  # [H]
        per_head = budget_per_head - int(protected.max())
        if per_head <= 0:
            return [min(budget_per_head, int(p)) for p in protected.tolist()]
        layer_budget = per_head * num_heads  # B <- B - window x h
        frequencies = torch.tensor(adaptive_counts(candidates, layer_budget), dtype=torch.float64)
        share = self.uniform_share
        blended = (1.0 - share) * frequencies + share * (layer_budget / num_heads)
        counts = largest_remainder(blended, min(layer_budget, int(available.sum())))
        counts = _spill_over(counts, available.tolist(), candidates)
        return [int(p) + c for p, c in zip(protected.tolist(), counts, strict=True)]


def _spill_over(counts: list[int], available: list[int], candidates: torch.Tensor) -> list[int]:
    """Cap each head at what it holds; hand the surplus to heads with room, best next score first."""
    counts = list(counts)
    surplus = 0
    for head, room in enumerate(available):
        if counts[head] > room:
            surplus += counts[head] - room
            counts[head] = room
    while surplus > 0:
        best, best_score = -1, -math.inf
        for head, room in enumerate(available):
            if counts[head] < room:
                nxt = float(torch.topk(candidates[head], counts[head] + 1).values[-1])
                if best < 0 or nxt > best_score:
                    best, best_score = head, nxt
        if best < 0:
            break
        counts[best] += 1
        surplus -= 1
    return counts


@dataclass
class AdaKVParams:
    """Ada-KV's safeguard (see module docstring)."""

    #: Safeguard value; null = the paper version's value (early 0.5, late 0.2).
    alpha: float | None = None
    #: ``floor`` (alpha is the uniform floor share; official code) or ``adaptive`` (paper formula).
    alpha_reading: str = "floor"
    #: ``early`` (arXiv v1/v2, alpha 0.5) or ``late`` (v4, alpha 0.2); a run tag containing "early" counts as early.
    paper_version: str = "late"
    #: PyramidKV slope (Ada-Pyramid only).
    beta: int = 20


def resolve_alpha(params: AdaKVParams) -> float:
    """The safeguard value after applying the paper-version default."""
    if params.alpha is not None:
        return float(params.alpha)
    version = "early" if "early" in str(params.paper_version) else "late"
    return PAPER_ALPHA[version]


def _build(method_cfg: Any, family: str, pyramid: bool) -> EvictionMethod:
    params = parse_params(AdaKVParams, method_cfg.params, family)
    knobs = common_knobs(method_cfg)
    method = EvictionMethod(
        scorer=AdaWindowScorer(int(method_cfg.kernel_size), str(method_cfg.pooling), str(method_cfg.gqa_agg)),
        head_allocator=AdaHeadAllocator(resolve_alpha(params), params.alpha_reading),
        **knobs,
    )
    if pyramid:
        if params.beta < 1:
            raise ValueError(f"method.params.beta must be >= 1, got {params.beta}")
        method.layer_allocator = PyramidLayerAllocator(params.beta, int(method_cfg.window))
    method.settings = {"alpha": resolve_alpha(params), "alpha_reading": params.alpha_reading}
    return method


@register_method("ada_snapkv")
def build_ada_snapkv(method_cfg: Any) -> EvictionMethod:
    """Ada-SnapKV: SnapKV's indicator and uniform layer budgets, Ada-KV head allocation."""
    return _build(method_cfg, "ada_snapkv", pyramid=False)


@register_method("ada_pyramidkv")
def build_ada_pyramidkv(method_cfg: Any) -> EvictionMethod:
    """Ada-Pyramid: PyramidKV's layer schedule, Ada-KV head allocation."""
    return _build(method_cfg, "ada_pyramidkv", pyramid=True)
