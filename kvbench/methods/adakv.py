"""Ada-KV (Feng et al., arXiv 2407.11550): head-wise adaptive budget allocation, as Ada-SnapKV and Ada-Pyramid.

Reproduces FFY0/AdaKV ``adaptive_snapkv/monkeypatch/snapkv_utils.py`` (``AdaptiveSnapKVCluster``), run as
``experiments/LongBench/GQA_eval_longbench.sh`` (window 32, max pooling 7, ``floor_alpha`` 0.2, ``gqa_support``
with ``gqa_func=mean``, ``normalize`` off, ``skip`` 0):

* Indicator: window attention over all keys (causal in the window, float32 softmax), **mean** over the window
  rows, candidates ``[0, S - W)`` only, GQA group mean (``kv_head``; the early paper replicates KV per query head,
  ``gqa_granularity=query_head``), then max pooling (kernel 7) -- :class:`~kvbench.methods.snapkv.WindowVoteScorer`
  with ``row_reduce="mean"``.
* Head capacities in a layer: :class:`~kvbench.eviction.head_allocation.AdaHeadAllocator` (the allocation math,
  a piece shared with the ``allocation: ada`` wrapper over any scorer): ``params.alpha_reading`` picks the
  safeguard's reading (``floor``, the code's, or ``adaptive``, the papers' formula), ``params.normalize`` and
  ``params.rounding`` (``largest_remainder``: kvbench's sum-preserving variant) its switches; with
  ``method.params.score_dtype=model`` on a bf16/fp16 model the counts run in the model dtype, as the code's.
* ``params.alpha = null`` takes the paper version's value (``params.paper_version``: ``early`` 0.5, ``late`` 0.2,
  the default: the reference code's ``floor_alpha``); the presets set it (``ada_snapkv_paper_early`` and
  ``ada_pyramidkv_paper_early`` for the early tables), the run tag does not.
* Ada-Pyramid: PyramidKV's layer schedule in AdaKV's ``pyram_mode`` variant (no uniform branch, beta 20).  The
  reference computes that schedule once, from the first sample's length, and reuses it for every later sample of
  the run (its ``pyram_init`` flag is never reset); kvbench recomputes it per sample.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from kvbench.eviction.base import EvictionMethod, common_knobs, score_options
from kvbench.eviction.family import FamilyMethod
from kvbench.eviction.head_allocation import (  # the allocation math (re-exported: importable from here as before)
    ALPHA_READINGS,
    PAPER_ALPHA,
    PAPER_VERSIONS,
    ROUNDINGS,
    AdaHeadAllocator,
    ada_capacities,
    adaptive_counts,
    largest_remainder,
)
from kvbench.eviction.layer_schedules import PYRAMID_SCHEDULES, PyramidLayerAllocator
from kvbench.eviction.params import bounded, choice
from kvbench.eviction.token_scores import VoteKnobs
from kvbench.methods.snapkv import WindowVoteScorer

__all__ = [
    "PAPER_ALPHA",
    "AdaHeadAllocator",
    "AdaKV",
    "AdaPyramidKV",
    "AdaSnapKV",
    "ada_capacities",
    "adaptive_counts",
    "largest_remainder",
    "resolve_alpha",
]


@dataclass(frozen=True)
class AdaKV(VoteKnobs, FamilyMethod):
    """Ada-KV's safeguard and allocation switches (see module docstring); its families are :class:`AdaSnapKV` and
    :class:`AdaPyramidKV`."""

    #: Safeguard value; null = the paper version's value (early 0.5, late 0.2).
    alpha: float | None = bounded(None, 0.0, 1.0)
    #: ``floor`` (alpha is the uniform floor share; official code) or ``adaptive`` (paper formula).
    alpha_reading: str = choice("floor", ALPHA_READINGS)
    #: ``late`` (arXiv v4 and the reference code, alpha 0.2) or ``early`` (v1/v2, alpha 0.5): the default of ``alpha``.
    paper_version: str = choice("late", PAPER_VERSIONS)
    #: Scale each head's sorted scores by its top-base share (KVCache-Factory's AdaKV default; off in AdaKV's code).
    normalize: bool = False
    #: ``reference`` (per-head float32 rounding, total may drift) or ``largest_remainder`` (exact layer total).
    rounding: str = choice("reference", ROUNDINGS)
    #: PyramidKV slope and schedule (Ada-Pyramid only).
    beta: int = bounded(20, low=1)
    schedule: str = choice("adakv", PYRAMID_SCHEDULES)

    #: Whether PyramidKV's layer schedule splits the budget over layers (Ada-Pyramid) or it is uniform (Ada-SnapKV).
    pyramid: ClassVar[bool] = False

    def build(self, method_cfg: Any) -> EvictionMethod:
        """SnapKV's indicator (window rows averaged), Ada-KV head allocation; PyramidKV's layer schedule when
        :attr:`pyramid`."""
        alpha = resolve_alpha(self)
        options = score_options(self)
        settings: dict[str, Any] = {
            "alpha": alpha,
            "alpha_reading": self.alpha_reading,
            "normalize": self.normalize,
            "rounding": self.rounding,
            "gqa_reduce": options.gqa_reduce,
        }
        layers: dict[str, Any] = {}
        if self.pyramid:
            layers["layer_allocator"] = PyramidLayerAllocator(self.beta, int(self.window), self.schedule)
            settings.update(beta=self.beta, schedule=self.schedule)
        return EvictionMethod(
            scorer=WindowVoteScorer(options, row_reduce="mean"),
            head_allocator=AdaHeadAllocator(
                alpha, self.alpha_reading, self.normalize, self.rounding, options.score_dtype
            ),
            settings=settings,
            **layers,
            **common_knobs(method_cfg, self),
        )


@dataclass(frozen=True)
class AdaSnapKV(AdaKV, family="ada_snapkv"):
    """Ada-SnapKV: SnapKV's indicator and uniform layer budgets, Ada-KV head allocation."""


@dataclass(frozen=True)
class AdaPyramidKV(AdaKV, family="ada_pyramidkv"):
    """Ada-Pyramid: PyramidKV's layer schedule, Ada-KV head allocation."""

    pyramid: ClassVar[bool] = True


def resolve_alpha(params: AdaKV) -> float:
    """The safeguard value after applying the paper-version default."""
    if params.alpha is not None:
        return float(params.alpha)
    return PAPER_ALPHA[params.paper_version]
