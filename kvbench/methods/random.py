"""Random: keep a uniformly random subset of the tokens (the baseline every eviction method must beat).

Reproduces NVIDIA/kvpress ``kvpress/presses/random_press.py`` (``RandomPress``, kvpress 0.5.5) by default: every
layer's scores are ``torch.rand`` over ``[H_kv, S]`` drawn on the keys' device in the keys' dtype, and no token is
protected.

* ``seed: null`` (kvpress's default): draws from torch's global generator, which a kvbench run seeds once
  (``seed``); the draws then depend on the samples compressed before (a resumed run draws differently).
* ``seed: <int>``: a generator of its own seeded with ``seed`` for each layer's draw, as kvpress (every layer and
  every sample of the same shape draws the same numbers).
* ``per_sample: true`` (kvbench's switch, off by default): draws from a generator of its own per (seed, sample,
  layer) (:func:`kvbench.eviction.seeding.layer_generator`), so a sample's draws depend on nothing else and the
  global generator is left alone.

Parity with kvpress's recorded selections: ``tests/methods/test_random.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvbench.eviction.base import WindowObservation
from kvbench.eviction.recipe import ScorerMethod
from kvbench.eviction.seeding import layer_generator


@dataclass(frozen=True)
class Random(ScorerMethod, family="random", reference="NVIDIA/kvpress kvpress/presses/random_press.py@0.5.5"):
    """Uniform random scores (module docstring)."""

    #: ``null``: torch's global generator; an integer: a generator seeded with it for every draw (kvpress's modes).
    seed: int | None = None
    #: kvbench's switch: one generator per (seed, sample, layer) instead of kvpress's global one.
    per_sample: bool = False

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """``[H, S]`` uniform draws in ``[0, 1)``, in the keys' dtype."""
        keys = observation.keys
        generator = None
        if self.per_sample:
            generator = layer_generator(self.seed or 0, observation.sample_key, observation.layer_idx, "random")
            return torch.rand(keys.shape[:-1], generator=generator, dtype=keys.dtype).to(keys.device)
        if self.seed is not None:
            generator = torch.Generator(device=keys.device).manual_seed(self.seed)
        return torch.rand(keys.shape[:-1], generator=generator, device=keys.device, dtype=keys.dtype)
