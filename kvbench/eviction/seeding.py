"""Random draws a method makes, seeded so that a sample's draws do not depend on which samples ran before it.

:func:`layer_generator` gives one CPU generator per (method, seed, sample, layer), :func:`sample_generator` one
per (method, seed, sample): a resumed run, a subset, a batched run or a reordered dataset draws exactly what an
uninterrupted run draws, and a built method holds no generator (it is a frozen recipe).  ``sample_key`` is
:attr:`kvbench.eviction.base.WindowObservation.sample_key` (a hash of the compressed prompt's token ids).
"""

from __future__ import annotations

import hashlib
import random

import torch


def derived_seed(*parts: object) -> int:
    """A 63-bit seed from ``parts`` (their ``/``-joined text hashed with BLAKE2b): stable across processes."""
    digest = hashlib.blake2b("/".join(str(part) for part in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def layer_generator(seed: int, sample_key: int, layer_idx: int, namespace: str = "nacl") -> torch.Generator:
    """A CPU generator for one layer of one sample, seeded from ``(namespace, seed, sample_key, layer_idx)``;
    ``namespace`` keeps two methods' streams apart (NACL's is ``nacl``, the first user)."""
    return torch.Generator().manual_seed(derived_seed(namespace, seed, sample_key, layer_idx))


def sample_generator(seed: int, sample_key: int, namespace: str) -> random.Random:
    """A Python generator for one sample, seeded from ``(namespace, seed, sample_key)`` (draws made once per sample,
    e.g. CAKE's random layer budgets)."""
    return random.Random(derived_seed(namespace, seed, sample_key))
