"""Record which key channels NVIDIA kvpress's ThinKPress keeps, for kvbench's ThinK parity test (issue #44).

Runs ONLY inside kvpress's own virtual environment (kvpress 0.5.5, transformers 5.2; see record_kvpress.py), never
imports kvbench, and reuses record_kvpress.py's seeded inputs (the tiny random Llama, its input ids, the seeded
key tensors of ``tests/fixtures/reference/kvpress/inputs.safetensors``)::

    OMP_NUM_THREADS=1 /work/venvs/kvpress/bin/python scripts/reference/record_think.py \
        --out tests/fixtures/reference/think

Writes ``queries.safetensors`` (the seeded window queries of the tensor cases) and ``ThinKPress.json``:

* ``tensor`` cases: ``ThinKPress(r).compress`` on the seeded keys ``[1, 2, S, 16]`` with seeded window queries
  ``[1, 4, 32, 16]`` (``compute_window_queries`` returns them: the tensors have no model to recompute them from);
* ``model`` cases: the tiny Llama's prefill (sdpa) under ``ThinKPress(r)`` alone and under
  ``ComposedPress([SnapKVPress(0.5), ThinKPress(0.5)])``.

Per case and layer: ``kept_channels[layer][kv_head]`` (the channels ThinKPress did not zero) and, for the composed
press, ``kept_tokens[layer][kv_head]`` (positions the SnapKV step kept, matched on the kept channels).
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from kvpress import ComposedPress, SnapKVPress, ThinKPress
from safetensors.torch import load_file, save_file
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_kvpress import (  # the sibling recorder: seeded inputs and the tiny Llama
    DTYPES,
    MODEL_CONFIG,
    build_model_weights,
    input_ids_for,
    load_model,
)

ROOT = Path(__file__).resolve().parents[2]
KVPRESS_INPUTS = ROOT / "tests" / "fixtures" / "reference" / "kvpress" / "inputs.safetensors"
QUERY_SEED = 4407
WINDOW = 32
RATIOS = (0.25, 0.5, 0.75)
TENSOR_LENGTHS = (16, 37, 64, 128)
MODEL_LENGTHS = (48, 128)


class GivenQueriesThinK(ThinKPress):
    """ThinKPress whose window queries are given (tensor cases: there is no model to recompute them)."""

    queries: torch.Tensor | None = None

    def compute_window_queries(self, module, hidden_states, position_embeddings):
        return self.queries


def zeroed_channels(keys: torch.Tensor) -> list[list[int]]:
    """``[1, H, S, D]`` -> per head the channels that are zero on every token (what ThinKPress pruned)."""
    zero = (keys[0] == 0).all(dim=1)  # [H, D]
    return [torch.nonzero(~zero[h]).flatten().tolist() for h in range(zero.shape[0])]


def tensor_cases(stored: dict[str, torch.Tensor]) -> tuple[list[dict], dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(QUERY_SEED)
    queries = {f"queries_S{s}": torch.randn(1, 4, WINDOW, 16, generator=generator) for s in TENSOR_LENGTHS}
    module = SimpleNamespace(config=SimpleNamespace(num_attention_heads=4), head_dim=16, layer_idx=0)
    cases = []
    for dtype_name, dtype in DTYPES.items():
        for length in TENSOR_LENGTHS:
            keys = stored[f"tensor/keys_S{length}"].to(dtype)
            values = stored[f"tensor/values_S{length}"].to(dtype)
            for ratio in RATIOS:
                press = GivenQueriesThinK(key_channel_compression_ratio=ratio, window_size=WINDOW)
                press.queries = queries[f"queries_S{length}"].to(dtype)
                kwargs = {"hidden_states": None, "position_embeddings": None}
                out_keys, _ = press.compress(module, None, keys.clone(), values, None, kwargs)
                cases.append(
                    {
                        "kind": "tensor",
                        "inputs": f"tensor/S{length}",
                        "queries": f"queries_S{length}",
                        "dtype": dtype_name,
                        "key_channel_compression_ratio": ratio,
                        "token_press": None,
                        "kept_channels": [zeroed_channels(out_keys)],
                    }
                )
    return cases, queries


def model_case(model, dtype_name: str, length: int, press, ratio: float, token_ratio: float | None, stored) -> dict:
    input_ids = input_ids_for(length)
    cache = DynamicCache()
    with torch.no_grad(), press(model):
        model.model(input_ids=input_ids, past_key_values=cache)
    channels, tokens = [], []
    for layer in range(MODEL_CONFIG["num_hidden_layers"]):
        keys = cache.layers[layer].keys
        kept = zeroed_channels(keys)
        channels.append(kept)
        before = stored[f"model/sdpa/{dtype_name}/S{length}/layer{layer}/keys"].to(DTYPES[dtype_name])
        per_head = []
        for head, head_channels in enumerate(kept):
            rows = keys[0, head][:, head_channels]
            full = before[0, head][:, head_channels]
            equal = (rows[:, None, :] == full[None, :, :]).all(-1)  # [S', S]
            assert bool((equal.sum(-1) == 1).all()), "ambiguous or missing token match"
            per_head.append(equal.float().argmax(-1).tolist())
        tokens.append(per_head)
    return {
        "kind": "model",
        "inputs": f"model/sdpa/{dtype_name}/S{length}",
        "dtype": dtype_name,
        "key_channel_compression_ratio": ratio,
        "token_press": None if token_ratio is None else {"press": "SnapKVPress", "compression_ratio": token_ratio},
        "kept_channels": channels,
        "kept_tokens": tokens,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    stored = load_file(KVPRESS_INPUTS)
    weights = build_model_weights()
    for name, tensor in weights.items():  # the same tiny Llama as kvpress/inputs.safetensors
        assert torch.equal(tensor, stored[f"weights/{name}"]), name
    cases, queries = tensor_cases(stored)
    for dtype_name, dtype in DTYPES.items():
        model = load_model(weights, dtype, "sdpa")
        for length in MODEL_LENGTHS:
            for ratio in RATIOS:
                press = ThinKPress(key_channel_compression_ratio=ratio, window_size=WINDOW)
                cases.append(model_case(model, dtype_name, length, press, ratio, None, stored))
            if length > 64:  # SnapKVPress's window 64 needs S > 64
                press = ComposedPress([SnapKVPress(compression_ratio=0.5), ThinKPress(0.5, WINDOW)])
                cases.append(model_case(model, dtype_name, length, press, 0.5, 0.5, stored))
    save_file(queries, str(args.out / "queries.safetensors"), metadata={"seed": str(QUERY_SEED)})
    versions = {name: metadata.version(name) for name in ("kvpress", "transformers", "torch")}
    recording = {
        "press": "ThinKPress",
        "reference": "NVIDIA/kvpress 0.5.5 kvpress/presses/think_press.py (ThinKPress)",
        "versions": versions,
        "recorder": "scripts/reference/record_think.py",
        "note": "kept_channels: channels ThinKPress did not zero, per layer and KV head; kept_tokens: positions kept "
        "(composed with SnapKVPress), in cache order.",
        "cases": cases,
    }
    (args.out / "ThinKPress.json").write_text(json.dumps(recording, indent=1) + "\n")
    print(f"{len(cases)} cases -> {args.out}")


if __name__ == "__main__":
    main()
