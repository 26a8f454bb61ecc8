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
from typing import Any

import torch
from safetensors.torch import load_file

from kvbench.eviction.base import EvictionMethod, WindowObservation
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


#: The families that read a per-model head file, and the ``method.params`` key naming it.
HEAD_FILE_PARAMS = {"duo_attention": "pattern", "headkv": "head_scores", "kvzap": "checkpoint"}


def seeded_kvzap(folder: Path, model_config: Any) -> Path:
    """A seeded linear KVzap checkpoint (published format) of ``model_config``'s shape, written under ``folder``."""
    from kvbench.eviction.surrogates import save_kvzap

    text = getattr(model_config, "text_config", None) or model_config
    hidden, heads, layers = text.hidden_size, text.num_key_value_heads, text.num_hidden_layers
    generator = torch.Generator().manual_seed(45)
    modules = [(torch.randn(heads, hidden, generator=generator), torch.randn(heads, generator=generator))
               for _ in range(layers)]  # fmt: skip
    return save_kvzap(folder / f"kvzap_{layers}x{hidden}x{heads}", modules, hidden, heads, None)


#: Families whose knob holds one number per compressible layer (a mismatched length is an error, by design).
MODEL_SHAPED_PARAMS = {"per_layer": "compression_ratios"}


def fitted_to_model(method_cfg: Any, model_config: Any, folder: Path) -> Any:
    """``method_cfg`` with its per-model head file (DuoAttention's pattern, HeadKV's scores) replaced by a seeded one
    of the model's shape (compressible layers x KV heads, or x query heads for HeadKV), written under ``folder``, or
    its per-layer numbers (:data:`MODEL_SHAPED_PARAMS`) by seeded ones, one per compressible layer;
    any other family's config unchanged.  For generic suites that run every family on other models than the one the
    shipped files were estimated for (a mismatched file is an error, by design)."""
    family = str(method_cfg.family)
    if family not in HEAD_FILE_PARAMS and family not in MODEL_SHAPED_PARAMS:
        return method_cfg
    from omegaconf import OmegaConf

    from kvbench.cache.sliding import layer_windows

    layers = sum(window is None for window in layer_windows(model_config))
    if layers == 0:  # nothing is compressed: the shipped file is never read
        return method_cfg
    if family == "kvzap":  # a seeded linear surrogate with a module per model layer (sliding ones included)
        target = seeded_kvzap(folder, model_config)
        fitted = OmegaConf.create(OmegaConf.to_container(method_cfg))
        fitted.params.checkpoint, fitted.params.model_type = str(target), "linear"
        return fitted
    if family in MODEL_SHAPED_PARAMS:  # one number per compressible layer (per_layer's ratios), seeded
        fitted = OmegaConf.create(OmegaConf.to_container(method_cfg))
        ratios = torch.rand(layers, generator=torch.Generator().manual_seed(45)) * 0.9
        fitted.params[MODEL_SHAPED_PARAMS[family]] = [round(float(ratio), 3) for ratio in ratios]
        return fitted
    heads = model_config.num_key_value_heads if family == "duo_attention" else model_config.num_attention_heads
    gates = torch.rand(layers, heads, generator=torch.Generator().manual_seed(44)).tolist()
    if family == "duo_attention":
        target = folder / f"duo_{layers}x{heads}"
        target.mkdir(parents=True, exist_ok=True)
        (target / "full_attention_heads.tsv").write_text("\n".join("\t".join(map(str, row)) for row in gates) + "\n")
        (target / "config.json").write_text(json.dumps({"sink_size": 4, "recent_size": 16}))
    else:
        target = folder / f"headkv_{layers}x{heads}.json"
        scores = {f"{layer}-{head}": [gates[layer][head]] for layer in range(layers) for head in range(heads)}
        target.write_text(json.dumps(scores) + "\n")
    fitted = OmegaConf.create(OmegaConf.to_container(method_cfg))
    fitted.params[HEAD_FILE_PARAMS[family]] = str(target)
    return fitted
