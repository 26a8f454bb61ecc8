"""Threshold budgets (``budget=<t>thr``, issue #58): evict every token scored below ``t``, whatever the count.

kvpress's ``DMSPress`` (0.5.5) keeps no size: it evicts the tokens outside its sliding window whose score is below a
threshold (``scores < threshold``, compared in the scores' dtype), so the kept count varies by head, layer and sample
and memory is an outcome.  kvbench spells the threshold as a budget form, ``<t>thr`` (:mod:`kvbench.budget`), taken
by threshold methods alone:

* :class:`ThresholdScorer` -- the method's scorer under a threshold: the wrapped scorer (its own observation window)
  and the recent tokens it protects (:attr:`ThresholdScorer.protect_last`, which the eviction session adds to the
  protected tokens: they rank first, and a threshold keeps them whatever they score);
* :func:`threshold_counts` -- per head, how many tokens score at least ``t`` (the session keeps those: its top-k
  of that size is exactly the set ``score >= t``);
* :func:`check_budget_form` -- a threshold budget for a threshold method, a size for every other method (the
  session and the command line refuse the rest, naming the right form).

The run reports what was kept: ``mean_kept_fraction`` and ``mean_stored_bytes`` per dataset (``metrics.json``),
per layer and head in each prediction's cache record, as for every budget.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from kvbench.budget import Budget
from kvbench.eviction.base import DecodeState, PromptRows, TokenScorer, WindowObservation

#: A threshold in the threshold form, for the error messages.
THRESHOLD_EXAMPLE = "budget=-3.0thr (KNorm scores are minus key norms) or budget=0.01thr (attention scores)"


class ThresholdScorer(TokenScorer):
    """A scorer under a threshold budget: ``inner``'s scores from the last ``inner_window`` window queries, the last
    :attr:`protect_last` tokens of the prompt protected (kvpress's ``sliding_window_size``)."""

    def __init__(self, inner: TokenScorer, inner_window: int, protect_last: int) -> None:
        self.inner, self.inner_window = inner, inner_window
        #: The most recent prompt tokens never evicted (the eviction session protects them).
        self.protect_last = protect_last

    def prompt_rows(self, model_dtype: torch.dtype) -> PromptRows:
        return self.inner.prompt_rows(model_dtype)

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """``inner``'s scores (``[H, S]`` or ``[H_q, S]``), seeing its own window of the observation's queries, in the
        dtype its reference returns them in (:func:`in_reference_dtype`): the threshold is compared in it
        (:func:`threshold_counts`)."""
        if observation.window > self.inner_window:
            observation = dataclasses.replace(observation, queries=observation.queries[:, -self.inner_window :])
            observation._stats = {}  # statistics of the wider window do not hold for this one
        return in_reference_dtype(self.inner, self.inner.score(observation), observation)


def in_reference_dtype(scorer: TokenScorer, scores: torch.Tensor, observation: WindowObservation) -> torch.Tensor:
    """``scores`` in the dtype ``scorer``'s reference returns them in: a scorer that rounds as its reference in the
    model dtype (``options.score_dtype=model``: SnapKV's kvpress preset) returns float32 numbers of that dtype, cast
    to it here (exactly) for a wrapper that compares or sums them as the reference does; others as they are."""
    options = getattr(scorer, "options", None)
    rounded = None if options is None else options.probability_dtype(observation.model_dtype)
    return scores if rounded is None else scores.to(rounded)


def threshold_counts(padded: torch.Tensor, threshold: float, score_dtype: torch.dtype) -> list[int]:
    """Per head, the number of tokens kept under ``threshold``: those scoring at least it.

    Parameters
    ----------
    padded:
        ``[H, S_max]`` float32 scores (protected tokens ``+inf``, padding ``-inf``).
    threshold:
        The budget's ``t``.
    score_dtype:
        The scorer's dtype: ``t`` is rounded to it first, as kvpress's ``scores < threshold`` compares.
    """
    rounded = float(torch.tensor(threshold, dtype=score_dtype))
    return [int(count) for count in (padded >= rounded).sum(dim=1).tolist()]


def is_threshold_method(method: Any) -> bool:
    """Whether ``method`` (an :class:`~kvbench.eviction.base.EvictionMethod`) evicts by a score threshold."""
    return isinstance(method.scorer, ThresholdScorer)


def check_budget_form(method: Any, budget: Budget) -> None:
    """``ValueError`` naming the right form when ``budget`` does not fit ``method``: a threshold method takes a
    threshold (``<t>thr``) or ``full``; every other method a size (``<n>L``, ``<n>/layer``, ``<r>x``, ``<c>cr``)."""
    if budget.is_full:
        return
    if is_threshold_method(method) and not budget.is_threshold:
        raise ValueError(
            f"budget {budget.spec!r} means nothing to method {method.name!r}: it evicts every token scored below a "
            f"threshold (kvpress's DMSPress), so its budget is a threshold '<t>thr', e.g. {THRESHOLD_EXAMPLE}; "
            "the kept count is then measured (kept fraction and stored bytes per run)"
        )
    if budget.is_threshold and not is_threshold_method(method):
        raise ValueError(
            f"budget {budget.spec!r} is a score threshold: only threshold methods take it (method=dms); method "
            f"{method.name!r} keeps a size: give '<n>L' (e.g. 64L), '<n>/layer', '<r>x' or '<c>cr'"
        )


def new_decode_state(method: Any, budget: Budget) -> DecodeState | None:
    """A sample's decode state for ``method`` under ``budget`` (what the eviction session starts with): the budget's
    form checked (:func:`check_budget_form`), then the decode policy's fresh state holding the budget's threshold
    (``None`` without a decode policy)."""
    check_budget_form(method, budget)
    policy = method.decode_policy
    if policy is None:
        return None
    state = policy.new_state()
    state.threshold = budget.value if budget.is_threshold else None
    return state
