"""CAKE (Qin et al., ICLR 2025): cascading and adaptive KV cache eviction with layer preferences.

Reproduces antgroup/cakekv (``cake/model/modify_llama.py`` ``llama_attn_forward_cake``, ``cake/cake_cache.py``
``CakeprefillKVCache`` / ``CakeDecodingKVCache_LayerWise``, ``cake/utils.py`` ``adjust_budgets``) as its README runs
it (``--compress --cascading --window_size 32``, gamma 200, tau from ``config/model2tau.json``):

* Layer preference (Eq. 6, P2A): from the window's attention over the candidates ``A[-S_w:, :-S_w]`` (all query
  heads, rows *not* renormalised): dispersion ``H = -sum a log(a + 1e-10)`` and shift ``V = sum_j Var_rows(A[:, j])``
  (unbiased), both summed over heads; ``P = H^(1/tau1) * V^(1/tau2)``.  ``params.preference`` drops a factor for
  the ablation (``hv`` default, ``h``, ``v``).  In a half-precision model under ``score_dtype=model`` (the default)
  it is computed by the code's own operations in the model dtype (:mod:`kvbench.methods.cake_preference`), so a
  cascade over many layers gets the code's budgets to the token.
* Allocation (:func:`adjust_budgets`): the pool ``(C - S_w) L`` (``C`` the mean per-layer budget) is split in
  proportion to ``P``, truncated to integers, capped at ``S - S_w`` (the excess spread once over the uncapped
  layers, remainder to the first ones), then the difference to the pool added to (or taken from) the layers evenly,
  remainder to the first ones.  Every layer also keeps its ``S_w`` window.  Nothing is evicted when
  ``S <= C + S_w`` (the code's trigger).  ``params.adjust: monotone`` is kvbench's variant (iterative re-capping,
  remainder to the newest layer, budgets never grow between stages).
* Cascading (Algorithm 1, ``params.cascading``): at each layer's prefill the budgets of all layers seen so far are
  recomputed with the full pool and every one of them is evicted by its stored indicator (a layer never regains
  evicted tokens: a budget that grows keeps what is left) -- the cache never holds more than the total plus one
  layer's full KV.  ``cascading: false`` evicts every layer once, at the last layer (vanilla P2A).
* Indicator (Eq. 11): ``Mean + gamma * Var`` (gamma 200, unbiased variance over the window rows) per query head,
  candidates only, average pooling (kernel 5, padding counted), **then** the mean per GQA group (the code pools
  each query head before reducing: ``method.params.gqa_reduce`` defaults to ``after_pool``); KV is stored per KV head.
  ``params.indicator`` swaps it for Table 3 (``mean``, ``var``, ``mean_x_var``) or for another method's
  (``h2o``, ``tova``, ``snapkv``: CAKE's allocation under other indicators).
* Allocation switch for Table 2: ``params.allocation`` = ``p2a`` (default), ``uniform``, ``pyramid``, ``random``
  (no reference code; weights drawn per sample from ``(params.seed, the prompt)``: :class:`RandomLayerAllocator`).
* Decoding (official code): layer budgets stay fixed; at every step the newest query's attention over the cache
  except the last ``S_w`` tokens (average-pooled per query head, kernel 5, then the GQA mean) ranks the tokens and
  the lowest one goes.  The code runs this after *every* forward past the prefill: a multi-token append (question-
  agnostic mode's question) is ranked by the mean attention of its last ``S_w`` rows -- unmasked, as the code
  computes it (each row sees every appended token) -- and cut to the budget at once (``params.evict_on_append:
  false``: kvbench's earlier behaviour, the appended tokens wait for decoding).  With ``params.score_dtype=model``
  the logits, probabilities, row mean, pooling and GQA mean are rounded to the model dtype as the code's tensors
  are.  H2O/TOVA indicators keep their own decode rules.
* tau: ``params.tau1/tau2`` (null = the official per-model table at 128L / 1024L when ``params.model`` matches,
  else 1.0, as the code falls back).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from kvbench.eviction.base import (
    AllocatorState,
    DecodePolicy,
    DecodeState,
    EvictionMethod,
    LayerBudgetAllocator,
    TokenScorer,
    UniformLayerAllocator,
    WindowObservation,
    common_knobs,
    score_options,
)
from kvbench.eviction.decoding import evict_lowest, evict_to_caps, key_products, one_token_evictions
from kvbench.eviction.family import FamilyMethod
from kvbench.eviction.params import bounded, choice
from kvbench.eviction.seeding import sample_generator
from kvbench.eviction.token_scores import (
    ScoreOptions,
    VoteKnobs,
    pool_scores,
    probability_dtype,
    round_to,
    with_window_columns,
)
from kvbench.methods.cake_preference import code_preference, layer_preference
from kvbench.methods.h2o import AllRowsScorer, HeavyHitterDecode, ScoredDecodePolicy
from kvbench.methods.snapkv import PyramidLayerAllocator, WindowVoteScorer
from kvbench.methods.tova import CurrentAttentionDecode, LastQueryScorer

if TYPE_CHECKING:  # type hints only: importing the cache would import transformers
    from kvbench.cache.kv_cache import HeadwiseLayer

INDICATORS = ("cake", "mean", "var", "mean_x_var", "h2o", "tova", "snapkv")
ALLOCATIONS = ("p2a", "uniform", "pyramid", "random")
PREFERENCES = ("hv", "h", "v")
ADJUSTS = ("reference", "monotone")

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
def preference_shares(preferences: list[float], pool: int) -> list[float]:
    """``P_l / sum(P) * pool`` in float32, as the reference computes it (numpy float32 scalars)."""
    as_float32 = [np.float32(p) for p in preferences]
    total = np.float32(0)
    for value in as_float32:
        total = np.float32(total + value)
    return [float(np.float32(np.float32(value / total) * np.float32(pool))) for value in as_float32]


def adjust_budgets(shares: list[float], pool: int, cap: int) -> list[int]:
    """The reference's integer layer budgets (``cake/utils.py`` ``adjust_budgets``), written out.

    1. truncate each share to an integer;
    2. cap each at ``cap`` (= ``S - S_w``) and give the excess evenly to the layers below the cap, the remainder
       one by one to the first of them (once: a layer may end above the cap again);
    3. add (or take) the difference to ``pool`` evenly over the layers below the cap (above 1 when taking), the
       remainder one by one to the first of them.
    """
    budgets = [int(share) for share in shares]
    excess = sum(max(budget - cap, 0) for budget in budgets)
    budgets = [min(budget, cap) for budget in budgets]
    if excess > 0:
        _spread(budgets, [layer for layer, budget in enumerate(budgets) if budget < cap], excess)
    difference = pool - sum(budgets)
    if difference > 0:
        _spread(budgets, [layer for layer, budget in enumerate(budgets) if budget < cap], difference)
    elif difference < 0:
        _spread(budgets, [layer for layer, budget in enumerate(budgets) if budget > 1], difference)
    return budgets


def _spread(budgets: list[int], layers: list[int], amount: int) -> None:
    """Add ``amount`` (negative: take) evenly over ``layers``, the remainder one each to the first ones."""
    if not layers:
        return
    each, remainder = divmod(abs(amount), len(layers))
    sign = 1 if amount > 0 else -1
    for rank, layer in enumerate(layers):
        budgets[layer] += sign * (each + (1 if rank < remainder else 0))


def split_pool_monotone(
    preferences: list[float], pool: int, caps: list[int], previous: list[int | None] | None = None
) -> list[int]:
    """kvbench's variant of the split (``params.adjust: monotone``): budgets that never grow between stages.

    Truncate, cap each layer at ``caps[l]`` and re-spread the excess over the layers with room until none is left,
    then hand the truncation remainder to the newest layer first and to the others in order; never above a
    layer's cap nor above ``previous[l]``.
    """
    total_pref = sum(preferences)
    shares = [int(p / total_pref * pool) for p in preferences]
    limits = [
        min(cap, prev) if prev is not None else cap
        for cap, prev in zip(caps, previous or [None] * len(caps), strict=True)
    ]
    budgets = [min(share, limit) for share, limit in zip(shares, limits, strict=True)]
    capped = sum(share - budget for share, budget in zip(shares, budgets, strict=True))
    while capped > 0:
        open_layers = [layer for layer, budget in enumerate(budgets) if budget < limits[layer]]
        if not open_layers:
            break
        each = max(capped // len(open_layers), 1)
        for layer in open_layers:
            extra = min(each, limits[layer] - budgets[layer], capped)
            budgets[layer] += extra
            capped -= extra
    remainder = pool - sum(budgets)
    for layer in [len(budgets) - 1, *range(len(budgets) - 1)]:
        if remainder <= 0:
            break
        extra = min(remainder, limits[layer] - budgets[layer])
        budgets[layer] += extra
        remainder -= extra
    return budgets


@dataclass
class CakeState(AllocatorState):
    """One sample's CAKE allocation: the layers' preferences so far, the temperatures for its budget, and whether
    the prompt was below the code's eviction trigger (``budgets``: the last split of the pool, without windows)."""

    preferences: list[float] = field(default_factory=list)
    tau1: float = 1.0
    tau2: float = 1.0
    below_trigger: bool = False


class CakeLayerAllocator(LayerBudgetAllocator):
    """Preference-prioritised adaptive allocation, cascading or one-shot (see module docstring)."""

    def __init__(self, window: int, tau1: float | None, tau2: float | None, model: str | None, cascading: bool,
                 preference: str = "hv", adjust: str = "reference", rounding: str = "model") -> None:  # fmt: skip
        self.window = window
        self.tau = (tau1, tau2)
        self.model = model
        self.cascading = cascading
        self.preference = preference
        self.adjust = adjust
        self.score_dtype = rounding

    def new_state(self, total: int, num_layers: int, context_length: int, dataset: Any = None) -> CakeState:
        tau1, tau2 = resolve_tau(self.tau, self.model, total // max(num_layers, 1))
        return CakeState(total, num_layers, context_length, dataset=dataset, tau1=tau1, tau2=tau2)

    def on_layer(self, state: AllocatorState, observation: WindowObservation) -> dict[int, int]:
        assert isinstance(state, CakeState)
        window = min(self.window, observation.window)
        average = state.total // state.num_layers  # the code's cache_size C (window included)
        context = state.context_length
        if context <= average + window:  # the code's trigger: nothing is evicted at or below C + S_w
            state.below_trigger = True
            return {observation.layer_idx: context}
        dtype = observation.model_dtype
        if probability_dtype(dtype, self.score_dtype) is not None and window > 1:  # half model: the code's operations
            preference = code_preference(observation, window, state.tau1, state.tau2, self.preference)
        else:
            stats = observation.window_stats(None)
            preference = layer_preference(stats, window, state.tau1, state.tau2, self.preference)
        state.preferences.append(preference)
        seen = len(state.preferences)
        if not self.cascading and seen < state.num_layers:
            return {}
        pool = max(average - window, 0) * state.num_layers
        cap = context - window
        if self.adjust == "monotone":
            previous: list[int | None] = [*state.budgets, None]
            past = split_pool_monotone(state.preferences, pool, [cap] * seen, previous if self.cascading else None)
        else:
            past = adjust_budgets(preference_shares(state.preferences, pool), pool, cap)
        state.budgets = past
        return {layer: min(max(budget, 0), cap) + window for layer, budget in enumerate(past)}

    def decode_budget(self, state: AllocatorState, layer_idx: int) -> int | None:
        """Below the trigger the code still decodes with ``C`` per layer (its default layer budget + the window)."""
        assert isinstance(state, CakeState)
        return state.total // state.num_layers if state.below_trigger else None


def resolve_tau(tau: tuple[float | None, float | None], model: str | None, per_layer: int) -> tuple[float, float]:
    """Explicit temperatures win; else the official per-model table at this per-layer budget; else (1, 1)."""
    preset = TAU_PRESETS.get(str(model), {}).get(per_layer, (1.0, 1.0))
    return (tau[0] if tau[0] is not None else preset[0], tau[1] if tau[1] is not None else preset[1])


class RandomLayerAllocator(LayerBudgetAllocator):
    """Table 2's random allocation: the pool split by :func:`adjust_budgets` in proportion to random layer weights.

    CAKE's released code has no random allocation (the paper prints mean +- std over random allocations and does not
    say how they were drawn).  kvbench draws a sample's weights ``U[0, 1) + 1e-6`` at its first compressed layer from
    a generator seeded with ``(seed, sample_key)`` (the prompt's fingerprint; :mod:`kvbench.eviction.seeding`), so
    resumed, batched and lm-eval runs draw what the uninterrupted run draws; seeds give the paper's spread.
    """

    def __init__(self, window: int, seed: int) -> None:
        self.window = window
        self.seed = seed

    def on_layer(self, state: AllocatorState, observation: WindowObservation) -> dict[int, int]:
        if not state.budgets:  # the sample's first compressed layer: draw and plan every layer (window included)
            generator = sample_generator(self.seed, observation.sample_key, "cake_random")
            weights = [generator.random() + 1e-6 for _ in range(state.num_layers)]
            window = min(self.window, state.context_length)
            pool = max(state.total // state.num_layers - window, 0) * state.num_layers
            cap = state.context_length - window
            past = adjust_budgets(preference_shares(weights, pool), pool, cap)
            state.budgets = [min(max(budget, 0), cap) + window for budget in past]
        return {observation.layer_idx: state.budgets[observation.layer_idx]}


# ---------------------------------------------------------------------------------------------------- indicator
class CakeScorer(TokenScorer):
    """Eq. 11 indicator ``Mean + gamma * Var`` over the window rows (or a Table 3 variant), pooled over the candidates.

    Returns ``[H, S]`` per stored head (pooled per query head, then reduced: the code's order by default); the
    window columns are 0 (protected).
    """

    def __init__(self, gamma: float, options: ScoreOptions, indicator: str = "cake") -> None:
        self.gamma = gamma
        self.options = options
        self.indicator = indicator

    def score(self, observation: WindowObservation) -> torch.Tensor:
        rnd = self.options.rounding(observation.model_dtype)
        stats = observation.window_stats(self.options.probability_dtype(observation.model_dtype))
        mean = rnd(stats.mean)  # [H_q, S]
        var = rnd(stats.var()) if stats.window > 1 else torch.zeros_like(mean)
        if self.indicator == "cake":
            raw = rnd(mean + rnd(self.gamma * var))
        elif self.indicator == "mean":
            raw = mean
        elif self.indicator == "var":
            raw = var
        else:  # mean_x_var
            raw = rnd(mean * var)
        candidates = raw[:, : observation.context_length - observation.window]
        per_head = self.options.to_stored_heads(candidates, observation.num_heads, observation.model_dtype)
        return with_window_columns(per_head, observation.context_length)


class CakeDecode(ScoredDecodePolicy):
    """CAKE's decode eviction: rank by the newest query's pooled attention, keep the last ``window`` tokens; after
    an append, rank by its last ``window`` rows' mean attention (module docstring)."""

    #: Rows step independently (per-row lengths, positions and caps): a decode batch's pool steps in one call.
    steps_sample_rows = True

    def __init__(
        self, window: int, kernel_size: int, pooling: str, gqa_reduce: str = "after_pool", score_dtype: str = "model",
        evict_on_append: bool = True,
    ) -> None:  # fmt: skip
        super().__init__(recent_window=window, score_dtype=score_dtype)
        self.kernel_size = kernel_size
        self.pooling = pooling
        self.gqa_reduce = gqa_reduce
        self.evicts_on_append = evict_on_append

    def step(
        self, state: DecodeState, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor, scaling: float
    ) -> None:
        self._evict_by_rows(state, layer_idx, layer, query, scaling)

    def append(
        self, state: DecodeState, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor, scaling: float
    ) -> None:
        """The code's decoding branch on a multi-token forward: the last ``window`` rows, unmasked, row mean."""
        if self.evicts_on_append:
            self._evict_by_rows(state, layer_idx, layer, query[:, -self.recent_window :], scaling)

    def row_mean_attention(
        self, layer: HeadwiseLayer, rows: torch.Tensor, scaling: float
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``[H, g, S_max]``: per stored head and query head of its group, the mean over ``rows`` ``[H_q, r, D]`` of
        their softmax attention over the head's keys (no mask, as the code's decoding branch), rounded as the code's
        tensors when ``score_dtype`` is ``model``; batched over heads (0 past a head's length), with the ``[H, S_max]``
        mask of stored slots (``None`` when every head holds ``S_max``)."""
        dtype = self.rounding_dtype(rows)
        heads, dim = layer.num_heads, rows.shape[-1]
        groups, count = rows.shape[0] // heads, rows.shape[1]
        grouped = rows.float().reshape(heads, groups * count, dim)  # [H, g*r, D]
        products = key_products(layer, grouped)  # [H, g*r, S_max]
        width = products.shape[-1]
        logits = round_to(round_to(products, dtype) * scaling, dtype)
        stored = None
        if layer.is_ragged:
            assert layer.lengths is not None
            stored = torch.arange(width, device=rows.device) < layer.lengths[:, None]  # [H, S_max]
            logits = logits.masked_fill(~stored[:, None], float("-inf"))
        probs = round_to(torch.softmax(logits, dim=-1), dtype).reshape(heads, groups, count, width)
        return round_to(probs.mean(dim=2), dtype), stored

    def _pooled(self, by_position: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
        """``[H, g, n]`` attention in position order -> ``[H, n]`` pooled scores (the code's order: pool each query
        head, then the group mean; ``before_pool``: the mean first)."""
        heads, groups, width = by_position.shape
        if self.gqa_reduce == "after_pool":
            flat = by_position.reshape(heads * groups, width)
            pooled = round_to(pool_scores(flat, self.kernel_size, self.pooling), dtype)
            return round_to(pooled.reshape(heads, groups, width).mean(dim=1), dtype)
        reduced = round_to(by_position.mean(dim=1), dtype)
        return round_to(pool_scores(reduced, self.kernel_size, self.pooling), dtype)

    def _evict_by_rows(
        self, state: DecodeState, layer_idx: int, layer: HeadwiseLayer, rows: torch.Tensor, scaling: float
    ) -> None:
        caps = state.layer_caps(layer_idx)
        heads = one_token_evictions(layer.head_lengths(), caps)
        if heads == []:
            return  # skip the attention computation when nothing is over budget
        dtype = self.rounding_dtype(rows)
        attention, stored = self.row_mean_attention(layer, rows, scaling)  # [H, g, S_max]
        positions = layer.padded_positions()
        if stored is not None:
            positions = positions.masked_fill(~stored, torch.iinfo(positions.dtype).max)
        # Slots are not in position order once decoding has evicted in place: pool in position order.
        order = torch.argsort(positions, dim=1)  # [H, S_max] slots by position, unused slots last
        if heads is not None and all(cap > self.recent_window for cap in caps):
            # Every over-cap head one token over: one batched pooling over each head's tokens outside its recent
            # window (zeros past them, exactly the pooling's own padding), evict the lowest pooled slot in place.
            assert layer.lengths is not None
            past = (layer.lengths - self.recent_window)[:, None]  # [H, 1]
            candidate = torch.arange(order.shape[1], device=order.device) < past  # [H, S_max] in position order
            by_position = attention.gather(2, order[:, None].expand_as(attention))
            pooled = self._pooled(by_position.masked_fill(~candidate[:, None], 0.0), dtype)
            ranked = torch.empty_like(pooled).scatter_(1, order, pooled.masked_fill(~candidate, float("inf")))
            evict_lowest(layer, heads, ranked)
            return

        def pooled_top_and_window(head: int, length: int, cap: int) -> torch.Tensor:
            recent = min(self.recent_window, cap)
            past = length - recent
            slots = order[head, :length]
            scores = self._pooled(attention[head][None][:, :, slots[:past]], dtype)[0]
            chosen = torch.topk(scores, cap - recent).indices
            return torch.cat([slots[chosen], slots[past:]])

        evict_to_caps(layer, caps, pooled_top_and_window)


# ---------------------------------------------------------------------------------------------------- builder
@dataclass(frozen=True)
class CAKE(VoteKnobs, FamilyMethod, family="cake"):
    """CAKE's hyper-parameters and switches (see module docstring)."""

    gamma: float = 200.0
    tau1: float | None = None
    tau2: float | None = None
    #: kvbench model name for the tau table (presets fill it from ``model.name``).
    model: str | None = None
    cascading: bool = True
    indicator: str = choice("cake", INDICATORS)
    allocation: str = choice("p2a", ALLOCATIONS)
    preference: str = choice("hv", PREFERENCES)
    #: ``reference`` (the code's adjust_budgets) or ``monotone`` (kvbench: budgets never grow between stages).
    adjust: str = choice("reference", ADJUSTS)
    #: Pyramid slope (``allocation: pyramid``) and seed (``allocation: random``).
    beta: int = bounded(20, low=1)
    seed: int = 0
    #: Rank and cut a multi-token append at once, as the code's decoding branch (module docstring); false = the
    #: appended tokens wait for decoding (kvbench's earlier behaviour).
    evict_on_append: bool = True

    def build(self, method_cfg: Any) -> EvictionMethod:
        """CAKE and the allocation / indicator combinations of its Tables 2, 3 and 14."""
        indicator, allocation, preference, adjust = self.indicator, self.allocation, self.preference, self.adjust
        knobs = common_knobs(method_cfg, self)
        options = score_options(self, reference_gqa_reduce="after_pool")
        window, kernel, pooling = knobs["window"], int(self.kernel_size), str(self.pooling)
        scorer: TokenScorer
        policy: DecodePolicy | None = None
        dtype, on_append = options.score_dtype, self.evict_on_append
        if indicator == "h2o":
            scorer = AllRowsScorer(options)
            policy = HeavyHitterDecode(window, score_dtype=dtype, evict_on_append=on_append)
        elif indicator == "tova":
            scorer = LastQueryScorer(head_average=True, score_dtype=dtype)
            policy = CurrentAttentionDecode(head_average=True, score_dtype=dtype)
        elif indicator == "snapkv":
            scorer = WindowVoteScorer(options)
            policy = CakeDecode(window, kernel, pooling, options.gqa_reduce, dtype, on_append)
        else:
            scorer = CakeScorer(float(self.gamma), options, indicator)
            policy = CakeDecode(window, kernel, pooling, options.gqa_reduce, dtype, on_append)
        allocator: LayerBudgetAllocator
        if allocation == "p2a":
            allocator = CakeLayerAllocator(
                window, self.tau1, self.tau2, self.model, self.cascading, preference, adjust, options.score_dtype
            )
        elif allocation == "uniform":
            allocator = UniformLayerAllocator()
        elif allocation == "pyramid":
            allocator = PyramidLayerAllocator(self.beta, window)
        else:
            allocator = RandomLayerAllocator(window, self.seed)
        return EvictionMethod(
            scorer=scorer,
            layer_allocator=allocator,
            decode_policy=policy if self.decode_eviction else None,
            settings={
                "indicator": indicator,
                "allocation": allocation,
                "cascading": self.cascading,
                "adjust": adjust,
                "gqa_reduce": options.gqa_reduce,
                "evict_on_append": on_append,
            },
            **knobs,
        )
