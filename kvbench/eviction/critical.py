"""CriticalKV and CriticalAdaKV over any scorer (Feng et al., 2025, arXiv 2502.03805; issue #43 item 6).

Reproduces NVIDIA/kvpress's ``CriticalKVPress`` and ``CriticalAdaKVPress`` (kvpress 0.5.5, contributed from
FFY0/AdaKV-in-NVIDIA-kvpress): ``method=knorm method.params.rescale=critical`` (CriticalKV) and, with
``method.params.allocation=ada_kvpress``, CriticalAdaKV.  The wrapped scores ``s`` ``[H, S]`` (GQA groups reduced by
``method.params.gqa_agg``) are rescaled by what each token's value contributes to the attention output:

* ``vnorm[h, t] = mean over the query heads q of KV head h of ||v[h, t] W_o[q]||_1``, ``W_o[q]`` the ``[D, hidden]``
  block of the output projection that reads query head ``q``, in the model's dtype
  (:attr:`WindowObservation.output_projection`);
* CriticalKV: stage 1 takes each head's top ``int(k first_stage_ratio)`` of ``s`` (``k`` the layer budget, 0.5), stage
  2 scores ``(s + epsilon) vnorm`` (epsilon 1e-4), and stage 1's picks score the largest float: one top-``k`` per
  head then keeps them first.  kvpress sizes stage 1 from the ratio, ``max(1, int((1 - r) S 0.5))``: so does
  ``budget=<c>cr``; under another budget ``int(k 0.5)`` (kvpress's count but for the ``max(1, .)``, which differs
  where ``k`` is 1).
* CriticalAdaKV: the head budgets are kvpress's Ada-KV shares (:mod:`kvbench.eviction.kvpress_ada`, safeguard
  ``int(k 0.2)`` here, as this press has it, without the ``max(1, .)``); stage 1 takes each head's top ``int(budget_h
  0.5)``, stage 2 rescales, and each head keeps its top ``budget_h`` of the result.  The wrapper returns the stage-2
  scores on the kept tokens and ``-inf`` elsewhere (:class:`~kvbench.eviction.selection.SelectedCountAllocator`
  counts them).

Protected tokens (the window when the method keeps it, the sinks) score ``max + 1`` before the rescaling, as kvpress's
presses pad their window: they take stage 1 first, and then compete on the rescaled score.  A model whose attention
has no ``o_proj`` gives no ``output_projection``: the wrapper then refuses to score (a clear
error naming the layer).  Parity: ``tests/methods/test_criticalkv.py``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from kvbench.eviction.base import EvictionMethod, PromptRows, TokenScorer, WindowObservation
from kvbench.eviction.kvpress_ada import KVPRESS_ALPHA_SAFEGUARD
from kvbench.eviction.selection import SelectedCountAllocator, pad_protected
from kvbench.eviction.token_scores import aggregate_groups

#: kvpress's defaults: stage 2's epsilon and stage 1's share of the budget.
CRITICAL_EPSILON = 1e-4
FIRST_STAGE_RATIO = 0.5


def projected_value_norms(values: torch.Tensor, output_projection: torch.Tensor, num_query_heads: int) -> torch.Tensor:
    """``[H, S]`` the mean over each GQA group of ``||v W_o[q]||_1`` (module docstring), in the values' dtype.

    ``values`` is ``[H, S, D]``; ``output_projection`` ``[hidden, H_q D]``."""
    heads, length, dim = values.shape
    blocks = output_projection.to(values.dtype).t().reshape(num_query_heads, dim, -1)  # [H_q, D, hidden]
    group = num_query_heads // heads
    norms = torch.stack(
        [torch.linalg.vector_norm(values[q // group] @ blocks[q], ord=1, dim=-1) for q in range(num_query_heads)]
    )
    return norms.view(heads, group, length).mean(dim=1)


def _force_top(scores: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """Each head's top ``counts[h]`` of ``scores`` ``[H, S]`` set to the dtype's largest value."""
    forced = scores.clone()
    if max(counts) <= 0:
        return forced
    ranked = scores.topk(max(counts), dim=-1).indices
    for head, count in enumerate(counts):
        forced[head, ranked[head, :count]] = torch.finfo(scores.dtype).max
    return forced


@dataclass(frozen=True)
class CriticalScorer(TokenScorer):
    """The wrapped scorer rescaled by the projected value norms, two stages (module docstring)."""

    inner: TokenScorer
    adaptive: bool = False
    gqa_agg: str = "mean"
    epsilon: float = CRITICAL_EPSILON
    first_stage_ratio: float = FIRST_STAGE_RATIO
    window: int = 0
    sink_tokens: int = 0

    def prompt_rows(self, model_dtype: torch.dtype) -> PromptRows:
        return self.inner.prompt_rows(model_dtype)

    def score(self, observation: WindowObservation) -> torch.Tensor:
        rescaled, head_budgets = self.rescaled(observation)
        if head_budgets is None:
            return rescaled
        keep = torch.zeros(rescaled.shape, dtype=torch.bool, device=rescaled.device)
        ranked = rescaled.topk(max(head_budgets), dim=-1).indices
        for head, count in enumerate(head_budgets):
            keep[head, ranked[head, :count]] = True
        return torch.where(keep, rescaled.float(), float("-inf"))

    def first_stage_count(self, budget: int, length: int, ratio: float | None) -> int:
        """CriticalKV's stage-1 count: kvpress's ``max(1, int((1 - c) S first_stage_ratio))`` when its compression
        ratio c is known (``<c>cr``), else ``int(k first_stage_ratio)`` of the layer budget ``k``."""
        if ratio is not None:
            return min(length, max(1, int((1 - ratio) * length * self.first_stage_ratio)))
        return int(budget * self.first_stage_ratio)

    def rescaled(self, observation: WindowObservation) -> tuple[torch.Tensor, list[int] | None]:
        """``[H, S]`` the two-stage scores (stage 1's picks at the dtype's largest value) and, for CriticalAdaKV,
        the per-head budgets (``None`` for CriticalKV: every head keeps the layer budget)."""
        if observation.output_projection is None:
            raise ValueError(
                f"method.params.rescale=critical needs the attention's output projection (o_proj) at layer "
                f"{observation.layer_idx}; this model's attention has none"
            )
        scores = aggregate_groups(self.inner.score(observation), observation.num_heads, self.gqa_agg)
        scores = pad_protected(scores, self.window, self.sink_tokens)
        length = scores.shape[1]
        budget = min(observation.layer_budget or length, length)
        vnorm = projected_value_norms(observation.values, observation.output_projection, observation.queries.shape[0])
        if not self.adaptive:
            first = scores.topk(self.first_stage_count(budget, length, observation.compression_ratio), dim=-1).indices
            rescaled = (scores + self.epsilon) * vnorm
            return rescaled.scatter(-1, first, torch.finfo(rescaled.dtype).max), None
        guarded, head_budgets = kvpress_head_budgets(scores, budget)
        stage_one = _force_top(guarded, [int(count * self.first_stage_ratio) for count in head_budgets])
        return (stage_one + self.epsilon) * vnorm, head_budgets


def kvpress_head_budgets(scores: torch.Tensor, budget: int) -> tuple[torch.Tensor, list[int]]:
    """CriticalAdaKV's safeguarded scores (each head's top ``int(k 0.2)`` set to the largest value) and per-head
    budgets (each head's share of one top-``H k`` of them over the layer)."""
    heads, length = scores.shape
    guarded = _force_top(scores, [int(budget * KVPRESS_ALPHA_SAFEGUARD)] * heads)
    chosen = guarded.reshape(-1).topk(heads * budget).indices // length
    return guarded, torch.bincount(chosen, minlength=heads).tolist()


def wrap_critical(method: EvictionMethod, adaptive: bool) -> EvictionMethod:
    """``method`` under CriticalKV (``adaptive``: CriticalAdaKV, which sets its own head counts)."""
    if method.scorer is None:
        raise ValueError(f"method.params.rescale=critical needs a scorer; method {method.name!r} has none")
    window = method.window if method.keep_window else 0
    scorer = CriticalScorer(
        method.scorer, adaptive=adaptive, gqa_agg=method.gqa_agg, window=window, sink_tokens=method.sink_tokens
    )
    # The wrapper protects by padding (max + 1 before the rescaling, as kvpress's presses pad their window).
    wrapped = dataclasses.replace(method, scorer=scorer, keep_window=False, sink_tokens=0)
    return dataclasses.replace(wrapped, head_allocator=SelectedCountAllocator()) if adaptive else wrapped
