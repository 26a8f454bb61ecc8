"""Result type of the fused observation-window scoring (shared by the Triton kernel and the torch paths)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class WindowStats:
    """Statistics of the softmax attention of ``W`` window queries over ``S`` keys, per query head.

    The attention matrix ``A`` (``[H_q, W, S]``, causal in the window: query ``i`` sits at position ``S - W + i``)
    is never materialised; these are its reductions.  Masked (future) entries count as probability 0 in every
    column statistic, like ``torch.softmax`` over a ``-inf``-masked row.

    Attributes
    ----------
    col_sum:
        ``[H_q, S]`` float32, ``sum_i A[h, i, j]`` (H2O / SnapKV votes).
    col_sqsum:
        ``[H_q, S]`` float32, ``sum_i A[h, i, j] ** 2`` (for the variance).
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
    col_sqsum: torch.Tensor
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
        centred = (self.col_sqsum - self.col_sum * self.col_sum / w).clamp_min(0.0)
        if unbiased:
            return centred / (w - 1) if w > 1 else torch.full_like(centred, float("nan"))
        return centred / w
