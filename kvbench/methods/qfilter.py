"""Q-Filters (Godey et al., 2025): keep the keys with the largest projection on one learned direction per KV head.

Reproduces NVIDIA/kvpress ``kvpress/presses/qfilter_press.py`` (``QFilterPress``, kvpress 0.5.5): the score of a
token is ``-(f[layer, head] . k)`` for its stored (post-RoPE) key ``k``, with the filters ``f`` ``[L, H_kv, D]``
cast to the keys' dtype (kvpress casts them to the model dtype), in the keys' dtype.  No token is protected.
kvpress's ``compression_ratio`` c is the budget ``<max(1, int(S (1 - c)))>/layer``.

Filters:

* ``filters: <file>`` (kvpress's behaviour): a safetensors file with ``q_filters`` ``[L, H_kv, D]`` (one row per
  compressed layer, in kvpress's sign convention: the score is *minus* the projection).  kvpress downloads them from
  the Hub (``nthngdy/<model>_qfilt``); ``scripts/compute_qfilters.py`` computes them offline from a model's own
  queries on local text by the paper's procedure (:func:`filters_from_queries`).
* ``filters: null`` (kvbench's switch, for a model with no filter file: kvpress cannot run then): each layer's
  filters come from the prompt's own queries by the same procedure (the prompt is the calibration text), so the
  method runs offline on any model; the prompt's queries are kept during prefill (``O(H_q S D)`` per layer).

Parity: ``tests/methods/test_qfilter.py`` (kvpress's recording with seeded stand-in filters).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch

from kvbench.eviction.base import PromptRows, WindowObservation
from kvbench.eviction.recipe import ScorerMethod

#: Name of the filter tensor in a filter file (the key kvpress's ``QFilters`` module stores them under).
FILTERS_KEY = "q_filters"


def filters_from_queries(queries: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """The paper's filters of one layer: ``[H_kv, D]`` float32 from post-RoPE queries ``[H_q, N, D]``.

    Per KV head, the queries of its GQA group are stacked (``[G N, D]``) and their first right singular vector ``u``
    (float32 SVD) is oriented so that the queries' mean projection on it is positive; the filter is ``-u``, kvpress's
    convention (its score ``-(f . k) = u . k`` grows with the expected attention ``E[q] . k``).
    """
    heads, _, dim = queries.shape
    grouped = queries.float().reshape(num_kv_heads, heads // num_kv_heads * queries.shape[1], dim)
    filters = []
    for stacked in grouped:
        direction = torch.linalg.svd(stacked, full_matrices=False).Vh[0]
        if float((stacked @ direction).mean()) < 0:
            direction = -direction
        filters.append(-direction)
    return torch.stack(filters)


@cache
def load_filters(path: str) -> torch.Tensor:
    """``[L, H_kv, D]`` filters of a safetensors file (read once per path); a missing file or key is an error."""
    from safetensors.torch import load_file

    try:
        tensors = load_file(path)
    except (OSError, RuntimeError) as err:
        raise ValueError(f"method.params.filters={path!r}: cannot read a safetensors file ({err})") from None
    if FILTERS_KEY not in tensors or tensors[FILTERS_KEY].dim() != 3:
        raise ValueError(
            f"method.params.filters={path!r}: expected a tensor {FILTERS_KEY!r} of shape [layers, kv_heads, head_dim] "
            f"(found {sorted(tensors)}); scripts/compute_qfilters.py writes one"
        )
    return tensors[FILTERS_KEY]


@dataclass(frozen=True)
class QFilter(ScorerMethod, family="qfilter", reference="NVIDIA/kvpress kvpress/presses/qfilter_press.py@0.5.5"):
    """Score ``-(f . k)`` per KV head with per-layer filters ``f`` (module docstring)."""

    #: A safetensors file with ``q_filters`` ``[L, H_kv, D]``; ``null``: filters from the prompt's own queries.
    filters: str | None = None

    def prompt_rows(self, model_dtype: torch.dtype) -> PromptRows:
        """Every prompt query when the filters come from the prompt itself; nothing otherwise."""
        return PromptRows(queries=self.filters is None)

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """``[H, S]`` minus each key's projection on its head's filter, in the keys' dtype."""
        keys = observation.keys
        if self.filters is None:
            if observation.prompt_queries is None:
                raise ValueError("qfilter with filters=null needs the prompt's queries (TokenScorer.prompt_rows)")
            layer_filters = filters_from_queries(observation.prompt_queries, observation.num_heads)
        else:
            stored = load_filters(self.filters)
            expected = (observation.num_layers, observation.num_heads, keys.shape[-1])
            if tuple(stored.shape) != expected:
                raise ValueError(
                    f"method.params.filters={self.filters!r}: filters of shape {tuple(stored.shape)}, this model needs "
                    f"{expected} (compressed layers, stored heads, head dim)"
                )
            layer_filters = stored[observation.layer_idx]
        layer_filters = layer_filters.to(device=keys.device, dtype=keys.dtype)
        return -(layer_filters[:, None, :] * keys).sum(dim=-1)
