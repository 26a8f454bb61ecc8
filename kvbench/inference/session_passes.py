"""What the eviction session does beyond scoring a window and keeping the top-k: key re-rotation (Finch) and the
replay forwards of a method that scores the prompt by forwards of its own (KVzip), as a base class of
:class:`~kvbench.inference.eviction.EvictionSession` (its state lives there; the forwards are driven by
:mod:`kvbench.inference.replay`).

Re-rotation: once a layer is compressed, its kept keys (every head the same count ``n``) are re-rotated by the
scorer's ``rerotated(keys, positions, rotary)`` to positions ``0 .. n-1`` and stored there
(``rewrite_keys``); the layer's seen tokens become ``n``, so the tokens after the prompt are stored, and fed, at
``n, n+1, ...`` (:attr:`EvictionSession.position_shift`).

Replay: ``begin_replay(start, end)`` -> one forward of the replay tokens on top of the prompt, during which every
layer hands its queries to the scorer's ``replay_scores`` (scores of the prompt tokens ``start .. end-1``) ->
``end_replay`` removes the replay tokens; after the last pass ``compress_replayed`` evicts every layer at once from
the scorer's ``select``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from kvbench.cache.base import on_device

if TYPE_CHECKING:
    from kvbench.cache.kv_cache import HeadwiseLayer


class SessionPasses:
    """Key re-rotation and replay forwards of :class:`~kvbench.inference.eviction.EvictionSession` (module
    docstring); every attribute used here is the session's."""

    method: Any
    budget: Any
    cache: Any
    record: Any
    rotary: Any
    context_length: int
    compressible: list[int]
    next_position: int | None
    rerotated_from: dict[int, torch.Tensor]
    _rank: dict[int, int]
    _replay_scores: dict[int, torch.Tensor]
    _replay_span: tuple[int, int]
    _replay_prefix: int | None
    _requested: dict[int, tuple[int, list[int]]]
    _decode_caps: dict[int, list[int]]
    _scores: dict[int, list[torch.Tensor]]
    phase: str
    _note_bytes: Callable[[bool], None]

    def _rerotate(self, layer_idx: int, layer: HeadwiseLayer) -> None:
        """Re-rotate the layer's kept keys to contiguous positions ``0 .. n-1`` (Finch); every compressed layer must
        keep the same ``n`` per head, the position the tokens after the prompt continue from."""
        if self.rotary is None:
            raise ValueError(f"{self.method.family}: key re-rotation needs a model with a rotary embedding (RoPE)")
        if self.cache.sliding_layers:
            raise ValueError(
                f"{self.method.family}: key re-rotation on a model with sliding-window layers is not supported (their "
                "keys keep their positions); set method.params.rerotate_keys=false"
            )
        lengths = layer.head_lengths()
        if len(set(lengths)) != 1 or (self.next_position is not None and lengths[0] != self.next_position):
            raise ValueError(
                f"{self.method.family}: key re-rotation needs every head of every layer to keep the same number of "
                f"tokens, got {lengths} at layer {layer_idx} (next position {self.next_position}); use a uniform "
                "budget (no allocation/layers wrapper) or method.params.rerotate_keys=false"
            )
        keys, _ = layer.dense_kv()
        positions = torch.stack(layer.positions).long()
        rotated = self.method.scorer.rerotated(keys, positions, self.rotary)  # type: ignore[union-attr]
        new_positions = torch.arange(lengths[0], device=positions.device).expand_as(positions)
        with on_device(layer.positions[0].device):
            layer.rewrite_keys(rotated, new_positions)
        layer.seen_tokens = lengths[0]
        self.rerotated_from[layer_idx] = positions
        self.next_position = lengths[0]
        self.record.key_positions, self.record.next_position = "rerotated", lengths[0]

    # ------------------------------------------------------------------ replay forwards (KVzip)
    def begin_replay(self, start: int, end: int) -> None:
        """The next forward is a replay of the prompt (KVzip) that scores the prompt tokens ``start .. end - 1``; it
        is stored on top of the prompt and removed by :meth:`end_replay`."""
        self.phase = "replay"
        self._replay_span = (start, end)
        self._replay_prefix = start if self._replay_prefix is None else min(self._replay_prefix, start)

    def _replay_layer(self, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor) -> None:
        """Score the replayed span at one layer from the replay's queries ``[H_q, q, D]`` (post-RoPE)."""
        if layer_idx not in self._rank:
            raise ValueError(f"{self.method.family} does not support sliding-window layers")
        keys, _ = layer.dense_kv()  # [H, S + q, D]: the prompt, then the replay
        scores = self._replay_scores.get(layer_idx)
        if scores is None:
            dtype = getattr(self.method.scorer, "replay_score_dtype", None) or keys.dtype  # KVCompose: float32
            scores = torch.zeros(layer.num_heads, self.context_length, dtype=dtype, device=keys.device)
            self._replay_scores[layer_idx] = scores
        start, end = self._replay_span
        scorer = self.method.scorer
        scores[:, start:end] = scorer.replay_scores(query, keys, start, end)  # type: ignore[union-attr]
        self._note_bytes(prefill=True)

    def end_replay(self) -> None:
        """Remove the replayed tokens from every layer: the cache holds the prompt again."""
        context = self.context_length
        for layer_idx in self.compressible:
            layer = self.cache.headwise_layers[layer_idx]
            keep = torch.arange(context, device=layer.positions[0].device)
            with on_device(keep.device):
                layer.keep([keep] * layer.num_heads)
            layer.seen_tokens = context
        self.phase = "compress"

    def compress_replayed(self) -> None:
        """Evict every layer at once from the replay scores (the scorer's ``select`` splits the budget over layers
        and heads)."""
        context, num_layers = self.context_length, len(self.compressible)
        scores = [self._replay_scores[layer_idx] for layer_idx in self.compressible]
        heads = scores[0].shape[0]
        per_layer = int(self.budget.value) * heads if self.budget.fixed_per_layer else None
        total = self.budget.total(context, num_layers) * heads
        prefix = self._replay_prefix or 0  # the prompt tokens before the first replayed one (chat template prefix)
        kept = self.method.scorer.select(scores, total, per_layer, prefix)  # type: ignore[union-attr]
        for layer_idx, layer_scores, heads in zip(self.compressible, scores, kept, strict=True):
            layer = self.cache.headwise_layers[layer_idx]
            counts = [int(idx.numel()) for idx in heads]
            self._requested[layer_idx] = (round(sum(counts) / len(counts)), counts)
            self._decode_caps[layer_idx] = counts
            self._scores[layer_idx] = [s.float()[idx] for s, idx in zip(layer_scores, heads, strict=True)]
            if any(count < context for count in counts):
                with on_device(layer.positions[0].device):
                    layer.keep(heads)
                self.record.evicted = True
        self._replay_scores.clear()
