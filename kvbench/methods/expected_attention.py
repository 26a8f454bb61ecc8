"""Expected Attention (Devoto et al., 2025): score each key by the attention that *future* queries are expected to
pay it, modelling those queries as a Gaussian fitted on the prompt's queries.

Reproduces NVIDIA/kvpress ``kvpress/presses/expected_attention_press.py`` (``ExpectedAttentionPress``, kvpress 0.5.5):

1. the pre-RoPE queries of every prompt token but the first ``n_sink`` give a mean ``mu`` and (``use_covariance``)
   a covariance ``Sigma`` per query head, in the model dtype;
2. both are rotated by the RoPE rotation averaged over the next ``n_future_positions`` positions (``S ...
   S + n_future_positions - 1``): ``R = mean_t(cos_t I + sin_t P)``, ``mu R^T``, ``R Sigma R^T``;
3. per key (sinks excluded), ``softmax_s(mu . k_s / sqrt(D) + k_s^T Sigma k_s / (2 D))`` in the model dtype, averaged
   over the KV head's GQA group; with ``use_vnorm`` times ``(score + epsilon) * ||v_s||``;
4. the ``n_sink`` first tokens get ``max + 1`` of all heads' scores (always kept while the budget allows).

No other token is protected; kvpress's ``compression_ratio`` c is the budget ``<max(1, int(S (1 - c)))>/layer``.

kvbench's pre-RoPE queries: kvpress recomputes them from the layer's input (``q_proj`` of the hidden states);
kvbench un-rotates the post-RoPE queries it is handed with the model's own rotary tables
(:attr:`~kvbench.methods.base.WindowObservation.rotary`), in float32, then rounds them to the model dtype.  In
float32 that is the reference's queries up to rounding (scores agree to ~1e-6); in bfloat16 the un-rotated queries
differ from ``q_proj``'s by bfloat16 rounding, so scores and the kept tokens at the cut may differ (counted in the
parity test).  Reads every prompt query (``O(H_q S D)`` per layer kept during prefill); needs a model with one
rotary embedding (``model.get_decoder().rotary_emb``).  Parity: ``tests/methods/test_expected_attention.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from kvbench.methods.base import PromptRows, WindowObservation
from kvbench.methods.params import bounded
from kvbench.methods.recipe import ScorerMethod


def rotate_half(states: torch.Tensor) -> torch.Tensor:
    """``[-x2, x1]`` for ``x = [x1, x2]`` split along the last dimension (the rotary convention of Llama)."""
    first, second = states.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def unrotate(states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Pre-RoPE states ``[H, N, D]`` (float32) from post-RoPE ``states`` and the tables ``cos, sin`` ``[N, D]`` that
    rotated them (the inverse of ``x cos + rotate_half(x) sin``, scaled rotations included)."""
    states, cos, sin = states.float(), cos.float(), sin.float()
    return (states * cos - rotate_half(states) * sin) / (cos * cos + sin * sin)


def average_rotation(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``[D, D]`` mean over positions of the rotation matrices ``cos_t I + sin_t P`` (``P`` = rotate_half as a
    matrix), in the tables' dtype."""
    dim = cos.shape[-1]
    identity = torch.eye(dim, dtype=cos.dtype, device=cos.device)
    half = torch.eye(dim // 2, dtype=cos.dtype, device=cos.device)
    swap = torch.zeros(dim, dim, dtype=cos.dtype, device=cos.device)
    swap[dim // 2 :, : dim // 2], swap[: dim // 2, dim // 2 :] = half, -half
    return (cos[:, :, None] * identity + sin[:, :, None] * swap).mean(dim=0)


@dataclass(frozen=True)
class ExpectedAttention(
    ScorerMethod,
    family="expected_attention",
    reference="NVIDIA/kvpress kvpress/presses/expected_attention_press.py@0.5.5",
):
    """Expected attention of future queries, times value norms (module docstring)."""

    #: Future positions whose RoPE rotation is averaged.
    n_future_positions: int = bounded(512, 1)
    #: First tokens left out of the statistics and scored ``max + 1``.
    n_sink: int = bounded(4, 0)
    #: Add the covariance term ``k^T Sigma k / (2 D)``.
    use_covariance: bool = True
    #: Multiply by the value norm.
    use_vnorm: bool = True
    #: Added to the expected attention before the value-norm product.
    epsilon: float = bounded(0.0, 0.0)

    def prompt_rows(self, model_dtype: torch.dtype) -> PromptRows:
        """Every prompt query."""
        return PromptRows(queries=True)

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """``[H_kv, S]`` scores in the model dtype."""
        queries, keys, values = observation.prompt_queries, observation.keys, observation.values
        length = keys.shape[1]
        if queries is None or queries.shape[1] != length:
            raise ValueError("expected_attention needs every prompt query (TokenScorer.prompt_rows)")
        if observation.rotary is None:
            raise ValueError("expected_attention needs the model's rotary embedding (a RoPE model)")
        if length <= self.n_sink:
            raise ValueError(f"expected_attention: {length} context tokens, it needs more than n_sink={self.n_sink}")
        dtype, dim = queries.dtype, keys.shape[-1]
        positions = torch.arange(self.n_sink, length, device=keys.device)
        cos, sin = observation.rotary(positions, dtype)
        prerope = unrotate(queries[:, self.n_sink :], cos, sin).to(dtype)  # [H_q, S - n_sink, D]
        mean = prerope.mean(dim=1, keepdim=True)
        future = torch.arange(length, length + self.n_future_positions, device=keys.device)
        rotation = average_rotation(*observation.rotary(future, dtype))
        mean = mean.squeeze(1) @ rotation.T  # [H_q, D]
        keys_t = keys[:, self.n_sink :].repeat_interleave(observation.group_size, dim=0).transpose(1, 2)
        scores = (mean[:, None, :] @ keys_t).squeeze(1) / math.sqrt(dim)  # [H_q, S - n_sink]
        if self.use_covariance:
            centered = prerope - prerope.mean(dim=1, keepdim=True)
            covariance = torch.einsum("hsi,hsj->hij", centered, centered) / prerope.shape[1]
            covariance = rotation @ (covariance @ rotation.T)
            scores = scores + torch.einsum("hin,hij,hjn->hn", keys_t, covariance, keys_t) / dim / 2
        scores = F.softmax(scores, dim=-1)
        scores = scores.view(keys.shape[0], observation.group_size, -1).mean(dim=1)
        if self.use_vnorm:
            scores = (scores + self.epsilon) * values[:, self.n_sink :].norm(dim=-1)
        return F.pad(scores, (self.n_sink, 0), value=scores.max().item() + 1)
