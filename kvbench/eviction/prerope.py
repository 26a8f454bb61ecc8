"""Pre-RoPE keys and queries, for the scorers that read them (Expected Attention, leverage scores, Compactor).

kvpress recomputes them from the layer's input: ``k_proj`` / ``q_proj`` of the attention module's hidden states
(then the per-head ``k_norm`` / ``q_norm`` of the models that have one), in the model dtype.  kvbench does the same
on a model path: the session keeps the layer's input hidden states during the compressing prefill and hands the
scorer a :class:`PreRopeStates` that projects them (:attr:`WindowObservation.prerope`, built by
:mod:`kvbench.inference.hidden_states`).  Where no hidden states exist (a scorer driven by hand-built tensors, an
attention module of a layout kvbench does not know) :func:`prerope_states` falls back to :class:`UnrotatedStates`:
the stored post-RoPE keys (and every prompt query) un-rotated with the model's rotary tables in float32, rounded to
the model dtype -- the same states up to rounding (float32 scores agree to ~1e-6), but in bfloat16 the rounding
differs from the projection's, so a few kept tokens at the cut may too.  Each sample's cache record says which
was used (``prerope_states``: ``hidden_states`` or ``unrotated``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from kvbench.eviction.base import WindowObservation

#: Where pre-RoPE states come from: the layer's input hidden states (kvpress's way), or un-rotated stored states.
SOURCES = ("hidden_states", "unrotated")


class PreRopeStates(Protocol):
    """Pre-RoPE keys and queries of a layer's prompt positions ``first .. last - 1``, in the model dtype."""

    #: One of :data:`SOURCES`.
    source: str

    def keys(self, first: int = 0, last: int | None = None) -> torch.Tensor:
        """``[H, n, D]`` pre-RoPE keys (one row per stored head)."""
        ...

    def queries(self, first: int = 0, last: int | None = None) -> torch.Tensor:
        """``[H_q, n, D]`` pre-RoPE queries."""
        ...


def rotate_half(states: torch.Tensor) -> torch.Tensor:
    """``[-x2, x1]`` for ``x = [x1, x2]`` split along the last dimension (the rotary convention of Llama)."""
    first, second = states.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def unrotate(states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Pre-RoPE states ``[H, N, D]`` (float32) from post-RoPE ``states`` and the tables ``cos, sin`` ``[N, D]`` that
    rotated them (the inverse of ``x cos + rotate_half(x) sin``, scaled rotations included)."""
    states, cos, sin = states.float(), cos.float(), sin.float()
    return (states * cos - rotate_half(states) * sin) / (cos * cos + sin * sin)


@dataclass
class UnrotatedStates:
    """The fallback: the observation's stored keys and prompt queries (positions ``0 .. S-1``) un-rotated with its
    rotary tables in float32, rounded to their dtype (module docstring)."""

    observation: WindowObservation
    source: str = "unrotated"

    def _unrotated(self, states: torch.Tensor, first: int) -> torch.Tensor:
        rotary = self.observation.rotary
        if rotary is None:
            raise ValueError("this method needs the model's rotary embedding (a RoPE model) for its pre-RoPE states")
        positions = torch.arange(first, first + states.shape[1], device=states.device)
        cos, sin = rotary(positions, states.dtype)
        return unrotate(states, cos, sin).to(states.dtype)

    def keys(self, first: int = 0, last: int | None = None) -> torch.Tensor:
        return self._unrotated(self.observation.keys[:, first:last], first)

    def queries(self, first: int = 0, last: int | None = None) -> torch.Tensor:
        queries = self.observation.prompt_queries
        if queries is None or queries.shape[1] != self.observation.context_length:
            raise ValueError(
                "pre-RoPE queries without the layer's hidden states need every prompt query "
                "(PromptRows.prerope_queries)"
            )
        return self._unrotated(queries[:, first:last], first)


@dataclass
class GatheredStates:
    """``states`` restricted to ``positions`` ``[H, n]`` per stored head (a wrapper's candidate tokens,
    :mod:`kvbench.eviction.selection`): keys gathered per head, queries unchanged (every prompt query)."""

    states: PreRopeStates
    positions: torch.Tensor
    _all_keys: torch.Tensor | None = None

    @property
    def source(self) -> str:
        return self.states.source

    def keys(self, first: int = 0, last: int | None = None) -> torch.Tensor:
        if self._all_keys is None:
            self._all_keys = self.states.keys()
        index = self.positions[:, first:last].to(self._all_keys.device)
        return self._all_keys.gather(1, index[..., None].expand(-1, -1, self._all_keys.shape[-1]))

    def queries(self, first: int = 0, last: int | None = None) -> torch.Tensor:
        return self.states.queries(first, last)


def prerope_states(observation: WindowObservation) -> PreRopeStates:
    """The observation's pre-RoPE states: from the layer's hidden states when the session gave them
    (:attr:`~kvbench.eviction.base.WindowObservation.prerope`), else un-rotated (:class:`UnrotatedStates`)."""
    return observation.prerope if observation.prerope is not None else UnrotatedStates(observation)
