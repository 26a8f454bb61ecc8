"""XKV (Li et al.): personalised per-layer KV budgets that maximise the mean importance-retention ratio.

* Token importance ``w_i`` of layer ``i`` (Algorithm 2, Fig. 8): window attention (last ``ows`` = 8 queries, causal
  in the window, fp32), restricted to the past ``t - ows`` keys, **mean** over the window rows, **average**
  pooling (``ps`` = 7).  Head granularity (``params.head_mode``): ``layer_shared`` (default, the paper's literal
  one vector per layer: every head keeps the same tokens) or ``per_head`` (SnapKV-style per stored head; the
  allocation still uses the head-averaged ``w_i``).
* Retention ratio ``R_i(n) = sum(top_n(w_i)) / sum(w_i)``, concave in ``n``.
* Allocation (Algorithm 1, corrected as in the spec): the greedy that repeatedly gives one token to the layer
  whose next-best normalised score is largest -- the exact optimum of ``max mean R s.t. sum n_i = N`` -- computed
  as a stable global top-N (ties to the lowest layer).  Dual (Eq. 18, ``params.target_retention``): the fewest
  tokens whose mean retention reaches the target.  ``N = B_total - L * ows``: every layer also keeps its window
  (budget ``ows + n_i``), so layer budgets sum to the total (no minimum per layer, at most ``t - ows``).
* The allocation needs every layer: the allocator returns nothing until the last layer, then all budgets (the
  accuracy-equivalent one-pass form of mini-prefill + prefill; the prefill peak is the full cache).
* Sampling mode (``params.sampling``): the first ``ceil(sample_ratio x task samples)`` samples of a task run
  the full XKV and record each layer's share ``n_i / N``; later samples reuse the averaged shares, rescaled to
  their ``N`` by largest remainder, and evict layer by layer without scoring the allocation.  The task size comes
  from the dataset the runner runs (the dataset's :class:`XKVCalibration`, the declared home of this state, which
  the runner creates per dataset and passes to every sample's session), else ``params.task_samples``.
* No decode-time eviction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kvbench.eviction.base import (
    AllocatorState,
    EvictionMethod,
    LayerBudgetAllocator,
    TokenScorer,
    WindowObservation,
    common_knobs,
    score_options,
)
from kvbench.eviction.family import FamilyMethod
from kvbench.eviction.params import bounded, choice
from kvbench.eviction.token_scores import PoolingKnobs, ScoreOptions, aggregate_groups

HEAD_MODES = ("layer_shared", "per_head")


def importance(observation: WindowObservation, options: ScoreOptions) -> torch.Tensor:
    """``[H_q, t - ows]`` pooled window-mean attention over the past keys (``options``: kernel, pooling, padding)."""
    past = observation.context_length - observation.window
    mean = observation.window_stats().mean[:, : max(past, 0)]  # [H_q, t-ows], float32 (no model-dtype rounding)
    return options.pool(mean) if past > 0 else mean


class XKVScorer(TokenScorer):
    """XKV's importance per stored head (``per_head``) or shared by the layer's heads (``layer_shared``)."""

    def __init__(self, options: ScoreOptions, head_mode: str) -> None:
        self.options = options
        self.head_mode = head_mode

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """``[H, S]``; the window columns are 0 (protected by the session)."""
        heads = observation.keys.shape[0]
        pooled = importance(observation, self.options)
        if self.head_mode == "layer_shared":
            per_head = pooled.mean(dim=0, keepdim=True).expand(heads, -1)
        else:
            per_head = aggregate_groups(pooled, heads, self.options.gqa_agg)
        scores = torch.zeros(heads, observation.context_length, device=per_head.device)
        scores[:, : per_head.shape[1]] = per_head
        return scores


def _normalised_sorted(scores: list[torch.Tensor]) -> list[torch.Tensor]:
    out = []
    for w in scores:
        w = w.double().cpu().clamp_min(0)  # layers may live on different devices (model.device_map)
        total = float(w.sum())
        w = w / total if total > 0 else torch.full_like(w, 1.0 / max(w.numel(), 1))
        out.append(torch.sort(w, descending=True).values)
    return out


def xkv_allocate(scores: list[torch.Tensor], total: int) -> list[int]:
    """Algorithm 1 (budget form): ``n_i`` maximising ``mean_i R_i(n_i)`` with ``sum n_i = total``.

    ``scores``: per layer a 1-D tensor ``w_i``.  Equivalent to the greedy (a global top-``total`` of the
    per-layer-normalised scores, each layer's taken in descending order; ties go to the lowest layer).
    """
    ranked = _normalised_sorted(scores)
    flat = torch.cat(ranked) if ranked else torch.zeros(0, dtype=torch.float64)
    layer_ids = torch.cat([torch.full((r.numel(),), i, dtype=torch.long) for i, r in enumerate(ranked)])
    total = max(0, min(total, flat.numel()))
    order = torch.sort(flat, descending=True, stable=True).indices[:total]
    return torch.bincount(layer_ids[order], minlength=len(scores)).tolist()


def xkv_allocate_for_retention(scores: list[torch.Tensor], target: float) -> list[int]:
    """Algorithm 1 (accuracy form, Eq. 18): the fewest tokens whose mean retention ratio reaches ``target``."""
    ranked = _normalised_sorted(scores)
    num_layers = len(ranked)
    flat = torch.cat(ranked)
    layer_ids = torch.cat([torch.full((r.numel(),), i, dtype=torch.long) for i, r in enumerate(ranked)])
    order = torch.sort(flat, descending=True, stable=True).indices
    reached = torch.cumsum(flat[order], 0) / num_layers  # mean R after each greedy step
    hits = torch.nonzero(reached >= target - 1e-12)
    steps = int(hits[0]) + 1 if hits.numel() else flat.numel()
    return torch.bincount(layer_ids[order[:steps]], minlength=num_layers).tolist()


def mean_retention(scores: list[torch.Tensor], allocation: list[int]) -> float:
    """``mean_i R_i(n_i)`` of an allocation (fractions)."""
    ranked = _normalised_sorted(scores)
    return sum(float(r[:n].sum()) for r, n in zip(ranked, allocation, strict=True)) / len(ranked)


def rescale_shares(shares: list[float], total: int, caps: list[int]) -> list[int]:
    """Largest-remainder integers proportional to ``shares`` summing to ``total`` (each at most its cap)."""
    exact = [s * total for s in shares]
    counts = [min(math.floor(x), cap) for x, cap in zip(exact, caps, strict=True)]
    order = sorted(range(len(shares)), key=lambda i: (-(exact[i] - math.floor(exact[i])), i))
    remainder = total - sum(counts)
    while remainder > 0 and any(c < cap for c, cap in zip(counts, caps, strict=True)):
        for layer in order:
            if remainder == 0:
                break
            if counts[layer] < caps[layer]:
                counts[layer] += 1
                remainder -= 1
    return counts


@dataclass
class XKVCalibration:
    """The declared home of XKV's sampled mode across one dataset: the runner creates it per dataset
    (:meth:`XKVLayerAllocator.new_dataset_state`, i.e. ``LayerBudgetAllocator.new_dataset_state``) and passes it to
    every sample's session; the first ``calibration_samples`` samples add their shares, later ones reuse the average.

    Attributes
    ----------
    calibration_samples:
        ``ceil(sample_ratio x dataset samples)`` (at least 1).
    recorded_shares:
        Per calibrated sample, each layer's share ``n_i / N``, in dataset order.
    shared_shares:
        Their average once ``calibration_samples`` samples calibrated, else ``None``.
    allocations:
        Per sample of the dataset so far, its per-layer allocation ``n_i`` (window excluded; for inspection).
    """

    calibration_samples: int
    recorded_shares: list[list[float]] = field(default_factory=list)
    shared_shares: list[float] | None = None
    allocations: list[list[int]] = field(default_factory=list)

    def record(self, shares: list[float]) -> None:
        """Add one calibration sample's shares; the average is fixed once enough samples have calibrated."""
        self.recorded_shares.append(shares)
        if len(self.recorded_shares) >= self.calibration_samples:
            count = len(self.recorded_shares)
            self.shared_shares = [sum(col) / count for col in zip(*self.recorded_shares, strict=True)]


@dataclass
class XKVState(AllocatorState):
    """One sample's XKV allocation: every layer's ``w_i`` so far (``[t - ows]`` each), the pool ``N``, the per-layer
    caps, the planned allocation when it reuses the sampled shares, and its calibration shares when it calibrated.
    ``dataset`` is the :class:`XKVCalibration` of its dataset."""

    pool: int = 0
    caps: list[int] = field(default_factory=list)
    layer_scores: list[torch.Tensor] = field(default_factory=list)
    planned: list[int] | None = None
    calibrated: list[float] | None = None


class XKVLayerAllocator(LayerBudgetAllocator):
    """Collects every layer's ``w_i``, then allocates (or reuses the sampled allocation)."""

    def __init__(
        self,
        window: int,
        options: ScoreOptions,
        target_retention: float | None = None,
        sampling: bool = False,
        sample_ratio: float = 0.1,
        task_samples: int = 200,
    ) -> None:
        self.window = window
        self.options = options
        self.target_retention = target_retention
        self.sampling = sampling
        self.sample_ratio = sample_ratio
        self.task_samples = task_samples

    def new_dataset_state(
        self, name: str, num_samples: int, finished: Sequence[dict[str, Any] | None] = ()
    ) -> XKVCalibration:
        """A dataset's calibration: the first ``ceil(ratio x num_samples)`` samples calibrate.  ``finished`` (a
        resumed run) re-records the finished samples' shares, so it reuses the allocation the uninterrupted run
        would (never recalibrating on later samples)."""
        calibration = XKVCalibration(max(1, math.ceil(self.sample_ratio * num_samples)))
        for state in finished:
            shares = (state or {}).get("xkv_calibration_shares")
            if shares is not None and self.sampling and calibration.shared_shares is None:
                calibration.record([float(x) for x in shares])
        return calibration

    def new_state(self, total: int, num_layers: int, context_length: int, dataset: Any = None) -> XKVState:
        """A sample's state; without a dataset state (a caller that runs one sample alone) a fresh calibration
        sized by ``params.task_samples``."""
        calibration = dataset if dataset is not None else self.new_dataset_state("", self.task_samples)
        state = XKVState(
            total,
            num_layers,
            context_length,
            dataset=calibration,
            pool=max(total - num_layers * self.window, 0),
            caps=[max(context_length - self.window, 0)] * num_layers,
        )
        if self.sampling and calibration.shared_shares is not None:  # reuse the averaged (sampled) allocation
            state.planned = rescale_shares(calibration.shared_shares, state.pool, state.caps)
            calibration.allocations.append(state.planned)
        return state

    def on_layer(self, state: AllocatorState, observation: WindowObservation) -> dict[int, int]:
        assert isinstance(state, XKVState)
        window = min(self.window, observation.window)
        if state.planned is not None:
            return {observation.layer_idx: state.planned[observation.layer_idx] + window}
        state.layer_scores.append(importance(observation, self.options).mean(dim=0))
        if len(state.layer_scores) < state.num_layers:
            return {}
        if self.target_retention is not None:
            past = xkv_allocate_for_retention(state.layer_scores, self.target_retention)
        else:
            past = xkv_allocate(state.layer_scores, state.pool)
        calibration: XKVCalibration = state.dataset
        calibration.allocations.append(past)
        state.budgets = past
        if self.sampling and calibration.shared_shares is None:
            used = sum(past)
            state.calibrated = [n / used if used else 1.0 / len(past) for n in past]
            calibration.record(state.calibrated)
        return {layer: n + window for layer, n in enumerate(past)}

    def sample_state(self, state: AllocatorState) -> dict[str, Any] | None:
        """The calibration shares of this sample (stored with its prediction), ``None`` when it did not calibrate."""
        assert isinstance(state, XKVState)
        return {"xkv_calibration_shares": state.calibrated} if self.sampling and state.calibrated else None


@dataclass(frozen=True)
class XKV(PoolingKnobs, FamilyMethod, family="xkv"):
    """XKV's switches (see module docstring)."""

    head_mode: str = choice("layer_shared", HEAD_MODES)
    #: Accuracy-constrained form: target mean retention (fraction); null = budget form.
    target_retention: float | None = bounded(None, 0.0, 1.0, low_open=True)
    sampling: bool = False
    sample_ratio: float = bounded(0.1, 0.0, 1.0, low_open=True)
    #: Task size used for the calibration count when no dataset state is passed (LongBench: 200).
    task_samples: int = 200

    def build(self, method_cfg: Any) -> EvictionMethod:
        """XKV: greedy retention-maximising layer budgets over SnapKV-style window scores (avg pooling)."""
        knobs = common_knobs(method_cfg, self)
        options = score_options(self)
        allocator = XKVLayerAllocator(
            knobs["window"], options, self.target_retention, self.sampling, self.sample_ratio,
            self.task_samples,
        )  # fmt: skip
        return EvictionMethod(
            scorer=XKVScorer(options, self.head_mode),
            layer_allocator=allocator,
            settings={"head_mode": self.head_mode, "sampling": self.sampling},
            # XKV's importance is float32 and pooled per query head before any group reduction (paper-only readings).
            ignored_knobs=frozenset({"gqa_agg"}) if self.head_mode == "layer_shared" else frozenset(),
            **knobs,
        )
