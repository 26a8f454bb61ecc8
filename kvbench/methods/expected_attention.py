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

``stats: <file>`` is kvpress's ``ExpectedAttentionStatsPress``: step 1's mean and covariance come from a dataset
(per layer, cast to the model dtype) instead of the prompt; kvpress downloads them from the Hub
(``alessiodevoto/exp_att_stats_*``), ``scripts/compute_expected_attention_stats.py`` computes them offline from a
model's queries on local text (kvpress's procedure: samples of ``sample_chars`` characters, sinks dropped per
sample, unbiased covariance).

Pre-RoPE queries as kvpress's: ``q_proj`` of the layer's input hidden states (the session keeps them during the
compressing prefill, :mod:`kvbench.eviction.prerope`), bit for bit in float32 and bfloat16.  Without hidden states
(hand-built tensors) the stored post-RoPE prompt queries are un-rotated instead (float32 scores agree to ~1e-6;
bfloat16 rounds differently), and the cache record says ``prerope_states: unrotated``.  Holds ``O(S x hidden)`` per
layer across the chunks of a chunked prefill; needs a model with one rotary embedding
(``model.get_decoder().rotary_emb``).  Parity: ``tests/methods/test_expected_attention.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import torch
from torch.nn import functional as F

from kvbench.eviction.base import PromptRows, WindowObservation
from kvbench.eviction.params import bounded
from kvbench.eviction.prerope import prerope_states, rotate_half, unrotate
from kvbench.eviction.recipe import ScorerMethod

__all__ = ["ExpectedAttention", "average_rotation", "load_stats", "rotate_half", "unrotate"]


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

    #: A safetensors file of dataset statistics (``query_mean`` ``[L, H_q, D]``, ``query_cov`` ``[L, H_q, D, D]``,
    #: pre-RoPE; ``scripts/compute_expected_attention_stats.py``): kvpress's ``ExpectedAttentionStatsPress``.
    stats: str | None = None

    def prompt_rows(self, model_dtype: torch.dtype) -> PromptRows:
        """The prompt's pre-RoPE queries (none with dataset statistics)."""
        return PromptRows(prerope_queries=self.stats is None)

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """``[H_kv, S]`` scores in the model dtype."""
        keys, values = observation.keys, observation.values
        length, dim = keys.shape[1], keys.shape[-1]
        if observation.rotary is None:
            raise ValueError("expected_attention needs the model's rotary embedding (a RoPE model)")
        if length <= self.n_sink:
            raise ValueError(f"expected_attention: {length} context tokens, it needs more than n_sink={self.n_sink}")
        mean, covariance = self.query_statistics(observation)
        # kvpress's q_len: the rows the statistics come from (the prompt's S; a decoding press's buffered forwards)
        rows = getattr(observation.prerope, "rows", length)
        future = torch.arange(rows, rows + self.n_future_positions, device=keys.device)
        rotation = average_rotation(*observation.rotary(future, mean.dtype))
        mean = mean @ rotation.T  # [H_q, D]
        group = mean.shape[0] // keys.shape[0]  # query heads per stored head
        keys_t = keys[:, self.n_sink :].repeat_interleave(group, dim=0).transpose(1, 2)
        scores = (mean[:, None, :] @ keys_t).squeeze(1) / math.sqrt(dim)  # [H_q, S - n_sink]
        if covariance is not None:
            covariance = rotation @ (covariance @ rotation.T)
            scores = scores + torch.einsum("hin,hij,hjn->hn", keys_t, covariance, keys_t) / dim / 2
        scores = F.softmax(scores, dim=-1)
        scores = scores.view(keys.shape[0], group, -1).mean(dim=1)
        if self.use_vnorm:
            scores = (scores + self.epsilon) * values[:, self.n_sink :].norm(dim=-1)
        return F.pad(scores, (self.n_sink, 0), value=scores.max().item() + 1)

    def query_statistics(self, observation: WindowObservation) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Pre-RoPE query mean ``[H_q, D]`` and covariance ``[H_q, D, D]`` (``None`` without ``use_covariance``), in
        the model dtype: the dataset's (``stats``) or the prompt's, sinks left out (biased covariance, as kvpress)."""
        if self.stats is not None:
            mean, covariance = load_stats(self.stats)
            if mean.shape[0] != observation.num_layers or mean.shape[-1] != observation.keys.shape[-1]:
                raise ValueError(
                    f"method.params.stats={self.stats!r}: statistics of shape {tuple(mean.shape)}, this model needs "
                    f"[{observation.num_layers}, H_q, {observation.keys.shape[-1]}]"
                )
            dtype, device = observation.queries.dtype, observation.keys.device
            mean = mean[observation.layer_idx].to(device=device, dtype=dtype)
            covariance = covariance[observation.layer_idx].to(device=device, dtype=dtype)
            return mean, covariance if self.use_covariance else None
        prerope = prerope_states(observation).queries(self.n_sink)  # [H_q, S - n_sink, D], model dtype
        mean = prerope.mean(dim=1, keepdim=True)
        covariance = None
        if self.use_covariance:
            centered = prerope - mean
            covariance = torch.einsum("hsi,hsj->hij", centered, centered) / prerope.shape[1]
        return mean.squeeze(1), covariance


@cache
def load_stats(path: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(query_mean [L, H_q, D], query_cov [L, H_q, D, D])`` of a statistics file (read once per path)."""
    from safetensors.torch import load_file

    try:
        tensors = load_file(path)
    except (OSError, RuntimeError) as err:
        raise ValueError(f"method.params.stats={path!r}: cannot read a safetensors file ({err})") from None
    if "query_mean" not in tensors or "query_cov" not in tensors:
        raise ValueError(
            f"method.params.stats={path!r}: expected tensors 'query_mean' and 'query_cov' (found {sorted(tensors)}); "
            "scripts/compute_expected_attention_stats.py writes them"
        )
    return tensors["query_mean"], tensors["query_cov"]
