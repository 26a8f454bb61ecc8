"""SnapKV (Li et al., 2024) and PyramidKV (Cai et al., 2024): observation-window voting with pooling.  The family's
story in one file: its score (:class:`WindowVoteScorer`, shared with Ada-KV and CAKE), its class (:class:`SnapKV`:
the presets ``snapkv``, ``snapkv_kvpress``) and PyramidKV's (:class:`PyramidKV`).

Reproduces FasterDecoding/SnapKV ``snapkv/monkeypatch/snapkv_utils.py`` (``SnapKVCluster.update_kv``) and
Zefan-Cai/KVCache-Factory ``pyramidkv/pyramidkv_utils.py`` (``SnapKVCluster``, ``PyramidKVCluster``):

* Indicator: the last ``window`` prompt queries' softmax attention over the keys (causal in the window), **summed**
  over the window rows, restricted to the candidates ``[0, S - W)``, pooled along them (max, kernel 7; average
  pooling counts its padding).  Per query head with ``gqa_granularity=query_head`` (both references' default:
  KV repeated before compression); with ``kv_head`` the group is reduced (``gqa_agg``, mean) **before** pooling,
  as KVCache-Factory's ``kv_cache_granularity=kv_head`` mode.
* Each head keeps its top ``C - W`` candidates plus the window; nothing is evicted when ``S < C``.
* SnapKV is a one-class method (:class:`kvbench.eviction.recipe.ScorerMethod`): the wrappers over any scorer apply to
  it (``allocation=ada_kvpress`` is kvpress's ``AdaKVPress(SnapKVPress())``, ``selection=chunkkv`` its
  ``ChunkKVPress(SnapKVPress())``), and a subclass extends its score (``class VATP(SnapKV)``,
  docs/methods/add-a-method.md).
* PyramidKV's layer schedule (:func:`~kvbench.eviction.layer_schedules.pyramid_schedule`, a piece shared with the
  ``layers: pyramid`` wrapper and Ada-Pyramid) is integer arithmetic, in the variant of KVCache-Factory (default) or
  of AdaKV's ``pyram_mode``; ``params.schedule: sum_preserving`` is kvbench's variant whose total is exactly
  ``L x C``; ``kvpress`` is NVIDIA/kvpress's ``PyramidKVPress`` (:mod:`kvbench.eviction.kvpress_pyramid`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from kvbench.eviction.base import (
    EvictionMethod,
    LayerBudgetAllocator,
    TokenScorer,
    WindowObservation,
    common_knobs,
    score_options,
)
from kvbench.eviction.family import FamilyMethod
from kvbench.eviction.kvpress_pyramid import KvpressPyramidAllocator
from kvbench.eviction.layer_schedules import PYRAMID_SCHEDULES, PyramidLayerAllocator, pyramid_schedule
from kvbench.eviction.params import bounded, choice
from kvbench.eviction.recipe import ScorerMethod
from kvbench.eviction.token_scores import ScoreOptions, VoteKnobs, window_votes, with_window_columns
from kvbench.eviction.wrappers import wrappers_on

__all__ = ["PYRAMID_SCHEDULES", "PyramidKV", "PyramidLayerAllocator", "SnapKV", "WindowVoteScorer", "pyramid_schedule"]


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


@dataclass(frozen=True)
class SnapKV(VoteKnobs, ScorerMethod, family="snapkv"):
    """SnapKV: the window vote (:class:`WindowVoteScorer`) with uniform budgets, under the wrappers that are on.

    Its knobs: the session knobs, the vote's pooling, precision and GQA-reduction order, the wrappers over any scorer
    (:mod:`kvbench.eviction.wrappers`), ``keep_window`` (on: the window is kept on top of each head's top-k) and
    ``row_reduce``."""

    #: Scores from the observation window's attention (kvpress's decoding presses pad its columns with the maximum).
    window_scorer: ClassVar[bool] = True

    #: Keep the observation window on top of each head's top ``C - W`` candidates (SnapKV's code; its scores are 0).
    keep_window: bool = True
    #: How the window rows' attention is reduced: ``sum`` (SnapKV's code) or ``mean`` (kvpress's ``SnapKVPress``).
    #: The same ranking for a top-k (a wrapper that ranks within a layer too); CriticalKV's rescaling is not
    #: scale-free, so kvpress's ``CriticalKVPress(SnapKVPress())`` is ``rescale=critical row_reduce=mean``.
    row_reduce: str = choice("sum", ("sum", "mean"))

    @property
    def options(self) -> ScoreOptions:
        """The vote's resolved options (pooling, precision, GQA-reduction order), as :class:`WindowVoteScorer` holds
        them: what a wrapper reads of the scorer's precision (DMS's threshold in the scores' reference dtype)."""
        return score_options(self)

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """``[H, S]`` SnapKV's pooled window votes per stored head; the window columns are 0 (kept by
        ``keep_window``)."""
        return WindowVoteScorer(self.options, self.row_reduce).score(observation)

    def recipe_settings(self) -> dict[str, Any]:
        """The resolved GQA-reduction order, ``row_reduce`` when not SnapKV's, and the wrappers that are on."""
        return {
            "gqa_reduce": score_options(self).gqa_reduce,
            **({"row_reduce": self.row_reduce} if self.row_reduce != "sum" else {}),
            **wrappers_on(self),
        }


@dataclass(frozen=True)
class PyramidKV(VoteKnobs, FamilyMethod, family="pyramidkv"):
    """PyramidKV's knobs: SnapKV's, the slope and the schedule variant (:func:`pyramid_schedule`)."""

    beta: int = bounded(20, low=1)
    schedule: str = choice("kvcache_factory", PYRAMID_SCHEDULES)

    def build(self, method_cfg: Any) -> EvictionMethod:
        """PyramidKV: SnapKV's indicator with the pyramid layer schedule."""
        options = score_options(self)
        allocator: LayerBudgetAllocator = (  # kvpress: kvbench.eviction.kvpress_pyramid
            KvpressPyramidAllocator(self.beta, int(self.window))
            if self.schedule == "kvpress"
            else PyramidLayerAllocator(self.beta, int(self.window), self.schedule)
        )
        return EvictionMethod(
            scorer=WindowVoteScorer(options),
            layer_allocator=allocator,
            settings={"gqa_reduce": options.gqa_reduce, "beta": self.beta, "schedule": self.schedule},
            **common_knobs(method_cfg, self),
        )
