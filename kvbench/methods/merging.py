"""Merge-on-evict over any scorer: NVIDIA/kvpress 0.5.5's ``MergingPress`` (issue #58).

Reproduces ``kvpress/presses/merging_press.py``: the wrapped scorer picks the kept tokens as usual (its top-k at the
budget); before the evicted ones are dropped, each evicted token's *value* is folded into the kept token whose key is
the most cosine-similar (keys unchanged: RoPE-safe), weighted by that similarity (clamped at 0) and by the evicted
value's share of the two value norms, ``w = sim * |v_e| / (|v_e| + |v_t| + eps)``; a kept value that received
contributions becomes ``(v_t + sum w v_e) / (1 + sum w)`` (float32, cast back to the cache's dtype).  Gates:
``similarity_threshold`` (merge only at a similarity of at least it) and ``merge_fraction`` (only the evicted tokens
whose similarity reaches the ``1 - merge_fraction`` quantile of those that pass, ``torch.quantile`` as kvpress).

The cache then holds values no token produced: the kept tokens' values are rewritten in the cache layer
(:meth:`kvbench.cache.base.LogicalLengthLayer.rewrite_values`, torch and paged backends, the batched pool), which
stores exactly what an evicting method stores at the same kept count (the same bytes).

``method=merging`` (``conf/method/merging.yaml``: KNorm); ``method.params.press`` picks the scorer (its knobs ride
along).  The merge runs over the kept tokens in kvpress's top-k order (score descending, equal scores by position), so
that the float sums round as kvpress's.  Parity:
``tests/methods/test_merging.py`` (recordings ``MergingPress_*``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from kvbench.eviction.base import EvictionMethod, ValueMerger
from kvbench.eviction.over_press import OverPress
from kvbench.eviction.params import bounded

if TYPE_CHECKING:  # type hints only: importing the cache would import transformers
    from kvbench.cache.kv_cache import HeadwiseLayer

REFERENCE = "NVIDIA/kvpress kvpress/presses/merging_press.py@0.5.5 (MergingPress)"
#: kvpress's epsilon (safe for float16 and bfloat16).
EPS = 1e-6


def merge_values(
    keys: torch.Tensor, values: torch.Tensor, kept: torch.Tensor, similarity_threshold: float, merge_fraction: float
) -> torch.Tensor:
    """The kept tokens' values after folding the evicted ones into them (module docstring).

    Parameters
    ----------
    keys, values:
        ``[H, S, D]`` the layer's stored keys and values before the eviction.
    kept:
        ``[H, n]`` int64 the kept slots of each head (any order; the result follows it).

    Returns
    -------
    ``[H, n, D]`` the kept values, in ``values``' dtype.
    """
    heads, length, dim = keys.shape
    n_kept = kept.shape[1]
    if n_kept in (0, length):
        return values.gather(1, kept[..., None].expand(-1, -1, dim))
    evict_mask = torch.ones(heads, length, dtype=torch.bool, device=keys.device).scatter(1, kept, False)
    evicted = evict_mask.nonzero()[:, 1].reshape(heads, length - n_kept)  # ascending positions
    kept_index, evicted_index = kept[..., None].expand(-1, -1, dim), evicted[..., None].expand(-1, -1, dim)
    kept_keys, evicted_keys = keys.gather(1, kept_index).float(), keys.gather(1, evicted_index).float()
    kept_values, evicted_values = values.gather(1, kept_index), values.gather(1, evicted_index)
    kept_keys = kept_keys / kept_keys.norm(dim=-1, keepdim=True).clamp(min=EPS)
    evicted_keys = evicted_keys / evicted_keys.norm(dim=-1, keepdim=True).clamp(min=EPS)
    similarity, target = (evicted_keys @ kept_keys.transpose(-2, -1)).max(dim=-1)  # [H, n_e]: the nearest kept key
    merge = similarity >= similarity_threshold
    if merge_fraction < 1.0 and bool(merge.any()):
        gate = similarity.masked_fill(~merge, float("-inf")).quantile(1.0 - merge_fraction, dim=-1, keepdim=True)
        merge = merge & (similarity >= gate)
    weights = similarity.clamp(min=0) * merge.float()
    target_norm = kept_values.float().norm(dim=-1).gather(1, target)
    evicted_norm = evicted_values.float().norm(dim=-1)
    weights = weights * evicted_norm / (evicted_norm + target_norm + EPS)
    value_sum = torch.zeros(heads, n_kept, dim, dtype=torch.float32, device=keys.device)
    value_sum.scatter_add_(1, target[..., None].expand(-1, -1, dim), weights[..., None] * evicted_values.float())
    weight_sum = torch.zeros(heads, n_kept, dtype=torch.float32, device=keys.device).scatter_add_(1, target, weights)
    merged = ((kept_values.float() + value_sum) / (1.0 + weight_sum)[..., None]).to(values.dtype)
    return torch.where((weight_sum > 0)[..., None], merged, kept_values)


class CosineValueMerger(ValueMerger):
    """MergingPress's merge as a method piece (:func:`merge_values`, over every head at once when the heads are
    alike, head by head otherwise)."""

    def __init__(self, similarity_threshold: float, merge_fraction: float) -> None:
        self.similarity_threshold, self.merge_fraction = similarity_threshold, merge_fraction

    def merged_values(self, layer: HeadwiseLayer, kept: list[torch.Tensor], scores: torch.Tensor) -> list[torch.Tensor]:
        """Merged over the kept slots in kvpress's top-k order (score descending, equal scores by slot: the float
        sums round alike), returned in ascending slot order."""
        kept = [slots[scores[head, slots].argsort(descending=True, stable=True)] for head, slots in enumerate(kept)]
        gates = (self.similarity_threshold, self.merge_fraction)
        if not layer.is_ragged and len({int(k.numel()) for k in kept}) == 1:
            keys, values = layer.dense_kv()
            merged = list(merge_values(keys, values, torch.stack(kept).long(), *gates).unbind(0))
        else:
            merged = []
            for head, slots in enumerate(kept):
                keys, values = layer.head_kv(head)
                merged.append(merge_values(keys[None], values[None], slots.long()[None], *gates)[0])
        return [head_values[slots.argsort()] for head_values, slots in zip(merged, kept, strict=True)]


@dataclass(frozen=True)
class Merging(OverPress, family="merging"):
    """MergingPress's knobs; the wrapped scorer (``press``) and the budget pick the kept tokens."""

    #: Merge an evicted value only at a cosine similarity of at least this (kvpress's ``similarity_threshold``).
    similarity_threshold: float = bounded(0.0, 0.0, 1.0)
    #: The share of the evicted tokens (the most similar of those past the threshold) merged (kvpress's
    #: ``merge_fraction``, in ``(0, 1]``).
    merge_fraction: float = bounded(1.0, 0.0, 1.0, low_open=True)

    def build(self, method_cfg: Any) -> EvictionMethod:
        """The wrapped scorer's method, its evicted values merged into the kept ones."""
        inner = self.build_inner(method_cfg)
        return dataclasses.replace(
            inner,
            family=self.family,
            value_merger=CosineValueMerger(self.similarity_threshold, self.merge_fraction),
            settings=self.settings_of(inner, REFERENCE),
        )
