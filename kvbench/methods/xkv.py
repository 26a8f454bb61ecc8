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
  from :meth:`begin_task` when the runner calls it, else ``params.task_samples``.
* No decode-time eviction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from kvbench.methods.base import (
    EvictionMethod,
    LayerBudgetAllocator,
    TokenScorer,
    WindowObservation,
    common_knobs,
    register_method,
    score_options,
)
from kvbench.methods.params import bounded, choice, parse_params
from kvbench.methods.token_scores import ScoreOptions, aggregate_groups

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
        self.begin_task("", task_samples)

    def begin_task(self, name: str, num_samples: int) -> None:
        """Reset the sampled allocation: calibrate on the first ``ceil(ratio x num_samples)`` samples."""
        self.calibration_samples = max(1, math.ceil(self.sample_ratio * num_samples))
        self.recorded_shares: list[list[float]] = []
        self.shared_shares: list[float] | None = None
        self.allocations: list[list[int]] = []

    @property
    def reusing(self) -> bool:
        """Whether this sample uses the averaged (sampled) allocation."""
        return self.sampling and self.shared_shares is not None

    def start(self, total: int, num_layers: int, context_length: int) -> None:
        super().start(total, num_layers, context_length)
        self.calibrated: list[float] | None = None  # this sample's shares, when it calibrates
        self.layer_scores: list[torch.Tensor] = []
        self.pool = max(total - num_layers * self.window, 0)
        self.caps = [max(context_length - self.window, 0)] * num_layers
        self.planned: list[int] | None = None
        if self.reusing:
            assert self.shared_shares is not None
            self.planned = rescale_shares(self.shared_shares, self.pool, self.caps)
            self.allocations.append(self.planned)

    def on_layer(self, observation: WindowObservation) -> dict[int, int]:
        window = min(self.window, observation.window)
        if self.planned is not None:
            return {observation.layer_idx: self.planned[observation.layer_idx] + window}
        self.layer_scores.append(importance(observation, self.options).mean(dim=0))
        if len(self.layer_scores) < self.num_layers:
            return {}
        if self.target_retention is not None:
            past = xkv_allocate_for_retention(self.layer_scores, self.target_retention)
        else:
            past = xkv_allocate(self.layer_scores, self.pool)
        self.allocations.append(past)
        if self.sampling and self.shared_shares is None:
            used = sum(past)
            self.calibrated = [n / used if used else 1.0 / len(past) for n in past]
            self._record(self.calibrated)
        return {layer: n + window for layer, n in enumerate(past)}

    def _record(self, shares: list[float]) -> None:
        """Add one calibration sample's shares; the average is fixed once enough samples have calibrated."""
        self.recorded_shares.append(shares)
        if len(self.recorded_shares) >= self.calibration_samples:
            count = len(self.recorded_shares)
            self.shared_shares = [sum(col) / count for col in zip(*self.recorded_shares, strict=True)]

    def sample_state(self) -> dict[str, Any] | None:
        """The calibration shares of this sample (stored with its prediction), ``None`` when it did not calibrate."""
        return {"xkv_calibration_shares": self.calibrated} if self.sampling and self.calibrated else None

    def replay(self, states: list[dict[str, Any] | None]) -> None:
        """A resumed run: re-record the finished samples' calibration shares, so it reuses the allocation the
        uninterrupted run would (never recalibrating on later samples)."""
        for state in states:
            shares = (state or {}).get("xkv_calibration_shares")
            if shares is not None and self.sampling and self.shared_shares is None:
                self._record([float(x) for x in shares])


@dataclass
class XKVParams:
    """XKV's switches (see module docstring)."""

    head_mode: str = choice("layer_shared", HEAD_MODES)
    #: Accuracy-constrained form: target mean retention (fraction); null = budget form.
    target_retention: float | None = bounded(None, 0.0, 1.0, low_open=True)
    sampling: bool = False
    sample_ratio: float = bounded(0.1, 0.0, 1.0, low_open=True)
    #: Task size used for the calibration count when the runner does not call begin_task (LongBench: 200).
    task_samples: int = 200


@register_method("xkv")
def build_xkv(method_cfg: Any) -> EvictionMethod:
    """XKV: greedy retention-maximising layer budgets over SnapKV-style window scores (avg pooling)."""
    params = parse_params(XKVParams, method_cfg.params, "xkv")
    knobs = common_knobs(method_cfg)
    options = score_options(method_cfg)
    allocator = XKVLayerAllocator(
        knobs["window"], options, params.target_retention, params.sampling, params.sample_ratio,
        params.task_samples,
    )  # fmt: skip
    return EvictionMethod(
        scorer=XKVScorer(options, params.head_mode),
        layer_allocator=allocator,
        settings={"head_mode": params.head_mode, "sampling": params.sampling},
        # XKV's importance is float32 and pooled per query head before any group reduction (paper-only readings).
        ignored_knobs=frozenset({"gqa_reduce", "score_dtype"})
        | (frozenset({"gqa_agg"}) if params.head_mode == "layer_shared" else frozenset()),
        **knobs,
    )
