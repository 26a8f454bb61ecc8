"""SimLayerKV (Zhang et al., arXiv 2410.13846): StreamingLLM on "lazy" layers, decided per prompt.

Reproduces NVIDIA/kvpress 0.5.5 ``kvpress/presses/simlayerkv_press.py`` (``SimLayerKVPress``; the paper's own
repository, sail-sg/SimLayerKV, is not available here):

* Lazy test, per layer and prompt: the last ``n_last`` prompt queries attend over the keys (logits
  ``q k^T / sqrt(D)`` in the model dtype, causal among those queries, float32 softmax cast back to the model dtype;
  kvpress's ``SnapKVPress.compute_window_attention``), the last ``n_last`` key columns are dropped, the weights are
  averaged over query heads and queries (model dtype), and the layer is lazy when the weight of the first
  ``n_initial`` plus the last ``n_recent`` remaining columns exceeds ``lazy_threshold``.
* A lazy layer keeps, on every head, the first ``n_initial`` tokens and the last ``n_recent - n_last`` (kvpress's
  ``keys[:, :, -n_recent + n_last:]``); other layers keep everything.  Nothing is compressed when ``S <= n_initial +
  n_recent + n_last`` or ``lazy_threshold == 1``.
* Budget semantics: the budget (tokens per head of the layer) is **what a lazy layer keeps**: ``params.n_recent``
  null (default) sets ``n_recent = budget - n_initial + n_last``, so a lazy layer holds exactly the budget; a set
  ``n_recent`` (kvpress's default is 1024) is used as it is and the budget is not read.  Non-lazy layers keep all
  ``S`` tokens: the run's mean cache is above the budget, and ``achieved_per_layer`` records it.
* ``lazy_threshold``: the preset uses 0.9, kvpress's recommendation for Llama-3 (its dataclass default 1.0 compresses
  nothing); Llama-2 0.65, Mistral 0.8, Qwen 0.85.
* Prefill only, as kvpress.  ``method.params.window`` must be at least ``n_last`` (the last queries are the observation
  window's).

Parity: ``tests/methods/test_simlayerkv.py`` (recordings ``tests/fixtures/reference/heads/SimLayerKV.json``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from kvbench.eviction.base import EvictionMethod, TokenScorer, WindowObservation, common_knobs
from kvbench.eviction.family import FamilyMethod
from kvbench.eviction.kept_sets import KeepScoredTokens, keep_only
from kvbench.eviction.params import bounded


def lazy_score(queries: torch.Tensor, keys: torch.Tensor, n_initial: int, n_recent: int) -> float:
    """The attention weight of the last queries on the initial + recent tokens (module docstring).

    ``queries`` ``[H_q, n_last, D]`` (post-RoPE, model dtype), ``keys`` ``[H_kv, S, D]``.
    """
    heads, n_last, head_dim = queries.shape
    length = keys.shape[1]
    keys = keys.repeat_interleave(heads // keys.shape[0], dim=0)
    logits = torch.matmul(queries, keys.transpose(1, 2)) / math.sqrt(head_dim)  # [H_q, n_last, S]
    mask = torch.triu(torch.full_like(logits, float("-inf")), diagonal=length - n_last + 1)
    weights = torch.softmax(logits + mask, dim=-1, dtype=torch.float32).to(queries.dtype)[..., :-n_last]
    mean = weights[None].mean((0, 1, 2))
    return (mean[:n_initial].sum() + mean[-n_recent:].sum()).item()


class SimLayerKVScorer(TokenScorer):
    """Lazy layers keep sinks + recent, the others everything (kept sets as scores)."""

    def __init__(self, lazy_threshold: float, n_last: int, n_initial: int, n_recent: int | None) -> None:
        self.lazy_threshold = lazy_threshold
        self.n_last = n_last
        self.n_initial = n_initial
        self.n_recent = n_recent

    def recent_size(self, layer_budget: int | None, length: int) -> int:
        """``n_recent``: the set one, else what makes a lazy layer keep the budget."""
        if self.n_recent is not None:
            return self.n_recent
        budget = length if layer_budget is None else int(layer_budget)
        return max(budget - self.n_initial + self.n_last, self.n_last + 1)

    def is_lazy(self, observation: WindowObservation, n_recent: int) -> bool:
        """Whether the layer is lazy for this prompt (compressible at all, and over the threshold)."""
        length = observation.context_length
        if self.lazy_threshold == 1.0 or length <= self.n_initial + n_recent + self.n_last:
            return False
        queries = observation.queries[:, -self.n_last :]
        return lazy_score(queries, observation.keys, self.n_initial, n_recent) > self.lazy_threshold

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """``[H, S]``: 1 on kept tokens, ``-inf`` on a lazy layer's dropped middle."""
        heads, length = observation.num_heads, observation.context_length
        ones = torch.ones(heads, length, device=observation.keys.device)
        n_recent = self.recent_size(observation.layer_budget, length)
        if not self.is_lazy(observation, n_recent):
            return ones
        positions = torch.arange(length, device=ones.device)
        keep = (positions < self.n_initial) | (positions >= length - (n_recent - self.n_last))
        return keep_only(ones, keep[None, :].expand(heads, length))


@dataclass(frozen=True)
class SimLayerKV(FamilyMethod, family="simlayerkv"):
    """SimLayerKV's knobs (module docstring)."""

    #: No GQA reduction: the lazy test and the kept sets are per layer.
    unused_knobs: ClassVar[frozenset[str]] = frozenset({"gqa_agg"})

    #: A layer is lazy when its last queries' weight on initial + recent tokens exceeds this.
    lazy_threshold: float = bounded(0.9, 0.0, 1.0)
    #: How many last prompt queries decide (kvpress: 1, "to match SKLV-decode").
    n_last: int = bounded(1, 1)
    #: Initial (sink) tokens a lazy layer keeps.
    n_initial: int = bounded(4, 0)
    #: Recent window of the lazy test; a lazy layer keeps ``n_recent - n_last`` recent tokens.  Null: from the budget.
    n_recent: int | None = bounded(None, 1)

    def build(self, method_cfg: Any) -> EvictionMethod:
        """Per-prompt lazy layers keep sinks + recent (module docstring)."""
        if self.n_recent is not None and self.n_recent <= self.n_last:
            raise ValueError(
                f"method.self.n_recent={self.n_recent} must exceed method.self.n_last={self.n_last} "
                "(a lazy layer keeps n_recent - n_last recent tokens)"
            )
        if int(self.window) < self.n_last:
            raise ValueError(
                f"method.params.window={self.window} is below method.self.n_last={self.n_last}: the lazy test reads "
                "the last n_last queries of the observation window; valid: window >= n_last"
            )
        scorer = SimLayerKVScorer(self.lazy_threshold, self.n_last, self.n_initial, self.n_recent)
        return EvictionMethod(
            scorer=scorer,
            head_allocator=KeepScoredTokens(),
            settings={
                "lazy_threshold": self.lazy_threshold,
                "n_last": self.n_last,
                "n_initial": self.n_initial,
                "n_recent": self.n_recent,
            },
            ignored_knobs=frozenset({"gqa_agg"}),
            **{**common_knobs(method_cfg, self), "keep_window": False},
        )
