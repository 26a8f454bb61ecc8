"""Replay forwards with a backward pass, for a scorer that attributes the prompt by gradients (KVgrad,
:mod:`kvbench.methods.kvgrad`).

Generation runs under ``torch.inference_mode()``; a backward pass cannot, and tensors made there cannot be saved
for one nor updated in place outside it.  So, per replay pass (the scorer's ``replay_passes``, as KVzip's):

1. outside inference mode, with autograd on and the model's parameters frozen (``requires_grad`` off, restored
   afterwards), every compressible cache layer's buffers are replaced by ordinary copies (same values; the prompt's
   keys and values are never written: the replay's tokens are appended after them and removed after the pass);
2. the replay tokens' input embeddings (the model's own ``get_input_embeddings()``) become a leaf that requires grad,
   and go through kvbench's forward, cache and attention at the positions right after the prompt; during it the
   session keeps each layer's replay attention (``replay_attention``), and forward hooks (a public torch API) keep the
   last decoder layer's output ``h`` and each layer's attention output (``retain_grad``);
3. ``Phi = sum ||h||^2`` (float32) is back-propagated; each layer's scores of the replayed span are the scorer's
   ``gradient_scores`` of its replay attention, the span's stored values, its ``o_proj`` weight and the norms of
   ``Phi``'s gradient at its attention output; the graph is then dropped and the replay's tokens removed.

After the last pass the session evicts every layer at once (``compress_replayed``), as after KVzip's replay.
Supported on the torch cache backend (the prefill builds it for such a scorer on every device: the paged backend's
CUDA kernels have no backward), on models whose attention modules have ``o_proj``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from kvbench.cache.kv_cache import HeadwiseLayer
from kvbench.inference.eviction import EvictionSession

#: The tensors of a :class:`HeadwiseLayer` that a replay appends to in place.
_LAYER_TENSORS = ("key_buffer", "value_buffer", "position_buffer", "lengths")


@contextmanager
def frozen_parameters(model: torch.nn.Module) -> Iterator[None]:
    """Parameters that required grad stop doing so inside the block (only activations get gradients)."""
    thawed = [p for p in model.parameters() if p.requires_grad]
    for parameter in thawed:
        parameter.requires_grad_(False)
    try:
        yield
    finally:
        for parameter in thawed:
            parameter.requires_grad_(True)


def ordinary_tensors(layer: HeadwiseLayer) -> None:
    """Replace the layer's buffers by detached copies made outside inference mode (call outside it)."""
    for name in _LAYER_TENSORS:
        tensor = getattr(layer, name)
        if tensor is not None:
            setattr(layer, name, tensor.detach().clone())
    layer._refresh_views()


def replay_with_gradients(
    model: Any,
    session: EvictionSession,
    passes: Sequence[tuple[list[int], int, int]],
    context: int,
    device: torch.device,
    forward: Any,
) -> None:
    """Run ``passes`` with a backward each and write the session's replay scores (module docstring); ``forward`` is
    the prefill's forward wrapper (:func:`kvbench.inference.prefill.forward_logits`), fed the passes' embeddings."""
    scorer = session.method.scorer
    layers = [session.cache.headwise_layers[idx] for idx in session.compressible]
    if not all(type(layer) is HeadwiseLayer for layer in layers):
        raise ValueError(
            f"{session.method.family} back-propagates through the cache: it needs the torch cache backend "
            "(KVBenchCache(backend='torch'), what kvbench's prefill builds for it), not the paged one"
        )
    decoder = model.get_decoder()
    attention = {int(block.self_attn.layer_idx): block.self_attn for block in decoder.layers}
    captured: dict[Any, torch.Tensor] = {}

    def keep_final(module: torch.nn.Module, args: tuple, output: Any) -> None:
        captured["final"] = output[0] if isinstance(output, tuple) else output

    def keep_attention(module: torch.nn.Module, args: tuple, output: Any) -> None:
        out = output[0] if isinstance(output, tuple) else output
        if out.requires_grad:
            out.retain_grad()
            captured[int(module.layer_idx)] = out

    hooks = [decoder.layers[-1].register_forward_hook(keep_final)]
    hooks += [attention[idx].register_forward_hook(keep_attention) for idx in session.compressible]
    embed = model.get_input_embeddings()
    try:
        with torch.inference_mode(False), torch.enable_grad(), frozen_parameters(model):
            for layer in layers:
                ordinary_tensors(layer)
            for replay_ids, start, end in passes:
                captured.clear()
                session.begin_replay(start, end)
                ids = torch.tensor([list(replay_ids)], dtype=torch.long, device=device)
                embeds = embed(ids).detach().requires_grad_(True)
                forward(model, embeds, context, session.cache, session, device)
                captured["final"].float().square().sum().backward()
                with torch.no_grad():
                    for layer_idx, layer in zip(session.compressible, layers, strict=True):
                        _score_layer(session, scorer, layer_idx, layer, attention[layer_idx], captured, start, end)
                    captured.clear()
                    session.end_replay()
                    for layer in layers:
                        ordinary_tensors(layer)  # no graph kept on the buffers
    finally:
        for hook in hooks:
            hook.remove()
        session._replay_attention.clear()


def _score_layer(
    session: EvictionSession, scorer: Any, layer_idx: int, layer: HeadwiseLayer, module: torch.nn.Module,
    captured: dict[Any, torch.Tensor], start: int, end: int,
) -> None:  # fmt: skip
    """One layer's scores of the span ``start .. end - 1`` into the session's replay scores (model dtype)."""
    output = captured.get(layer_idx)
    if output is None or output.grad is None:
        raise RuntimeError(f"{session.method.family}: no gradient reached layer {layer_idx}'s attention output")
    projection = getattr(getattr(module, "o_proj", None), "weight", None)
    if projection is None:
        raise ValueError(f"{session.method.family} needs the attention output projection (o_proj) of every layer")
    _, values = layer.dense_kv()  # [H, S + q, D]: the prompt, then the replay
    gradient_norm = output.grad[0].float().norm(dim=-1)  # [q]
    scores = scorer.gradient_scores(
        session._replay_attention.pop(layer_idx), values[:, start:end].detach(), projection, gradient_norm
    )
    stored = session._replay_scores.get(layer_idx)
    if stored is None:
        stored = torch.zeros(layer.num_heads, session.context_length, dtype=values.dtype, device=values.device)
        session._replay_scores[layer_idx] = stored
    stored[:, start:end] = scores
