"""CAP-KV (arXiv 2604.25975): log-determinant capacity scores with a historical-query anchor, as NVIDIA/kvpress 0.5.5
ships it (``CapPress``, issue #58).

Reproduces ``kvpress/presses/cap_press.py``: per query head, with the first ``n_sink`` tokens left out,

* the anchor ``mu`` is the mean of the prompt's pre-RoPE queries rotated by the RoPE rotation averaged over the next
  ``n_future_positions`` positions (as Expected Attention);
* each key's weight is ``w_i = exp(tau cos(k_i, mu) - max)`` (both L2-normalised, the cosine clamped to [-1, 1]);
* with ``u_i = v_i`` (the value), ``A = I + sum_i (w_i + eps) u_i u_i^T`` (float32 for the solve), the score is
  ``w_i u_i^T A^-1 u_i`` (a leverage: a token's share of the capacity), averaged over each KV head's GQA group;
* the sinks are scored ``max + 1`` of all heads' scores (kept first).

In the model dtype where kvpress computes in it (anchor, weights, ``A`` before the cast).  No other token is
protected; kvpress's ``compression_ratio`` c is the budget ``<max(1, int(S (1 - c)))>/layer``.  Needs the model's
rotary embedding.  Parity: ``tests/methods/test_cap.py`` (recording ``CapPress``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from kvbench.eviction.base import PromptRows, WindowObservation
from kvbench.eviction.params import bounded
from kvbench.eviction.prerope import prerope_states
from kvbench.eviction.recipe import ScorerMethod
from kvbench.methods.expected_attention import average_rotation


@dataclass(frozen=True)
class Cap(ScorerMethod, family="cap", reference="NVIDIA/kvpress kvpress/presses/cap_press.py@0.5.5 (CapPress)"):
    """Capacity (leverage) scores with a historical-query anchor (module docstring)."""

    #: Temperature of the query-key alignment weights.
    tau: float = bounded(5.0, 0.0)
    #: Future positions whose RoPE rotation is averaged for the anchor.
    n_future_positions: int = bounded(512, 1)
    #: First tokens left out and scored ``max + 1``.
    n_sink: int = bounded(4, 0)
    #: Added to the weights in the capacity matrix.
    epsilon: float = bounded(1e-6, 0.0)

    def prompt_rows(self, model_dtype: torch.dtype) -> PromptRows:
        """The prompt's pre-RoPE queries (the anchor)."""
        return PromptRows(prerope_queries=True)

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """``[H_kv, S]`` float32 scores."""
        keys, values = observation.keys, observation.values
        heads, length, dim = keys.shape
        if observation.rotary is None:
            raise ValueError("cap needs the model's rotary embedding (a RoPE model)")
        if length <= self.n_sink:
            raise ValueError(f"cap: {length} context tokens, it needs more than n_sink={self.n_sink}")
        queries = prerope_states(observation).queries(self.n_sink)  # [H_q, S - n_sink, D], model dtype
        group = queries.shape[0] // heads
        future = torch.arange(length, length + self.n_future_positions, device=keys.device)
        rotation = average_rotation(*observation.rotary(future, queries.dtype))
        anchor = torch.matmul(queries[None], rotation.T).mean(dim=2)  # [1, H_q, D]
        keys_rep = keys[None, :, self.n_sink :].repeat_interleave(group, dim=1)  # [1, H_q, T, D]: repeat_kv
        values_rep = values[None, :, self.n_sink :].repeat_interleave(group, dim=1)
        statistic = torch.einsum("bhd,bhtd->bht", F.normalize(anchor, p=2, dim=-1), F.normalize(keys_rep, p=2, dim=-1))
        logits = self.tau * statistic.clamp(-1.0, 1.0)
        weights = torch.exp(logits - logits.amax(dim=-1, keepdim=True))  # [1, H_q, T]
        scaled = values_rep * torch.sqrt(weights + self.epsilon).unsqueeze(-1)
        identity = torch.eye(dim, device=keys.device, dtype=scaled.dtype).view(1, 1, dim, dim)
        capacity = (identity + torch.einsum("bhtd,bhte->bhde", scaled, scaled)).float()
        vectors = values_rep.transpose(2, 3).float()  # [1, H_q, D, T]
        leverage = (vectors * torch.linalg.solve(capacity, vectors)).sum(dim=2)
        scores = (weights * leverage).view(1, heads, group, -1).mean(dim=2)[0]  # [H, T]
        return F.pad(scores, (self.n_sink, 0), value=scores.max().item() + 1)
