"""SnapKV's family class (``family: snapkv``: the presets ``snapkv``, ``snapkv_kvpress``): the window vote of
:mod:`kvbench.methods.snapkv` with uniform budgets, under the wrappers over any scorer
(:mod:`kvbench.methods.wrappers`).

Apart from :mod:`kvbench.methods.snapkv` because it composes the wrappers, whose module imports Ada-KV's allocator,
whose module imports SnapKV's scorer: one direction, no import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvbench.methods.base import EvictionMethod, UniformLayerAllocator, common_knobs, score_options
from kvbench.methods.family import FamilyMethod
from kvbench.methods.params import choice
from kvbench.methods.snapkv import WindowVoteScorer
from kvbench.methods.token_scores import VoteKnobs
from kvbench.methods.wrappers import WrapperKnobs, apply_wrappers, wrappers_on


@dataclass
class SnapKV(WrapperKnobs, VoteKnobs, FamilyMethod, family="snapkv"):  # type: ignore[misc,valid-type]
    """SnapKV's knobs: the attention vote's pooling, precision and GQA-reduction order (besides the session's window
    and GQA storage), then the wrappers over any scorer (:mod:`kvbench.methods.wrappers`: ``allocation=ada_kvpress``
    is kvpress's ``AdaKVPress(SnapKVPress())``, ``selection=chunkkv`` its ``ChunkKVPress(SnapKVPress())``)."""

    #: How the window rows' attention is reduced: ``sum`` (SnapKV's code) or ``mean`` (kvpress's ``SnapKVPress``).
    #: The same ranking for a top-k (a wrapper that ranks within a layer too); CriticalKV's rescaling is not
    #: scale-free, so kvpress's ``CriticalKVPress(SnapKVPress())`` is ``rescale=critical row_reduce=mean``.
    row_reduce: str = choice("sum", ("sum", "mean"))

    def build(self, method_cfg: Any) -> EvictionMethod:
        """SnapKV: window vote + pooling, uniform budgets, under the wrappers that are on."""
        options = score_options(method_cfg, self)
        method = EvictionMethod(
            scorer=WindowVoteScorer(options, self.row_reduce),
            layer_allocator=UniformLayerAllocator(),
            settings={
                "gqa_reduce": options.gqa_reduce,
                **({"row_reduce": self.row_reduce} if self.row_reduce != "sum" else {}),
                **wrappers_on(self),
            },
            **common_knobs(method_cfg),
        )
        return apply_wrappers(method, self)
