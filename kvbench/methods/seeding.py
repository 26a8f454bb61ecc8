"""Random draws a method makes, seeded so that a sample's draws do not depend on which samples ran before it.

:func:`layer_generator` gives one CPU generator per (method, seed, sample, layer): a resumed run, a subset or a
reordered dataset draws exactly what an uninterrupted run draws.  ``sample_key`` is
:attr:`kvbench.methods.base.WindowObservation.sample_key` (a hash of the compressed prompt's token ids).
"""

from __future__ import annotations

import hashlib

import torch


def layer_generator(seed: int, sample_key: int, layer_idx: int, namespace: str = "nacl") -> torch.Generator:
    """A CPU generator for one layer of one sample, seeded from ``(namespace, seed, sample_key, layer_idx)``;
    ``namespace`` keeps two methods' streams apart (NACL's is ``nacl``, the first user)."""
    digest = hashlib.blake2b(f"{namespace}/{seed}/{sample_key}/{layer_idx}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "big") >> 1)
