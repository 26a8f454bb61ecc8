"""Leverage scores (Chari & Van Durme, 2025, Compactor's query-agnostic part): keep the tokens whose pre-RoPE keys
are the most "outlying" rows of the layer's key matrix, by approximate statistical leverage.

Reproduces NVIDIA/kvpress ``kvpress/presses/leverage_press.py`` (``LeverageScorePress``, kvpress 0.5.5):

1. per KV head, the pre-RoPE keys ``[S, D]`` are centred over the sequence and multiplied by a right Gaussian sketch
   ``Phi`` ``[D, k] / sqrt(k)`` (``k = sketch_dimension``) drawn, in the model dtype, from torch's **global**
   generator (kvpress cannot seed it; a kvbench run seeds that generator once with ``seed``, so the draws depend on
   the samples compressed before);
2. in float32, ``G = X^T X`` is factorised by Cholesky (adding ``1e-2 I``, then 10x more up to 5 tries) and the
   leverage of row ``s`` is ``x_s G^{-1} x_s^T`` (clamped at 0);
3. z-scored with the mean and standard deviation of all heads together.

Pre-RoPE keys as kvpress's: ``k_proj`` of the layer's input hidden states (:mod:`kvbench.eviction.prerope`; the
stored keys un-rotated when there are none, e.g. hand-built tensors: the cache record says which).  No token is
protected; kvpress's ``compression_ratio`` c is the budget ``<max(1, int(S (1 - c)))>/layer``.
Parity: ``tests/methods/test_leverage.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kvbench.eviction.base import PromptRows, WindowObservation
from kvbench.eviction.params import bounded
from kvbench.eviction.prerope import prerope_states
from kvbench.eviction.recipe import ScorerMethod
from kvbench.methods.noncausal import zscore_all_heads


def cholesky_with_jitter(gram: torch.Tensor, jitter: float = 1e-2, tries: int = 5) -> torch.Tensor:
    """Lower Cholesky factor of ``gram + j I`` ``[..., k, k]`` for the first ``j`` in ``jitter, 10 jitter, ...`` that
    succeeds (``tries`` attempts)."""
    identity = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
    current = float(jitter)
    for _ in range(tries):
        factor, info = torch.linalg.cholesky_ex(gram + current * identity, upper=False)
        if bool((info == 0).all()):
            return factor
        current = max(1e-8, 1e-2 if current == 0.0 else 10.0 * current)
    raise RuntimeError(f"leverage: Cholesky failed after {tries} tries (last jitter {current})")


def leverage_scores(prerope_keys: torch.Tensor, sketch_dimension: int) -> torch.Tensor:
    """``[H, S]`` float32 approximate leverage of each row of ``prerope_keys`` ``[H, S, D]`` (sketch from torch's
    global generator, in the keys' dtype)."""
    heads, _, dim = prerope_keys.shape
    sketch = torch.randn(heads, dim, sketch_dimension, device=prerope_keys.device, dtype=prerope_keys.dtype)
    sketch = sketch * (1 / math.sqrt(sketch_dimension))
    centred = prerope_keys - prerope_keys.mean(dim=-2, keepdim=True)
    sketched = (centred @ sketch).float()  # [H, S, k]
    transposed = sketched.transpose(-2, -1)
    gram = transposed @ sketched
    factor = cholesky_with_jitter(0.5 * (gram + gram.transpose(-2, -1)))
    solved = torch.cholesky_solve(transposed, factor, upper=False)  # G^{-1} X^T, [H, k, S]
    return (sketched * solved.transpose(-2, -1)).sum(dim=-1).clamp_min(0)


@dataclass(frozen=True)
class Leverage(ScorerMethod, family="leverage", reference="NVIDIA/kvpress kvpress/presses/leverage_press.py@0.5.5"):
    """Z-scored approximate leverage of the pre-RoPE keys (module docstring)."""

    #: Columns of the Gaussian sketch.
    sketch_dimension: int = bounded(48, 1)

    def prompt_rows(self, model_dtype: torch.dtype) -> PromptRows:
        """The pre-RoPE keys."""
        return PromptRows(prerope_keys=True)

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """``[H_kv, S]`` float32 z-scores."""
        return zscore_all_heads(leverage_scores(prerope_states(observation).keys(), self.sketch_dimension))
