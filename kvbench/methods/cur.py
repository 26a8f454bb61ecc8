"""CUR (kvpress's ``CURPress``): keep the tokens with the largest approximate leverage of their key and value rows.

Reproduces NVIDIA/kvpress ``kvpress/presses/cur_press.py`` (``CURPress``, kvpress 0.5.5), in the keys' dtype:

1. per token, the squared L2 norm of its key and of its value (``k2``, ``v2``, ``[H, S]``); with
   ``use_random_leverage`` the keys and values are first projected on a Gaussian sketch ``[D, 20] / sqrt(20)``;
2. with ``use_local_approximation`` (default) each is divided by its sum over consecutive windows of
   ``local_window_size`` tokens (the last, shorter window is zero-padded), a local leverage estimate;
3. ``leverage_type`` combines them (``kv_product`` = ``k2 * v2``, default; ``kv_avg``, ``key``, ``value``), the
   result is normalised to sum to 1 per head and the first ``num_sinks`` tokens score 1.0 (so they are kept).

Reference choices reproduced: the sketch is drawn from torch's **global** generator (unseeded by the press) in
float32; kvpress multiplies bfloat16 keys by it, which torch refuses, so here the sketch is cast to the keys' dtype
(kvbench's only departure, for the bfloat16 case kvpress cannot run).  No token is protected besides the sinks'
score; kvpress's ``compression_ratio`` c is the budget ``<max(1, int(S (1 - c)))>/layer``.
Parity: ``tests/methods/test_cur.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from kvbench.eviction.base import WindowObservation
from kvbench.eviction.params import bounded, choice
from kvbench.eviction.recipe import ScorerMethod

LEVERAGE_TYPES = ("kv_product", "kv_avg", "key", "value")
#: Columns of the Gaussian sketch of ``use_random_leverage`` (kvpress's constant).
SKETCH_COLUMNS = 20


@dataclass(frozen=True)
class CUR(ScorerMethod, family="cur", reference="NVIDIA/kvpress kvpress/presses/cur_press.py@0.5.5"):
    """Local leverage scores of keys and values (module docstring)."""

    #: First tokens scored 1.0 (above every normalised score, so kept while the budget allows).
    num_sinks: int = bounded(4, 0)
    #: How key and value leverage combine.
    leverage_type: str = choice("kv_product", LEVERAGE_TYPES)
    #: Project keys and values on a Gaussian sketch (global generator) before the norms.
    use_random_leverage: bool = False
    #: Normalise the squared norms within windows of ``local_window_size`` tokens.
    use_local_approximation: bool = True
    #: Tokens per window of the local approximation.
    local_window_size: int = bounded(16, 1)

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """``[H, S]`` normalised leverage, sinks set to 1.0, in the keys' dtype."""
        keys, values = observation.keys, observation.values
        if self.use_random_leverage:
            sketch = torch.randn(keys.shape[-1], SKETCH_COLUMNS, device=keys.device) / math.sqrt(SKETCH_COLUMNS)
            keys, values = keys @ sketch.to(keys.dtype), values @ sketch.to(values.dtype)
        key_mass, value_mass = (keys**2).sum(dim=-1), (values**2).sum(dim=-1)  # [H, S]
        if self.use_local_approximation:
            key_mass, value_mass = self._local(key_mass), self._local(value_mass)
        combined = {
            "kv_product": lambda: key_mass * value_mass,
            "kv_avg": lambda: (key_mass + value_mass) / 2,
            "key": lambda: key_mass,
            "value": lambda: value_mass,
        }[self.leverage_type]()
        scores = combined / combined.sum(dim=-1, keepdim=True)
        scores[:, : self.num_sinks] = 1.0
        return scores

    def _local(self, mass: torch.Tensor) -> torch.Tensor:
        """``[H, S]`` each value divided by the sum of its window of ``local_window_size`` tokens."""
        heads, length = mass.shape
        width = self.local_window_size
        windows = F.pad(mass, (0, (width - length % width) % width)).reshape(heads, -1, width)
        return (windows / windows.sum(dim=-1, keepdim=True)).reshape(heads, -1)[:, :length]
