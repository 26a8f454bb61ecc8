"""LagKV (Liang et al., 2025): score each token against the min-max range of the *next* partition ("lag") of tokens.

Reproduces NVIDIA/kvpress ``kvpress/presses/lagkv_press.py`` (``LagKVPress``, kvpress 0.5.5), in the keys' dtype:

* the context after ``n_sink`` sink tokens is cut into partitions of ``lag_size`` tokens; the last full partition and
  the remainder (the tail, ``lag_size`` to ``2 lag_size - 1`` tokens) and the sinks score 1 (kept first);
* every other partition is scored against the next one: each key (and value) is min-max normalised per channel by
  the next partition's channel minimum and maximum, the standard deviation over channels is soft-maxed over the
  partition, and the key and value scores are averaged;
* unless ``cross_scoring``, the score becomes the token's rank within its partition divided by ``lag_size`` (many
  exact ties across partitions: kvpress's ``topk`` then picks among equals);
* **reference choice reproduced**: a context shorter than ``n_sink + 2 lag_size`` is not scored at all: sinks score
  1 and the rest ``arange(S - n_sink) / (S - n_sink)``, i.e. the most recent tokens are kept.

How it differs from the authors' code (AI-Lab-China-Merchants-Bank/LagKV ``lag_kv.py``, a ``DynamicCache``
subclass): there each partition keeps its own top ``int(ratio * lag_size)`` tokens by ``key_score + score_v_ratio *
value_score`` (no ranks), compression repeats as the cache grows, and the defaults are ``sink_size=16``,
``lag_size=1024``; kvpress (reproduced here) ranks within partitions and takes one top-k over the whole context at
kvpress's budget.  kvpress's ``compression_ratio`` c is the budget ``<max(1, int(S (1 - c)))>/layer``.
Parity: ``tests/methods/test_lagkv.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvbench.eviction.base import WindowObservation
from kvbench.eviction.params import bounded
from kvbench.eviction.recipe import ScorerMethod


@dataclass(frozen=True)
class LagKV(ScorerMethod, family="lagkv", reference="NVIDIA/kvpress kvpress/presses/lagkv_press.py@0.5.5"):
    """Lag-relative scores of keys and values (module docstring)."""

    #: First tokens always scored 1.
    n_sink: int = bounded(4, 0)
    #: Tokens per partition.
    lag_size: int = bounded(128, 1)
    #: Keep the soft-maxed scores instead of their within-partition ranks.
    cross_scoring: bool = False

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """``[H, S]`` scores in ``[0, 1]`` in the keys' dtype (sinks and tail 1)."""
        keys, values = observation.keys, observation.values
        heads, length, dim = keys.shape
        sinks, lag = self.n_sink, self.lag_size
        if length < sinks + 2 * lag:  # kvpress's fallback: a recency ramp after the sinks
            scores = torch.ones(heads, length, dtype=keys.dtype, device=keys.device)
            if length > sinks:
                ramp = torch.arange(length - sinks, device=keys.device) / (length - sinks)
                scores[:, sinks:] = ramp.to(keys.dtype)
            return scores
        end = sinks + (length - sinks) // lag * lag
        scored = (self._lag_scores(keys[:, sinks:end], dim) + self._lag_scores(values[:, sinks:end], dim)) / 2
        if not self.cross_scoring:
            scored = (scored.argsort(dim=-1).argsort(dim=-1) / lag).to(keys.dtype)
        ones = torch.ones(heads, sinks, dtype=scored.dtype, device=scored.device)
        tail = torch.ones(heads, lag + length - end, dtype=scored.dtype, device=scored.device)
        return torch.cat([ones, scored.reshape(heads, -1), tail], dim=-1)

    def _lag_scores(self, states: torch.Tensor, dim: int) -> torch.Tensor:
        """``[H, P - 1, lag]`` for ``states`` ``[H, P * lag, D]``: each partition normalised by the next one's range."""
        partitions = states.reshape(states.shape[0], -1, self.lag_size, dim)
        reference, scored = partitions[:, 1:], partitions[:, :-1]
        low = reference.min(dim=-2, keepdim=True).values
        high = reference.max(dim=-2, keepdim=True).values
        return ((scored - low) / (high - low)).std(dim=-1).softmax(dim=-1)
