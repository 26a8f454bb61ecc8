"""Seeded sampling settings (:class:`Sampling`): plain data a task declares (LongBench v2's official
``temperature=0.1``, the reasoning evaluations' ``temperature``/``top_p``) and the decoder reads
(:func:`kvbench.inference.generate.sample_token`).  Greedy decoding is the default everywhere; sampling is a switch.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Sampling:
    """Seeded sampling instead of greedy choice (a dataset's switch, e.g. LongBench v2's official
    ``temperature=0.1``): logits divided by ``temperature``, then nucleus filtering to the smallest set of tokens
    whose probability reaches ``top_p`` (the most likely token always kept; ``top_p=1`` keeps all), then one draw
    from a ``torch.Generator`` seeded with ``seed`` (vLLM's order: temperature, then top-p)."""

    temperature: float
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"sampling temperature must be > 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling top_p must be in (0, 1], got {self.top_p!r}")

    def for_sample(self, sample_id: str) -> Sampling:
        """The same settings with a seed of its own for one sample (``seed`` + crc32 of its id), so every sample
        draws reproducibly whatever order or batch it runs in."""
        return replace(self, seed=(self.seed + zlib.crc32(sample_id.encode("utf-8"))) % (2**63))

    def to_json(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p, "seed": self.seed}
