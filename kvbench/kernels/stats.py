"""Result type of the fused observation-window scoring (shared by the Triton kernel and the torch paths)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class WindowStats:
    """Statistics of the softmax attention of ``W`` window queries over ``S`` keys, per query head.

    The attention matrix ``A`` (``[H_q, W, S]``, causal in the window: query ``i`` sits at position ``S - W + i``)
    is never materialised; these are its reductions.  Masked (future) entries count as probability 0 in every
    column statistic, like ``torch.softmax`` over a ``-inf``-masked row.  When the statistics were computed with a
    ``prob_dtype`` (the model dtype, as the reference code casts its float32 softmax), every column statistic is of
    the probabilities rounded to it; the row statistics are of the float32 ones.

    Attributes
    ----------
    col_sum:
        ``[H_q, S]`` float32, ``sum_i A[h, i, j]`` (H2O / SnapKV votes).
    col_m2:
        ``[H_q, S]`` float32, ``sum_i (A[h, i, j] - mean_j) ** 2`` over the ``W`` rows (two-pass, no cancellation).
    col_max:
        ``[H_q, S]`` float32, ``max_i A[h, i, j]``.
    col_entropy:
        ``[H_q, S]`` float32, ``-sum_i A log(A + eps)`` (CAKE's dispersion ``H`` sums it over heads and the
        non-window columns).
    row_lse:
        ``[H_q, W]`` float32 log-sum-exp of each window query's scaled logits.
    row_entropy:
        ``[H_q, W]`` float32 entropy ``-sum_j A log A`` of each window query's distribution (AhaKV).
    window:
        ``W``.
    """

    col_sum: torch.Tensor
    col_m2: torch.Tensor
    col_max: torch.Tensor
    col_entropy: torch.Tensor
    row_lse: torch.Tensor
    row_entropy: torch.Tensor
    window: int

    @property
    def mean(self) -> torch.Tensor:
        """``[H_q, S]`` mean attention over the ``W`` window rows (masked entries count as 0)."""
        return self.col_sum / self.window

    def var(self, unbiased: bool = True) -> torch.Tensor:
        """``[H_q, S]`` variance over the window rows (``unbiased=True`` is ``torch.var``'s default, as CAKE uses)."""
        w = self.window
        if unbiased:
            return self.col_m2 / (w - 1) if w > 1 else torch.full_like(self.col_m2, float("nan"))
        return self.col_m2 / w
