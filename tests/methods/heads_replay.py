"""Replay the recordings of DuoAttention, HeadKV and SimLayerKV (``tests/fixtures/reference/heads/``, made by
``scripts/reference/record_heads.py`` outside the project) through kvbench's methods and eviction session.

Model cases use the tiny Llama's per-layer inputs stored with the kvpress recordings (``model/sdpa/<dtype>/S<S>``;
the recorder checked that its layers saw exactly those); the queries are recomputed from the stored attention inputs
(:func:`tests.methods.kvpress_replay.model_queries`).  Nothing here imports the references.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import load_file

from kvbench.methods.base import EvictionMethod, WindowObservation
from tests.methods.kvpress_replay import keep_one_layer, model_queries
from tests.reference_recordings import DTYPES, stored_input

HEADS = Path(__file__).resolve().parents[1] / "fixtures" / "reference" / "heads"


@cache
def recording(name: str) -> dict:
    """``<name>.json`` of the heads recordings (format_version 1)."""
    raw = json.loads((HEADS / f"{name}.json").read_text())
    assert raw["format_version"] == 1
    return raw


@cache
def _extra_inputs() -> dict[str, torch.Tensor]:
    return load_file(HEADS / "inputs.safetensors")


def tensor_queries(length: int, dtype: str) -> torch.Tensor:
    """``[H_q, S, D]`` seeded queries of HeadKV's tensor cases."""
    return _extra_inputs()[f"tensor/queries_S{length}"][0].to(DTYPES[dtype])


def model_layers(inputs: str, dtype: str) -> list[dict[str, torch.Tensor]]:
    """Per layer of a model case: ``keys``/``values`` ``[H_kv, S, D]`` and post-RoPE ``queries`` ``[H_q, S, D]``."""
    layers = []
    for layer in range(2):
        tensors = {name: stored_input(f"{inputs}/layer{layer}/{name}") for name in ("hidden_states", "keys", "values")}
        queries = model_queries(SimpleNamespace(dtype=dtype), layer, tensors)
        layers.append({"keys": tensors["keys"][0], "values": tensors["values"][0], "queries": queries})
    return layers


def kept_by_kvbench(
    method: EvictionMethod,
    layer: int,
    num_layers: int,
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    per_layer_budget: int,
) -> list[list[int]]:
    """kvbench's session on one layer at ``<per_layer_budget>/layer``: sorted kept positions per stored head.

    ``queries`` ``[H_q, W, D]`` are the observation window's; ``keys``/``values`` ``[H, S, D]`` the stored heads.
    """
    observation = WindowObservation(layer, num_layers, queries, keys, values, keys.shape[-1] ** -0.5)
    return keep_one_layer(method, observation, per_layer_budget)
