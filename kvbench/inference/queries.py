"""A model's own queries on a text, per layer: what calibration commands (Q-Filters, Expected Attention statistics)
compute their per-model tensors from.

:func:`record_queries` runs one forward with kvbench's attention function (:mod:`kvbench.attention.function`), whose
observer callback hands every layer's post-RoPE queries over; :func:`prerope` un-rotates them with the model's rotary
tables (:func:`kvbench.inference.prefill.rotary_tables`).
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from kvbench.inference.prefill import rotary_tables
from kvbench.inference.press import kvbench_attention
from kvbench.methods.expected_attention import unrotate


class QueryRecorder:
    """An attention observer (:class:`kvbench.attention.function.AttentionObserver`): keeps each layer's queries."""

    def __init__(self) -> None:
        self.queries: dict[int, torch.Tensor] = {}

    def after_attention(self, module: torch.nn.Module, query: torch.Tensor, scaling: float) -> None:
        self.queries[int(module.layer_idx)] = query[0].detach().float().cpu()


@torch.no_grad()
def record_queries(model: PreTrainedModel, input_ids: torch.Tensor) -> dict[int, torch.Tensor]:
    """Layer index -> ``[H_q, N, D]`` float32 post-RoPE queries of ``input_ids`` ``[1, N]`` (every attention layer;
    the model is left with its own attention implementation)."""
    recorder = QueryRecorder()
    with kvbench_attention(model):
        model(input_ids=input_ids.to(model.device), use_cache=False, kvbench_session=recorder)
    return recorder.queries


def prerope(model: PreTrainedModel, queries: torch.Tensor, first_position: int = 0) -> torch.Tensor:
    """``[H_q, N, D]`` float32 pre-RoPE queries from post-RoPE ``queries`` at positions ``first_position ...``."""
    tables = rotary_tables(model)
    if tables is None:
        raise ValueError(f"{type(model).__name__} has no single rotary embedding (model.get_decoder().rotary_emb)")
    positions = torch.arange(first_position, first_position + queries.shape[1])
    cos, sin = tables(positions, torch.float32)
    return unrotate(queries, cos.cpu(), sin.cpu())


def full_attention_layers(model: PreTrainedModel) -> list[int]:
    """The layer indices with full attention (kvbench compresses those; sliding-window layers are skipped)."""
    config = model.config.get_text_config()
    layer_types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    return [idx for idx, kind in enumerate(layer_types) if kind == "full_attention"]
