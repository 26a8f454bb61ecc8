"""Finch (Corallo and Papotti, TACL 2024, "FINCH: Prompt-guided Key-Value Cache Compression"): SnapKV-style scores
from a window that is the question, then the kept keys re-rotated to contiguous positions.

Reproduces NVIDIA/kvpress ``kvpress/presses/finch_press.py`` (``FinchPress``, kvpress 0.5.5, with
``KeyRerotationPress.rerotate_keys`` of ``key_rerotation_press.py``), which kvbench's tests hold as recordings
(``tests/fixtures/reference/finch/``):

1. the window is the question: kvpress finds it after a delimiter token (``context + <|finch_sep|> + question``, the
   delimiter removed from the embeddings); kvbench knows the question's tokens (question-aware mode), so the window
   is the question (``question_window``; in question-agnostic mode, or without a question, ``method.params.window``);
2. the window's queries attend to every key (causal in the window): the logits in the model dtype, the softmax in
   float32 cast back to the model dtype, the window's own keys left out;
3. ``normalize_scores``: window row ``i`` is multiplied by ``S - w + i`` (kvpress's "number of non-zero weights"),
   then the rows are averaged, then the query heads of each KV head (no pooling, unlike SnapKV);
4. the window gets ``max + 1`` (always kept); each head keeps its top ``n`` (kvpress's ``compression_ratio`` c is the
   budget ``<max(1, int(S (1 - c)))>/layer``);
5. ``rerotate_keys``: the kept keys, in position order, are re-rotated from their positions ``p`` to ``0 .. n-1``
   (``k cos(d) + rotate_half(k) sin(d)``, ``d = i - p``, the angles in float32 then cast to the model dtype), and
   the cache stores them there: the run records ``key_positions: rerotated`` and ``next_position: n``, and the
   question (agnostic mode) and the generated tokens continue from position ``n``, as kvpress's pipeline does
   (``context_length = cache.get_seq_length()`` after a Finch press).

kvpress's ``chunk_length`` (a top-k per chunk of the context) is not reproduced (its default is off).  Re-rotation
needs every head of every layer to keep the same number of tokens (a uniform budget; the allocation, layers,
selection and decoding wrappers are refused with it) and a model without sliding-window layers (refused with a clear
error); ``rerotate_keys: false`` lifts both.  Parity:
``tests/methods/test_finch.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from kvbench.eviction.base import WindowObservation
from kvbench.eviction.recipe import ScorerMethod
from kvbench.methods.expected_attention import rotate_half


@dataclass(frozen=True)
class Finch(ScorerMethod, family="finch", reference="NVIDIA/kvpress kvpress/presses/finch_press.py@0.5.5"):
    """Question-window attention scores, normalised per row; kept keys re-rotated (module docstring)."""

    #: Multiply window row ``i`` by ``S - w + i`` before averaging (kvpress's ``normalize_scores``).
    normalize_scores: bool = True
    #: Re-rotate the kept keys to positions ``0 .. n-1`` (kvpress's ``rerotate_keys``); off: they keep their positions.
    rerotate_keys: bool = True
    #: The window is the question (kvpress's delimiter); off: the last ``method.params.window`` prompt tokens.
    question_window: bool = True

    def __post_init__(self) -> None:
        uneven = {"allocation": "uniform", "layers": "uniform", "selection": "topk", "decode_interval": 0}
        for name, default in uneven.items():
            if self.rerotate_keys and getattr(self, name) != default:
                raise ValueError(
                    f"method.params.{name}={getattr(self, name)!r}: key re-rotation needs every head of every layer "
                    f"to keep the same number of tokens; valid with rerotate_keys=true: {name}={default}"
                )

    @property
    def rerotates_keys(self) -> bool:
        """Whether the session re-rotates the kept keys (:meth:`rerotated`)."""
        return self.rerotate_keys

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """``[H, S]`` scores in the model dtype; the window's ``max + 1``."""
        queries, keys = observation.queries, observation.keys
        heads, length, dim = keys.shape
        window = queries.shape[1]
        if window >= length:
            return torch.ones(heads, length, dtype=keys.dtype, device=keys.device)
        group = queries.shape[0] // heads
        mask = torch.triu(torch.full((window, length), float("-inf"), device=keys.device), diagonal=length - window + 1)
        counts = torch.arange(length - window, length, device=keys.device)[:, None]
        rows = []
        for head in range(heads):  # one KV head's query group at a time: [g, w, S] instead of [H_q, w, S]
            head_queries = queries[head * group : (head + 1) * group][None]  # [1, g, w, D]
            head_keys = keys[head][None, None].expand(1, group, length, dim)
            logits = torch.matmul(head_queries, head_keys.transpose(2, 3)) / math.sqrt(dim)
            logits = logits + mask.to(logits.dtype)
            probs = F.softmax(logits, dim=-1, dtype=torch.float32).to(queries.dtype)[..., :-window]
            if self.normalize_scores:
                probs = probs * counts
            rows.append(probs.mean(dim=-2))  # [1, g, S - w]
        scores = torch.cat(rows, dim=1).view(1, heads, group, length - window).mean(dim=2)[0]
        return F.pad(scores, (0, window), value=scores.max().item() + 1)

    def rerotated(
        self,
        keys: torch.Tensor,
        positions: torch.Tensor,
        rotary: Callable[[torch.Tensor, torch.dtype], tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """Keys ``[H, n, D]`` stored at ``positions`` ``[H, n]`` (ascending per head), re-rotated to ``0 .. n-1``."""
        return rerotate_keys(keys, positions, rotary)


def rerotate_keys(
    keys: torch.Tensor,
    positions: torch.Tensor,
    rotary: Callable[[torch.Tensor, torch.dtype], tuple[torch.Tensor, torch.Tensor]],
) -> torch.Tensor:
    """kvpress's ``KeyRerotationPress.rerotate_keys``: keys ``[H, n, D]`` (post-RoPE at ``positions`` ``[H, n]``)
    rotated by ``d = i - positions`` for slot ``i``: ``k cos(d) + rotate_half(k) sin(d)``, the tables ``[H n, D]``
    from the model's rotary embedding at the (negative) positions ``d`` in float32 (divided by its attention scaling
    when it has one: kvpress rotates by ``inv_freq`` alone), cast to the keys' dtype."""
    heads, kept, dim = keys.shape
    delta = torch.arange(kept, device=positions.device)[None, :] - positions  # [H, n]
    cos, sin = rotary(delta.reshape(-1), torch.float32)
    scale = rotary(torch.zeros(1, dtype=torch.long, device=positions.device), torch.float32)[0][0, 0]
    if float(scale) != 1.0:  # RoPE variants that scale the tables (YaRN's attention factor): a pure rotation here
        cos, sin = cos / scale, sin / scale
    cos = cos.reshape(heads, kept, dim).to(device=keys.device, dtype=keys.dtype)
    sin = sin.reshape(heads, kept, dim).to(device=keys.device, dtype=keys.dtype)
    return keys * cos + rotate_half(keys) * sin
