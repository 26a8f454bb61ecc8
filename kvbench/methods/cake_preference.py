"""CAKE's layer preference (Eq. 6, ``P = H^(1/tau1) * V^(1/tau2)``): from the fused window statistics, and, in a
half-precision model under ``score_dtype=model``, as antgroup/cakekv's ``llama_attn_forward_cake`` computes it.

The code computes the preference from the window's attention in the model dtype: ``matmul(q, k^T) / sqrt(d)`` (a
bfloat16 matmul, the causal mask's ``finfo.min`` added on the window block), ``torch.softmax(..., dtype=float32)``
cast back, then ``H = -torch.sum(a * log(a + 1e-10))`` of those probabilities in float32 over the whole
``[1, H_q, W, S - W]`` block at once, ``V = torch.var(a, dim=-2)`` in the model dtype summed over heads, then
candidates, in that dtype, and ``H ** (1 / tau1) * V ** (1 / tau2)`` (a float32 times a model-dtype scalar).  The
fused statistics (:mod:`kvbench.kernels`) build each probability as ``exp(l - lse)`` and sum the entropy column by
column: each probability may round to the other neighbouring bfloat16 value, and ``H`` carries other float32
rounding, so the preference differs in its 5th-7th digit, enough to move a cascade's layer budget by one token when a
share sits that close to an integer (issue #54).  :func:`code_preference` repeats the code's operations on the same
tensors (the window block materialised, ``[1, H_q, W, S]``, as the code does: a transient few times
``H_q x W x S`` floats per layer, about 1 GB at 128K tokens, 32 query heads and ``W = 32``; ``score_dtype=float32``
keeps the fused statistics), so its numbers are the code's.
"""

from __future__ import annotations

import math

import torch

from kvbench.eviction.observation import WindowObservation
from kvbench.eviction.token_scores import Rounding, no_rounding
from kvbench.kernels import WindowStats


def layer_preference(
    stats: WindowStats,
    window: int,
    tau1: float,
    tau2: float,
    preference: str = "hv",
    rnd: Rounding = no_rounding,
) -> float:
    """Eq. 6 from the window attention's statistics: ``H^(1/tau1) * V^(1/tau2)`` over the candidates ``A[:, :, :S-W]``.

    ``H = -sum A log(A + 1e-10)`` is the sum of the column entropies (``stats`` computed with that ``eps``, the
    kernels' default); ``V`` sums the unbiased column variances over heads, then over candidates.  ``stats`` come
    from probabilities rounded as ``rnd`` rounds (the reference casts its softmax to the model dtype; its
    ``torch.var`` and sums run in that dtype, the entropy in float32, and ``V ** (1 / tau2)`` is a power of a
    model-dtype scalar: exponent and result rounded to that dtype); float32 arithmetic otherwise.
    """
    candidates = stats.col_sum.shape[-1] - window
    if candidates <= 0:
        return 1.0
    value = torch.ones((), dtype=torch.float32)
    if preference in ("hv", "h"):
        entropy = stats.col_entropy[:, :candidates].sum()
        value = value * entropy.cpu().clamp_min(0) ** (1 / tau1)
    if preference in ("hv", "v"):
        if stats.window > 1:
            variance = rnd(rnd(rnd(stats.var()[:, :candidates]).sum(dim=0)).sum(dim=0)).cpu()
        else:
            variance = value * 0
        exponent: float | torch.Tensor = 1 / tau2
        if rnd is not no_rounding:  # ``V ** (1 / tau2)`` of the code's model-dtype V: the exponent in that dtype too
            exponent = rnd(torch.tensor(exponent, dtype=torch.float64))
        value = value * rnd(variance.clamp_min(0) ** exponent)
    return max(float(value), 1e-30)  # all preferences must be positive (Proposition 1)


def window_attention_in_dtype(observation: WindowObservation, window: int) -> torch.Tensor:
    """``[1, H_q, W, S]`` the window's attention in the model dtype, as the code computes it: the last ``window``
    queries against the keys repeated per query head (``repeat_kv``), ``matmul`` in the model dtype divided by
    ``sqrt(d)`` (multiplied by ``scaling`` when the model's scale is another), the causal mask (``finfo.min``) added
    on the window block, ``torch.softmax(..., dtype=float32)`` cast back to the model dtype."""
    queries = observation.queries[None, :, -window:]  # [1, H_q, W, D]
    keys = observation.keys
    groups = queries.shape[1] // keys.shape[0]
    repeated = keys.repeat_interleave(groups, dim=0)[None].to(queries.dtype)  # [1, H_q, S, D]
    logits = torch.matmul(queries, repeated.transpose(2, 3))
    dim = queries.shape[-1]
    if math.isclose(observation.scaling, dim**-0.5, rel_tol=1e-9):
        logits = logits / math.sqrt(dim)
    else:
        logits = logits * observation.scaling
    mask = torch.full((window, window), torch.finfo(logits.dtype).min, device=logits.device)
    steps = torch.arange(window, device=logits.device)
    mask.masked_fill_(steps < (steps + 1).view(window, 1), 0)
    logits[:, :, :, -window:] += mask.to(logits.dtype)[None, None]
    return torch.softmax(logits, dim=-1, dtype=torch.float32).to(queries.dtype)


def code_preference(
    observation: WindowObservation, window: int, tau1: float, tau2: float, preference: str = "hv"
) -> float:
    """The layer preference as ``llama_attn_forward_cake`` computes it in the model dtype (module docstring);
    ``preference`` drops a factor for kvbench's ablation (``h``, ``v``)."""
    if observation.context_length <= window:
        return 1.0
    probs = window_attention_in_dtype(observation, window)[:, :, :, :-window]  # [1, H_q, W, S - W]
    value = torch.ones((), dtype=torch.float32)
    if preference in ("hv", "h"):
        weights = probs.to(torch.float32)
        terms = torch.log_(weights + 1e-10).mul_(weights)  # a * log(a + 1e-10), one temporary less than the code
        entropy = (-torch.sum(terms)).to(torch.float32)
        del terms, weights
        value = value * entropy.cpu() ** (1 / tau1)
    if preference in ("hv", "v"):
        variance = torch.var(probs, dim=-2).sum(0).sum(0).sum(0)  # model dtype, as the code sums it
        value = value * variance.cpu() ** (1 / tau2)
    return max(float(value), 1e-30)  # all preferences must be positive (Proposition 1)
