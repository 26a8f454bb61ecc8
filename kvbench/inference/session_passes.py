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
the scorer's ``select``.  A scorer that ``needs_gradient`` (KVgrad) has its ``replay_attention`` kept per layer
instead, and :mod:`kvbench.inference.gradient_replay` writes the scores after the pass's backward.
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
    _replay_attention: dict[int, torch.Tensor]
    _rows: dict[int, Any]
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
        start, end = self._replay_span
        scorer = self.method.scorer
        if getattr(scorer, "needs_gradient", False):  # KVgrad: scored after the backward (gradient_replay)
            with torch.no_grad():
                self._replay_attention[layer_idx] = scorer.replay_attention(query.detach(), keys.detach(), start, end)
            self._note_bytes(prefill=True)
            return
        scores = self._replay_scores.get(layer_idx)
        if scores is None:
            dtype = getattr(self.method.scorer, "replay_score_dtype", None) or keys.dtype  # KVCompose: float32
            scores = torch.zeros(layer.num_heads, self.context_length, dtype=dtype, device=keys.device)
            self._replay_scores[layer_idx] = scores
        scores[:, start:end] = scorer.replay_scores(query, keys, start, end)  # type: ignore[union-attr]
        self._note_bytes(prefill=True)

    def _score_hidden_states(self, layer_idx: int, context: int) -> None:
        """A replaying scorer that scores the prompt from the layers' hidden states (Fast KVzip): once the layer's
        last prefill chunk is stored, its ``hidden_scores`` become the layer's replay scores."""
        scorer = self.method.scorer
        if not hasattr(scorer, "hidden_scores") or context < self.context_length:
            return
        rows = self._rows.pop(layer_idx, None)
        states = None if rows is None else rows.prerope(1)
        if states is None:
            raise ValueError(
                f"{self.method.family} scores the layers' hidden states: it needs a model whose attention modules "
                "kvbench can hook (q_proj/k_proj or qkv_proj), run through kvbench's prefill"
            )
        self._replay_scores[layer_idx] = scorer.hidden_scores(states.hidden_states, states.module)
        self.record.learned_weights = scorer.learned_weights(states.module)

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
        total, per_layer, layer_kept = self._replay_budget(num_layers, heads)
        prefix = self._replay_prefix or 0  # the prompt tokens before the first replayed one (chat template prefix)
        kept = self.method.scorer.select(scores, total, per_layer, prefix, layer_kept)  # type: ignore[union-attr]
        restored = self.restored_tokens  # RestoreKV's restore tokens, after the prompt: always kept
        for layer_idx, layer_scores, chosen in zip(self.compressible, scores, kept, strict=True):
            layer = self.cache.headwise_layers[layer_idx]
            heads = chosen
            if restored:
                tail = torch.arange(context, context + restored, device=chosen[0].device, dtype=chosen[0].dtype)
                heads = [torch.cat([idx, tail]) for idx in chosen]
            counts = [int(idx.numel()) for idx in heads]
            self._requested[layer_idx] = (round(sum(counts) / len(counts)), counts)
            self._decode_caps[layer_idx] = counts
            self._scores[layer_idx] = [s.float()[idx] for s, idx in zip(layer_scores, chosen, strict=True)]
            if any(count < context + restored for count in counts):
                with on_device(layer.positions[0].device):
                    layer.keep(heads)
                self.record.evicted = True
        self._replay_scores.clear()

    def _replay_budget(self, num_layers: int, heads: int) -> tuple[int, int | None, int | None]:
        """``(total, per_layer, layer_kept)`` prompt tokens the scorer's ``select`` keeps: ``<c>cr``: kvpress's
        KVzipPress evicts ``int(L H S c)`` tokens over the layers (``int(H S c)`` per layer, layerwise); with ``n``
        restore tokens (RestoreKV) ``c`` is raised to ``min(1, c + n / S)`` as kvpress does, and any other budget sets
        ``n`` slots per layer and head aside."""
        context, restored, budget = self.context_length, self.restored_tokens, self.budget
        per_layer = max(0, int(budget.value) - restored) * heads if budget.fixed_per_layer else None
        ratio = min(1.0, budget.value + restored / context) if restored and budget.kind == "compression" else None
        total = budget.kvpress_global_kept(num_layers * heads * context, ratio)
        if total is None:
            total = max(0, budget.total(context, num_layers) * heads - restored * num_layers * heads)
        return total, per_layer, budget.kvpress_global_kept(heads * context, ratio)
