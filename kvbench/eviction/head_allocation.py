"""Ada-KV's head-wise adaptive budget allocation (Feng et al., arXiv 2407.11550), a piece over any scorer: the
``ada_snapkv`` / ``ada_pyramidkv`` families (:mod:`kvbench.methods.adakv`) and the ``allocation: ada`` wrapper
(:mod:`kvbench.eviction.wrappers`) split a layer's budget over its heads with :class:`AdaHeadAllocator`.

Reproduces FFY0/AdaKV ``adaptive_snapkv/monkeypatch/snapkv_utils.py`` (``AdaptiveSnapKVCluster``):

* Head capacities in a layer (:func:`ada_capacities`): ``base = budget - W`` candidates per head; nothing is
  evicted when ``base > S - W``.  Each head's scores sorted descending (optionally ``normalize``: each sorted row
  scaled by ``sum(top base) / sum(all)``, KVCache-Factory's AdaKV default), all heads flattened, one top-``H x base``;
  head ``h`` picks ``n_h`` of them.  Safeguard (``reading``):

  - ``floor`` (the code's ``floor_alpha``, default): ``c_h = round(n_h (1 - alpha) + int(base alpha))``;
  - ``adaptive`` (the papers' printed formula): ``c_h = round(n_h alpha + int(base (1 - alpha)))``.

  ``round`` is the code's float32 ``torch.round`` (half to even); the sum may drift from ``H x base``.
  With ``score_dtype=model`` on a bf16/fp16 model the count runs as the code's does in that dtype: each head's scores
  sorted, the ``normalize`` weight and product in the model dtype, one ``topk`` over the sorted rows laid end to end
  (the layout decides which head wins a tie at the cut); float32 scoring is unchanged.
  ``rounding: largest_remainder`` is kvbench's sum-preserving variant.  Each head keeps its own top ``c_h``
  candidates plus the window.
"""

from __future__ import annotations

import math

import torch

from kvbench.checks import check_choice, check_range
from kvbench.eviction.base import HeadBudgetAllocator

ALPHA_READINGS = ("floor", "adaptive")
ROUNDINGS = ("reference", "largest_remainder")
#: The safeguard each paper version uses: early (arXiv v1/v2) 0.5, late (v4, and the reference code) 0.2.
PAPER_ALPHA = {"early": 0.5, "late": 0.2}
PAPER_VERSIONS = tuple(PAPER_ALPHA)


def adaptive_counts(
    scores: torch.Tensor,
    budget: int,
    normalize: bool = False,
    base: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> list[int]:
    """Algorithm 1: per-head counts of the top ``budget`` entries of ``[H, n]`` scores over all heads at once.

    ``-inf`` entries (padding) are never selected while finite ones remain.  With ``normalize`` each head's scores
    are first scaled by ``sum(top base) / sum(all)`` of that head (``base`` defaults to ``budget // H``).  A
    ``dtype`` other than float32 counts as the reference code does in it (:func:`_counts_in_model_dtype`).
    """
    if dtype not in (torch.float32, torch.float64):
        return _counts_in_model_dtype(
            scores, budget, normalize, budget // scores.shape[0] if base is None else base, dtype
        )
    if normalize:
        base = budget // scores.shape[0] if base is None else base
        finite = torch.where(torch.isfinite(scores), scores, torch.zeros_like(scores))
        ranked = torch.sort(finite, dim=-1, descending=True).values
        weight = ranked[:, :base].sum(dim=-1, keepdim=True) / ranked.sum(dim=-1, keepdim=True)
        scores = torch.where(torch.isfinite(scores), scores * weight, scores)
    flat = scores.reshape(-1)
    budget = min(budget, int(torch.isfinite(flat).sum()))
    if budget <= 0:
        return [0] * scores.shape[0]
    top = torch.topk(flat, budget).indices
    return torch.bincount(top // scores.shape[1], minlength=scores.shape[0]).tolist()


def _counts_in_model_dtype(
    scores: torch.Tensor, budget: int, normalize: bool, base: int, dtype: torch.dtype
) -> list[int]:
    """:func:`adaptive_counts` in ``dtype``, in the op order of ``AdaptiveSnapKVCluster.update_kv``: each head's
    scores sorted descending, ``[1, H, C]`` (``C`` = the most selectable tokens of a head); with ``normalize`` the
    rows times ``sum(top base) / sum(row)`` (sums, quotient and product in ``dtype``); the rows laid end to end,
    ``[1, H C]``, one ``topk``; a winner's index ``// C`` is its head."""
    ranked = torch.sort(scores.to(dtype), dim=-1, descending=True).values[None]  # [1, H, S], -inf last
    width = max(int(torch.isfinite(ranked).sum(dim=-1).max()), 1)
    ranked = ranked[..., :width]
    if normalize:
        finite = torch.where(torch.isfinite(ranked), ranked, torch.zeros_like(ranked))
        weight = finite[..., :base].sum(dim=-1, keepdim=True) / finite.sum(dim=-1, keepdim=True)
        ranked = torch.where(torch.isfinite(ranked), ranked * weight, ranked)
    flat = ranked.reshape(1, -1)
    budget = min(budget, int(torch.isfinite(flat).sum()))
    if budget <= 0:
        return [0] * scores.shape[0]
    top = torch.topk(flat, budget, dim=-1).indices[0]
    return torch.bincount(top // width, minlength=scores.shape[0]).tolist()


def ada_capacities(
    candidates: torch.Tensor,
    base: int,
    alpha: float,
    reading: str = "floor",
    normalize: bool = False,
    dtype: torch.dtype = torch.float32,
) -> list[int]:
    """Per-head candidate counts ``c_h`` of the reference code (module docstring) for ``[H, C]`` scores.

    ``candidates`` may hold ``-inf`` padding (never selected); ``base`` is the per-head candidate budget; ``dtype``:
    the dtype the scores are counted in (:func:`adaptive_counts`).
    """
    counts = torch.tensor(adaptive_counts(candidates, candidates.shape[0] * base, normalize, base, dtype))
    if reading == "floor":  # floor_capacity = int(base * alpha); the rest is adaptive
        adaptive_share, floor = 1 - alpha, int(base * alpha)
    else:
        adaptive_share, floor = alpha, int(base * (1 - alpha))
    # float32 arithmetic and half-to-even rounding, as the reference's int-tensor x python-float expression.
    return torch.round(counts * adaptive_share + floor).int().tolist()


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


class AdaHeadAllocator(HeadBudgetAllocator):
    """Ada-KV's head-wise adaptive allocation with the safeguard (see module docstring).

    Parameters
    ----------
    alpha:
        Safeguard value in ``[0, 1]``.
    reading:
        ``floor`` (alpha = uniform share, official code) or ``adaptive`` (alpha = adaptive share, paper formula).
    normalize:
        Scale each head's sorted scores by its top-``base`` share before the global top-k.
    rounding:
        ``reference`` (the code's per-head rounding) or ``largest_remainder`` (kvbench: the layer total is exact).
    score_dtype:
        ``model``: on a bf16/fp16 model the counts are made in its dtype, as the reference's (:meth:`allocate_for`);
        ``float32``: always in float32.
    """

    def __init__(
        self, alpha: float, reading: str, normalize: bool = False, rounding: str = "reference",
        score_dtype: str = "float32",
    ) -> None:  # fmt: skip
        check_choice("method.params.alpha_reading", reading, ALPHA_READINGS)
        check_choice("method.params.rounding", rounding, ROUNDINGS)
        check_range("method.params.alpha", alpha, 0.0, 1.0)
        self.alpha = alpha
        self.reading = reading
        self.normalize = normalize
        self.rounding = rounding
        self.score_dtype = score_dtype

    @property
    def uniform_share(self) -> float:
        """Share of each head's budget that is uniform (the floor)."""
        return self.alpha if self.reading == "floor" else 1.0 - self.alpha

    def allocate(self, scores: torch.Tensor, budget_per_head: int) -> list[int]:
        """Per-head counts for ``[H, S]`` scores (``+inf`` protected, ``-inf`` padding); protected tokens included."""
        return self._allocate(scores, budget_per_head, torch.float32)

    def allocate_for(self, scores: torch.Tensor, budget_per_head: int, model_dtype: torch.dtype) -> list[int]:
        """:meth:`allocate`, counting in ``model_dtype`` when ``score_dtype`` is ``model`` (module docstring)."""
        return self._allocate(scores, budget_per_head, model_dtype if self.score_dtype == "model" else torch.float32)

    def _allocate(self, scores: torch.Tensor, budget_per_head: int, dtype: torch.dtype) -> list[int]:
        protected = torch.isposinf(scores).sum(dim=1).tolist()  # [H]
        candidates = torch.where(torch.isposinf(scores), float("-inf"), scores)  # only the selectable tokens
        available = torch.isfinite(candidates).sum(dim=1).tolist()  # [H]
        base = budget_per_head - max(protected)
        if base <= 0:
            return [min(budget_per_head, p) for p in protected]
        if base > max(available):  # the reference compresses nothing when base > S - W
            return [p + a for p, a in zip(protected, available, strict=True)]
        if self.rounding == "reference":
            counts = ada_capacities(candidates, base, self.alpha, self.reading, self.normalize, dtype)
        else:
            counts = self._largest_remainder(candidates, base, available, dtype)
        return [p + min(c, a) for p, c, a in zip(protected, counts, available, strict=True)]

    def _largest_remainder(
        self, candidates: torch.Tensor, base: int, available: list[int], dtype: torch.dtype
    ) -> list[int]:
        num_heads = candidates.shape[0]
        layer_budget = base * num_heads
        counts = adaptive_counts(candidates, layer_budget, self.normalize, base, dtype)
        frequencies = torch.tensor(counts, dtype=torch.float64)
        blended = (1.0 - self.uniform_share) * frequencies + self.uniform_share * base
        counts = largest_remainder(blended, min(layer_budget, sum(available)))
        return _spill_over(counts, available, candidates)


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
