"""CAKE (Qin et al., ICLR 2025): cascading and adaptive KV cache eviction with layer preferences.

* Layer preference (Eq. 6, P2A): from the window's attention over the past keys ``A[-S_w:, :-S_w]`` (all query
  heads, rows *not* renormalised): dispersion ``H = -sum a log(a + 1e-10)`` and shift ``V = sum_j Var_rows(A[:, j])``
  (unbiased), both summed over heads; ``P = H^(1/tau1) * V^(1/tau2)``.  ``params.preference`` drops a factor for
  the ablation (``hv`` default, ``h``, ``v``).
* Allocation (Eq. 7 / 9): the pool ``B_total - L * S_w`` is split in proportion to ``P`` (truncated, capped at
  ``S - S_w``, the rounding remainder to the newest layer); every layer also keeps its ``S_w`` window, so the
  layer budget (window included) sums to ``B_total``.
* Cascading (Algorithm 1, ``params.cascading``): after each layer's prefill, the budgets of all layers seen so far
  are recomputed with the full total and every one of them is evicted by its stored indicator -- the cache never
  holds more than ``B_total`` plus one layer's full KV.  A layer's budget never grows from one stage to the next
  (Proposition 1; enforced so integer rounding cannot break it), hence Theorem 1: the result equals one eviction
  with the final budgets.  ``cascading: false`` evicts every layer once, at the last layer (vanilla P2A).
* Indicator (Eq. 11): ``Mean + gamma * Var`` (gamma 200, unbiased variance over the window rows) per query head,
  average pooling (kernel 5) over the past tokens, mean per GQA group; the window is always kept.
  ``params.indicator`` swaps it for Table 3 (``mean``, ``var``, ``mean_x_var``) or for another method's
  (``h2o``, ``tova``, ``snapkv``: CAKE's allocation under other indicators).
* Allocation switch for Table 2: ``params.allocation`` = ``p2a`` (default), ``uniform``, ``pyramid``, ``random``.
* Decoding (official code): layer budgets stay fixed; at every step the newest query's attention over the cache
  except the last ``S_w`` tokens (average-pooled, kernel 5, GQA mean) ranks the tokens and the lowest one goes.
  H2O/TOVA indicators keep their own decode rules.
* tau: ``params.tau1/tau2`` (null = the official per-model table at 128L / 1024L when ``params.model`` matches,
  else 1.0, as the code falls back).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch

from kvbench.cache import HeadwiseLayer
from kvbench.methods.base import (
    DecodePolicy,
    EvictionMethod,
    LayerBudgetAllocator,
    StaticLayerAllocator,
    TokenScorer,
    UniformLayerAllocator,
    WindowObservation,
    common_knobs,
    decode_attention,
    evict_to_caps,
    parse_params,
    pool_scores,
    register_method,
)
from kvbench.methods.h2o import HeavyHitterDecode, ScoredDecodePolicy
from kvbench.methods.snapkv import PyramidLayerAllocator, WindowVoteScorer
from kvbench.methods.tova import CurrentAttentionDecode, LastQueryScorer

INDICATORS = ("cake", "mean", "var", "mean_x_var", "h2o", "tova", "snapkv")
ALLOCATIONS = ("p2a", "uniform", "pyramid", "random")
PREFERENCES = ("hv", "h", "v")

#: Official per-model temperatures (experiments/LongBench/config/model2tau.json), keyed by kvbench model name and
#: the per-layer average budget: (tau1, tau2).  Other budgets/models: (1.0, 1.0), as the released code does.
TAU_PRESETS: dict[str, dict[int, tuple[float, float]]] = {
    "llama2-7b-chat": {128: (0.9, 2.3), 1024: (1.9, 1.8)},
    "llama2-13b-chat": {128: (1.8, 2.0), 1024: (0.5, 0.4)},
    "llama3.1-8b-instruct": {128: (1.6, 0.6), 1024: (1.6, 0.4)},
    "mistral-7b-instruct-v0.3": {128: (1.0, 0.8), 1024: (0.8, 0.5)},
    "qwen2.5-7b-instruct": {128: (0.4, 0.6), 1024: (1.5, 0.6)},
}


# ---------------------------------------------------------------------------------------------------- preference
def layer_preference(attention: torch.Tensor, window: int, tau1: float, tau2: float, preference: str = "hv") -> float:
    """Eq. 6 from ``[H_q, W, S]`` window attention: ``H^(1/tau1) * V^(1/tau2)`` over ``A[:, :, :S-W]``."""
    past = attention[:, :, : attention.shape[-1] - window].double()
    if past.shape[-1] == 0:
        return 1.0
    entropy = float(-(past * torch.log(past + 1e-10)).sum())
    variance = float(past.var(dim=1).sum()) if past.shape[1] > 1 else 0.0
    value = 1.0
    if preference in ("hv", "h"):
        value *= max(entropy, 0.0) ** (1.0 / tau1)
    if preference in ("hv", "v"):
        value *= max(variance, 0.0) ** (1.0 / tau2)
    return max(value, 1e-30)  # all scores must be positive (Proposition 1)


def split_pool(
    preferences: list[float], pool: int, caps: list[int], previous: list[int | None] | None = None
) -> list[int]:
    """Split ``pool`` tokens over layers in proportion to ``preferences`` (Eq. 7/9, the code's adjust_budgets).

    Truncate, cap each layer at ``caps[l]`` (its past tokens) and spread the excess evenly over the layers with
    room, then hand the truncation remainder to the newest layer first and to the others in order; never above a
    layer's cap nor above ``previous[l]`` (budgets only shrink between cascading stages).
    """
    total_pref = sum(preferences)
    shares = [int(p / total_pref * pool) for p in preferences]
    limits = [
        min(cap, prev) if prev is not None else cap
        for cap, prev in zip(caps, previous or [None] * len(caps), strict=True)
    ]
    budgets = [min(share, limit) for share, limit in zip(shares, limits, strict=True)]
    capped = sum(share - budget for share, budget in zip(shares, budgets, strict=True))
    # Excess of capped layers: evenly over the layers with room (the code's adjust_budgets).
    while capped > 0:
        open_layers = [layer for layer, budget in enumerate(budgets) if budget < limits[layer]]
        if not open_layers:
            break
        each = max(capped // len(open_layers), 1)
        for layer in open_layers:
            extra = min(each, limits[layer] - budgets[layer], capped)
            budgets[layer] += extra
            capped -= extra
    # Truncation remainder: newest layer first (so earlier layers never grow between stages), then in order.
    remainder = pool - sum(budgets)
    for layer in [len(budgets) - 1, *range(len(budgets) - 1)]:
        if remainder <= 0:
            break
        extra = min(remainder, limits[layer] - budgets[layer])
        budgets[layer] += extra
        remainder -= extra
    return budgets


class CakeLayerAllocator(LayerBudgetAllocator):
    """Preference-prioritised adaptive allocation, cascading or one-shot (see module docstring)."""

    def __init__(self, window: int, tau1: float | None, tau2: float | None, model: str | None, cascading: bool,
                 preference: str = "hv") -> None:  # fmt: skip
        self.window = window
        self.tau = (tau1, tau2)
        self.model = model
        self.cascading = cascading
        self.preference = preference

    def start(self, total: int, num_layers: int, context_length: int) -> None:
        super().start(total, num_layers, context_length)
        self.preferences: list[float] = []
        self.budgets: list[int] = []
        self.tau1, self.tau2 = resolve_tau(self.tau, self.model, total // max(num_layers, 1))

    def on_layer(self, observation: WindowObservation) -> dict[int, int]:
        window = min(self.window, observation.window)
        self.preferences.append(
            layer_preference(observation.window_attention, window, self.tau1, self.tau2, self.preference)
        )
        seen = len(self.preferences)
        if not self.cascading and seen < self.num_layers:
            return {}
        pool = max(self.total - self.num_layers * window, 0)
        caps = [max(self.context_length - window, 0)] * seen
        previous: list[int | None] = [*self.budgets, None]
        past = split_pool(self.preferences, pool, caps, previous if self.cascading else None)
        self.budgets = past
        return {layer: budget + window for layer, budget in enumerate(past)}


def resolve_tau(tau: tuple[float | None, float | None], model: str | None, per_layer: int) -> tuple[float, float]:
    """Explicit temperatures win; else the official per-model table at this per-layer budget; else (1, 1)."""
    preset = TAU_PRESETS.get(str(model), {}).get(per_layer, (1.0, 1.0))
    return (tau[0] if tau[0] is not None else preset[0], tau[1] if tau[1] is not None else preset[1])


class RandomLayerAllocator(StaticLayerAllocator):
    """Table 2's random allocation: the pool split in proportion to uniform random weights (seeded per run)."""

    def __init__(self, window: int, seed: int) -> None:
        self.window = window
        self.rng = random.Random(seed)

    def plan(self, total: int, num_layers: int, context_length: int) -> list[int]:
        pool = max(total - num_layers * self.window, 0)
        weights = [self.rng.random() + 1e-6 for _ in range(num_layers)]
        past = split_pool(weights, pool, [max(context_length - self.window, 0)] * num_layers)
        return [budget + self.window for budget in past]


# ---------------------------------------------------------------------------------------------------- indicator
class CakeScorer(TokenScorer):
    """Eq. 11 indicator ``Mean + gamma * Var`` over the window rows (or a Table 3 variant), pooled over the past.

    Returns ``[H_q, S]`` (the framework averages each GQA group); the window columns are 0 (protected).
    """

    def __init__(self, gamma: float, kernel_size: int, pooling: str, indicator: str = "cake") -> None:
        self.gamma = gamma
        self.kernel_size = kernel_size
        self.pooling = pooling
        self.indicator = indicator

    def score(self, observation: WindowObservation) -> torch.Tensor:
        attention = observation.window_attention  # [H_q, W, S]
        mean = attention.mean(dim=1)
        var = attention.var(dim=1) if attention.shape[1] > 1 else torch.zeros_like(mean)
        if self.indicator == "cake":
            raw = mean + self.gamma * var
        elif self.indicator == "mean":
            raw = mean
        elif self.indicator == "var":
            raw = var
        else:  # mean_x_var
            raw = mean * var
        past = observation.context_length - observation.window
        scores = torch.zeros_like(raw)
        if past > 0:
            scores[:, :past] = pool_scores(raw[:, :past], self.kernel_size, self.pooling)
        return scores


class CakeDecode(ScoredDecodePolicy):
    """CAKE's decode eviction: rank by the newest query's pooled attention, keep the last ``window`` tokens."""

    def __init__(self, window: int, kernel_size: int, pooling: str) -> None:
        super().__init__(recent_window=window)
        self.kernel_size = kernel_size
        self.pooling = pooling

    def step(self, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor, scaling: float) -> None:
        caps = self.caps[layer_idx]
        if all(length <= cap for length, cap in zip(layer.head_lengths(), caps, strict=True)):
            return  # skip the attention computation when nothing is over budget
        attention = decode_attention(layer, query, scaling)  # per head [S_h], GQA-averaged

        def pooled_top_and_window(head: int, length: int, cap: int) -> torch.Tensor:
            recent = min(self.recent_window, cap)
            past = length - recent
            scores = pool_scores(attention[head][None, :past], self.kernel_size, self.pooling)[0]
            chosen = torch.topk(scores, cap - recent).indices
            return torch.cat([chosen, torch.arange(past, length, device=chosen.device)])

        keep = evict_to_caps(layer, caps, pooled_top_and_window)
        assert keep is not None
        self.scores[layer_idx] = [torch.zeros(len(k)) for k in keep]


# ---------------------------------------------------------------------------------------------------- builder
@dataclass
class CakeParams:
    """CAKE's hyper-parameters and switches (see module docstring)."""

    gamma: float = 200.0
    tau1: float | None = None
    tau2: float | None = None
    #: kvbench model name for the tau table (presets fill it from ``model.name``).
    model: str | None = None
    cascading: bool = True
    indicator: str = "cake"
    allocation: str = "p2a"
    preference: str = "hv"
    #: Pyramid slope (``allocation: pyramid``) and seed (``allocation: random``).
    beta: int = 20
    seed: int = 0


def _choose(value: str, valid: tuple[str, ...], key: str) -> str:
    if value not in valid:
        raise ValueError(f"method.params.{key}={value!r}; valid: {', '.join(valid)}")
    return value


@register_method("cake")
def build_cake(method_cfg: Any) -> EvictionMethod:
    """CAKE and the allocation / indicator combinations of its Tables 2, 3 and 14."""
    params = parse_params(CakeParams, method_cfg.params, "cake")
    indicator = _choose(params.indicator, INDICATORS, "indicator")
    allocation = _choose(params.allocation, ALLOCATIONS, "allocation")
    preference = _choose(params.preference, PREFERENCES, "preference")
    knobs = common_knobs(method_cfg)
    window, kernel, pooling = knobs["window"], int(method_cfg.kernel_size), str(method_cfg.pooling)
    scorer: TokenScorer
    policy: DecodePolicy | None = None
    if indicator == "h2o":
        scorer = WindowVoteScorer(kernel, pooling)
        policy = HeavyHitterDecode(window)
    elif indicator == "tova":
        scorer = LastQueryScorer(head_average=True)
        policy = CurrentAttentionDecode(head_average=True)
    elif indicator == "snapkv":
        scorer = WindowVoteScorer(kernel, pooling)
        policy = CakeDecode(window, kernel, pooling)
    else:
        scorer = CakeScorer(float(params.gamma), kernel, pooling, indicator)
        policy = CakeDecode(window, kernel, pooling)
    allocator: LayerBudgetAllocator
    if allocation == "p2a":
        allocator = CakeLayerAllocator(window, params.tau1, params.tau2, params.model, params.cascading, preference)
    elif allocation == "uniform":
        allocator = UniformLayerAllocator()
    elif allocation == "pyramid":
        allocator = PyramidLayerAllocator(params.beta, window)
    else:
        allocator = RandomLayerAllocator(window, params.seed)
    return EvictionMethod(
        scorer=scorer,
        layer_allocator=allocator,
        decode_policy=policy if method_cfg.decode_eviction else None,
        settings={"indicator": indicator, "allocation": allocation, "cascading": params.cascading},
        **knobs,
    )
