"""LU-KV (Predicting Future Utility, arXiv 2602.08585) as NVIDIA/kvpress 0.5.5 ships it: ``LUKVPress``, per-layer and
per-head budgets from a precomputed curve around any scorer (issue #58).

Reproduces ``kvpress/presses/lukv_press.py``: a curve ``[99, L, H_kv]`` holds, for each compression ratio
``c`` in 1 % steps (row ``round(100 c) - 1``, clamped to 0..98), the share of each layer's head to prune; head ``h``
of layer ``l`` ideally keeps ``(1 - p_lh) S`` tokens, the layer's total is that sum rounded (at least one token per
head, at most all), each head its floor, the remainder to the heads with the largest fractional parts, every head
at least 1.  Each head keeps its top of the wrapped scorer's scores (``press``), the first ``sink`` and the last
``window`` tokens scored ``max + 1`` (kvpress: a stable descending sort, equal scores to the earlier token).

``c`` is the budget's: ``<c>cr`` is kvpress's ``compression_ratio``; another budget's mean ``n`` per layer is
``c = 1 - n / S``.  The curve (``params.curve``: a ``.npy`` file, LU-KV's format) is model- and scorer-specific:
kvpress downloads it from LU-KV's repository (one curve, Llama-3.1-8B with Expected Attention; the machines here
cannot reach it).  ``curve: null`` (kvbench's switch, the preset's default, so that it runs on any model offline)
is a flat curve: every head prunes ``c``, i.e. the wrapped scorer at the budget with LU-KV's sinks and window.
The curve's layers are the compressible layers (the model's, without sliding-window ones).  ``method=lukv``
(``conf/method/lukv.yaml``).  Parity: ``tests/methods/test_lukv.py`` (recordings ``LUKVPress_*_seeded_curve``: a
seeded stand-in curve in place of the download).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kvbench.budget import Budget
from kvbench.eviction.base import EvictionMethod, LayerBudgetAllocator, PromptRows, TokenScorer, WindowObservation
from kvbench.eviction.over_press import OverPress
from kvbench.eviction.selection import SelectedCountAllocator
from kvbench.eviction.state import AllocatorState
from kvbench.eviction.threshold import in_reference_dtype
from kvbench.eviction.token_scores import aggregate_groups

REFERENCE = "NVIDIA/kvpress kvpress/presses/lukv_press.py@0.5.5 (LUKVPress; LU-KV: baidu-baige/LU-KV)"


def curve_row(compression_ratio: float) -> int:
    """The curve's row of a compression ratio, as kvpress: ``round(100 c) - 1`` clamped to 0..98."""
    return max(0, min(98, round(compression_ratio * 100) - 1))


def lukv_head_counts(prune_ratios: torch.Tensor, length: int) -> list[int]:
    """Tokens each head keeps of ``length`` given its prune ratios ``[H]`` (module docstring; kvpress's arithmetic,
    float32)."""
    heads = prune_ratios.shape[0]
    ideal = (1.0 - prune_ratios.float()).clamp(min=0.0, max=1.0) * length
    total = max(heads, min(heads * length, int(torch.round(ideal.sum()).item())))
    counts = torch.floor(ideal).long()
    remainder = total - int(counts.sum().item())
    if remainder > 0:
        counts[torch.topk(ideal - counts, k=min(remainder, heads)).indices] += 1
    return counts.clamp_(min=1, max=length).tolist()


@dataclass
class LukvState(AllocatorState):
    """The sample's compression ratio (what picks the curve's row)."""

    compression_ratio: float = 0.0
    head_counts: dict[int, list[int]] = field(default_factory=dict)


class LukvAllocator(LayerBudgetAllocator):
    """Per-layer, per-head budgets from the curve (``None``: flat) at the budget's compression ratio."""

    def __init__(self, curve: torch.Tensor | None) -> None:
        self.curve = curve

    def start_sample(
        self, budget: Budget, num_layers: int, context_length: int, dataset: Any = None, *, extra_per_layer: int = 0
    ) -> AllocatorState:
        """The compression ratio: kvpress's ``c`` for ``<c>cr``, else ``1 - n / S`` of the budget's mean ``n``."""
        if self.curve is not None and self.curve.shape[1] != num_layers:
            raise ValueError(
                f"method.params.curve has {self.curve.shape[1]} layers; the model has {num_layers} compressible layers"
            )
        if budget.kind == "compression":
            ratio = float(budget.value)
        else:
            kept = budget.unrounded_mean_per_layer(context_length) + extra_per_layer
            ratio = min(max(1.0 - kept / max(context_length, 1), 0.0), 0.99)
        return LukvState(0, num_layers, context_length, dataset=dataset, compression_ratio=ratio)

    def on_layer(self, state: AllocatorState, observation: WindowObservation) -> dict[int, int]:
        assert isinstance(state, LukvState)
        heads, layer = observation.num_heads, observation.layer_idx
        if self.curve is None:
            prune = torch.full((heads,), state.compression_ratio)
        else:
            prune = self.curve[curve_row(state.compression_ratio), layer]
            if prune.shape[0] != heads:
                raise ValueError(f"method.params.curve has {prune.shape[0]} heads per layer; the layer stores {heads}")
        counts = state.head_counts[layer] = lukv_head_counts(prune, observation.context_length)
        observation.head_budgets = counts
        return {layer: round(sum(counts) / heads)}


class LukvScorer(TokenScorer):
    """The wrapped scores on each head's top ``head_budgets[h]`` (sinks and window first, a stable sort as kvpress),
    ``-inf`` elsewhere."""

    def __init__(self, inner: TokenScorer, gqa_agg: str, sink: int, window: int) -> None:
        self.inner, self.gqa_agg, self.sink, self.window = inner, gqa_agg, sink, window

    def prompt_rows(self, model_dtype: torch.dtype) -> PromptRows:
        return self.inner.prompt_rows(model_dtype)

    def score(self, observation: WindowObservation) -> torch.Tensor:
        scores = aggregate_groups(self.inner.score(observation), observation.num_heads, self.gqa_agg)
        scores = in_reference_dtype(self.inner, scores, observation)
        length = scores.shape[1]
        protected = float(scores.max()) + 1  # kvpress: scores.max().item() + 1, written in the scores' dtype
        scores = scores.clone()
        if self.sink:
            scores[:, : min(self.sink, length)] = protected
        if self.window:
            scores[:, max(0, length - self.window) :] = protected
        counts = observation.head_budgets
        if counts is None:  # no per-head budgets (a `<n>/layer` budget bypasses the allocator): the layer budget
            counts = [min(observation.layer_budget or length, length)] * scores.shape[0]
        rank = torch.argsort(scores, dim=-1, descending=True, stable=True).argsort(dim=-1)
        keep = rank < torch.tensor(counts, device=scores.device)[:, None]
        return torch.where(keep, scores.float(), float("-inf"))


@dataclass(frozen=True)
class LUKV(OverPress, family="lukv"):
    """LUKVPress's knobs; the budget picks the curve's row, the wrapped scorer (``press``) ranks the tokens."""

    press: str = "expected_attention"
    #: The budget curve: a ``.npy`` file ``[99, L, H_kv]`` of prune ratios (LU-KV's format); ``null``: a flat curve.
    curve: str | None = None
    #: The first tokens always kept (kvpress's ``sink``).
    sink: int = 4
    #: The last tokens always kept (kvpress's ``window``).
    window: int = 1

    def build(self, method_cfg: Any) -> EvictionMethod:
        """The wrapped scorer under LU-KV's per-head budgets."""
        inner = self.build_inner(method_cfg)
        assert inner.scorer is not None
        curve = None
        if self.curve is not None:
            import numpy as np

            path = Path(self.curve)
            if not path.is_file():
                raise ValueError(f"method.params.curve={self.curve!r}: no such file (an LU-KV curve, .npy)")
            curve = torch.as_tensor(np.load(path, allow_pickle=False), dtype=torch.float32)
            if curve.dim() != 3 or curve.shape[0] != 99:
                raise ValueError(f"method.params.curve={self.curve!r}: shape {tuple(curve.shape)}, not [99, L, H_kv]")
        return dataclasses.replace(
            inner,
            family=self.family,
            scorer=LukvScorer(inner.scorer, inner.gqa_agg, self.sink, self.window),
            layer_allocator=LukvAllocator(curve),
            head_allocator=SelectedCountAllocator(),
            keep_window=False,
            sink_tokens=0,
            settings=self.settings_of(inner, REFERENCE),
        )
