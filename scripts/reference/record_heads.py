"""Record what DuoAttention, HeadKV and SimLayerKV keep, for kvbench's parity tests (issue #44).

Runs ONLY inside kvpress's virtual environment (kvpress 0.5.5, transformers 5.2; it never imports kvbench), with the
two original repositories checked out as plain folders (their selection code runs on CPU)::

    git --git-dir <mirror of mit-han-lab/duo-attention> archive HEAD duo_attn | tar -x -C /tmp/duo-attention
    git --git-dir <mirror of FYYFU/HeadKV> archive HEAD headkv | tar -x -C /tmp/headkv
    OMP_NUM_THREADS=1 /work/venvs/kvpress/bin/python scripts/reference/record_heads.py \
        --duo-attention /tmp/duo-attention --duo-commit <sha> --headkv /tmp/headkv --headkv-commit <sha>

What runs where (format and notes: ``tests/fixtures/reference/heads/README.md``):

* DuoAttention, head selection: the original's ``duo_attn.utils.load_attn_pattern`` + ``sparsify_attention_heads``
  (after ``np.random.seed(42)``, as ``eval/LongBench/pred.py``'s ``seed_everything(42)``), and kvpress's
  ``DuoAttentionPress.post_init_from_model`` (its Hub download replaced by the same pattern folder).  Kept tokens on
  the tiny Llama: kvpress's press under its pipeline prefill (it masks ``[sink, S - recent)`` of streaming heads).
* HeadKV: the original's ``headkv/snapkv_utils.py`` ``ReasonSnapKVCluster.update_kv`` (head scores from the fixture
  JSON, placed where the class looks for the Llama-3 file), on seeded tensors and on the tiny Llama's queries/keys.
* SimLayerKV: kvpress's ``SimLayerKVPress`` under the pipeline prefill of the tiny Llama (it needs the attention
  module), with the lazy score of every layer.

The tiny Llama, its weights and the per-layer inputs are ``record_kvpress.py``'s; the recorder checks that its layers
saw exactly the tensors stored in ``tests/fixtures/reference/kvpress/inputs.safetensors``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record_kvpress as rk  # the tiny Llama, the kept-index tracker, the writers

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "reference" / "heads"
KVPRESS_INPUTS = ROOT / "tests" / "fixtures" / "reference" / "kvpress" / "inputs.safetensors"
FORMAT_VERSION = 1
DTYPES = rk.DTYPES
QUERY_SEED = 4404  # seeded queries of HeadKV's tensor cases
QUERY_HEADS = 4


def load_module(name: str, path: Path, stand_ins: tuple[str, ...] = ()):
    """Import the file at ``path``; ``stand_ins`` are empty modules for imports the recorded functions never use."""
    from unittest import mock

    fakes = {}
    for module_name in stand_ins:
        fake = mock.MagicMock()
        fake.__name__, fake.__path__, fake.__spec__ = module_name, [], None
        fakes[module_name] = fake
    with mock.patch.dict(sys.modules, fakes):
        return _exec_module(name, path)


def _exec_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------------------------ shared
def check_stored(stored: dict, prefix: str, tracker: rk.Tracker, length: int) -> None:
    """The tracker's layer inputs are the ones ``record_kvpress.py`` stored (same weights, ids, transformers)."""
    for layer, seen in tracker.prefill_inputs.items():
        for name, value in seen.items():
            key = f"{prefix}/layer{layer}/{name}"
            if not torch.equal(stored[key], value.contiguous()):
                raise RuntimeError(f"{key}: differs from the kvpress recordings' inputs")


def model_prefill(model, press, length: int, dtype: str, stored: dict) -> rk.Tracker:
    tracker, _ = rk.run_model_prefill(model, press, rk.input_ids_for(length))
    check_stored(stored, f"model/sdpa/{dtype}/S{length}", tracker, length)
    return tracker


# ------------------------------------------------------------------------------------------------ DuoAttention
DUO_SPARSITIES = (0.0, 0.25, 0.5, 0.6, 0.75, 1.0)


def record_duo(duo_root: Path, commit: str, models: dict, stored: dict) -> dict:
    import kvpress

    # duo_attn/utils.py imports the tensor_parallel package at module level for its multi-GPU helpers; the two
    # selection functions recorded here do not use it.
    tp_modules = ("tensor_parallel", "tensor_parallel.config", "tensor_parallel.communications",
                  "tensor_parallel.aux_actions", "tensor_parallel.state_actions", "tensor_parallel.pretrained_model",
                  "tensor_parallel.autoconfig")  # fmt: skip
    utils = load_module("duo_attn_utils", duo_root / "duo_attn" / "utils.py", tp_modules)
    cases = []
    for folder in ("duo_pattern_4x4", "duo_pattern_tiny_llama"):
        pattern_dir = FIXTURES / folder
        for sparsity in DUO_SPARSITIES:
            heads, sink, recent = utils.load_attn_pattern(str(pattern_dir))
            np.random.seed(42)  # eval/LongBench/pred.py: seed_everything(42) before sparsify_attention_heads
            mask, achieved = utils.sparsify_attention_heads(heads, None, sparsity=sparsity)
            press = kvpress.DuoAttentionPress(head_compression_ratio=sparsity)
            type(press).load_attention_pattern = staticmethod(
                lambda model, d=pattern_dir: (lambda h, s, r: (s, r, h))(*utils.load_attn_pattern(str(d)))
            )
            press.post_init_from_model(SimpleNamespace(device="cpu"))
            cases.append(
                {
                    "kind": "head_selection",
                    "pattern": folder,
                    "sparsity": sparsity,
                    "original_retrieval": mask.astype(int).tolist(),
                    "original_sparsity": float(achieved),
                    "kvpress_retrieval": (~press.streaming_mask).int().tolist(),
                    "sink_size": sink,
                    "recent_size": recent,
                }
            )
    # Kept tokens on the tiny Llama under kvpress's press (masking: kept = not masked).
    pattern_dir = FIXTURES / "duo_pattern_tiny_llama"
    for dtype, model in models.items():
        for length in rk.MODEL_LENGTHS:
            for sparsity in (0.25, 0.5, 0.75):
                press = kvpress.DuoAttentionPress(head_compression_ratio=sparsity)
                type(press).load_attention_pattern = staticmethod(
                    lambda model, d=pattern_dir: (lambda h, s, r: (s, r, h))(*utils.load_attn_pattern(str(d)))
                )
                tracker = model_prefill(model, press, length, dtype, stored)
                cases.append(
                    {
                        "kind": "model",
                        "inputs": f"model/sdpa/{dtype}/S{length}",
                        "dtype": dtype,
                        "pattern": "duo_pattern_tiny_llama",
                        "sparsity": sparsity,
                        "sink_size": press.sink_size,
                        "recent_size": press.recent_size,
                        "kvpress_retrieval": (~press.streaming_mask).int().tolist(),
                        "kept": tracker.kept(),
                    }
                )
    return {
        "method": "duo_attention",
        "references": {
            "original": {"repo": "mit-han-lab/duo-attention", "commit": commit, "file": "duo_attn/utils.py"},
            "kvpress": {"package": "kvpress", "file": "kvpress/presses/duo_attention_press.py"},
        },
        "cases": cases,
    }


# ------------------------------------------------------------------------------------------------ HeadKV
HEADKV_CAPACITIES = (16, 24, 40)
HEADKV_BETAS = (1.005, 1.5)
HEADKV_WINDOW, HEADKV_KERNEL = 8, 7


def headkv_tree(headkv_root: Path) -> Path:
    """A copy of the original's ``headkv/`` with the fixture scores where ``ReasonSnapKVCluster`` reads Llama-3's."""
    tree = Path(tempfile.mkdtemp(prefix="headkv_ref_"))
    shutil.copytree(headkv_root / "headkv", tree / "headkv")
    target = tree / "Important_Head" / "head_score" / "Meta-Llama-3-8B-Instruct_retrieval_reasoning_heads.json"
    target.parent.mkdir(parents=True)
    shutil.copy(FIXTURES / "headkv_scores_tiny_llama.json", target)
    return tree


def headkv_kept(cluster_class, layer: int, capacity: int, beta: float, queries, keys, values) -> list[list[int]]:
    """``ReasonSnapKVCluster.update_kv`` on ``[1, H_q, S, D]`` tensors: kept positions per query head, in its order."""
    cluster = cluster_class(
        window_size=HEADKV_WINDOW,
        kernel_size=HEADKV_KERNEL,
        pooling="maxpool",
        base_capacity=capacity,
        head_choice="reason",
        beta=beta,
        temp=1,
        layer_idx=layer,
        num_hidden_layers=rk.MODEL_CONFIG["num_hidden_layers"],
        num_attention_heads=QUERY_HEADS,
        model="llama",
    )
    flat_keys, _ = cluster.update_kv(keys, queries, values)
    lengths = cluster.head_lens.tolist()
    kept, start = [], 0
    for head, size in enumerate(lengths):
        kept.append(rk.match_rows(keys[0, head], flat_keys[start : start + size]).tolist())
        start += size
    return kept, cluster.head_capacity.tolist()


def repeat_heads(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.repeat_interleave(QUERY_HEADS // tensor.shape[1], dim=1)


def record_headkv(headkv_root: Path, commit: str, models: dict, stored: dict, extra_inputs: dict) -> dict:
    tree = headkv_tree(headkv_root)
    cluster_class = load_module("headkv_snapkv_utils", tree / "headkv" / "snapkv_utils.py").ReasonSnapKVCluster
    cases = []
    tensors = rk.tensor_inputs()
    generator = torch.Generator().manual_seed(QUERY_SEED)
    for length in (37, 64, 128):
        extra_inputs[f"tensor/queries_S{length}"] = torch.randn((1, QUERY_HEADS, length, 16), generator=generator)
    for dtype in DTYPES:
        for length in (37, 64, 128):
            keys = repeat_heads(tensors[f"keys_S{length}"].to(DTYPES[dtype]))
            values = repeat_heads(tensors[f"values_S{length}"].to(DTYPES[dtype]))
            queries = extra_inputs[f"tensor/queries_S{length}"].to(DTYPES[dtype])
            for capacity in HEADKV_CAPACITIES:
                for beta in HEADKV_BETAS:
                    kept, capacities = headkv_kept(cluster_class, 0, capacity, beta, queries, keys, values)
                    cases.append(
                        {
                            "kind": "tensor",
                            "inputs": f"tensor/S{length}",
                            "dtype": dtype,
                            "capacity": capacity,
                            "beta": beta,
                            "head_capacity": capacities,
                            "kept": [kept],
                        }
                    )
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    for dtype, model in models.items():
        for length in rk.MODEL_LENGTHS:
            ids = rk.input_ids_for(length)
            tracker = rk.Tracker(model)
            tracker.attach_before()
            with torch.no_grad():
                model.model(input_ids=ids, past_key_values=rk.DynamicCache())
            tracker.detach()
            check_stored(stored, f"model/sdpa/{dtype}/S{length}", tracker, length)
            per_layer = []
            for layer, seen in sorted(tracker.prefill_inputs.items()):
                attention = model.model.layers[layer].self_attn
                hidden = seen["hidden_states"]
                with torch.no_grad():
                    queries = attention.q_proj(hidden).view(1, length, -1, attention.head_dim).transpose(1, 2)
                    cos, sin = model.model.rotary_emb(hidden, torch.arange(length)[None])
                    queries, _ = apply_rotary_pos_emb(queries, queries, cos, sin)
                per_layer.append((queries, repeat_heads(seen["keys"]), repeat_heads(seen["values"])))
            for capacity in HEADKV_CAPACITIES:
                for beta in HEADKV_BETAS:
                    kept_layers, capacities = [], None
                    for layer, (queries, keys, values) in enumerate(per_layer):
                        kept, capacities = headkv_kept(cluster_class, layer, capacity, beta, queries, keys, values)
                        kept_layers.append(kept)
                    cases.append(
                        {
                            "kind": "model",
                            "inputs": f"model/sdpa/{dtype}/S{length}",
                            "dtype": dtype,
                            "capacity": capacity,
                            "beta": beta,
                            "head_capacity": capacities,
                            "kept": kept_layers,
                        }
                    )
    return {
        "method": "headkv",
        "references": {
            "original": {"repo": "FYYFU/HeadKV", "commit": commit, "file": "headkv/snapkv_utils.py"},
        },
        "settings": {
            "window_size": HEADKV_WINDOW,
            "kernel_size": HEADKV_KERNEL,
            "pooling": "maxpool",
            "temp": 1,
            "head_choice": "reason",
            "scores": "headkv_scores_tiny_llama.json",
        },
        "cases": cases,
    }


# ------------------------------------------------------------------------------------------------ SimLayerKV
SIMLAYER_SETTINGS = (
    {"n_recent": 16, "n_initial": 4, "n_last": 1},
    {"n_recent": 12, "n_initial": 2, "n_last": 3},
)
SIMLAYER_THRESHOLDS = (0.12, 0.15, 0.28, 0.415, 0.6, 0.9)  # around the tiny Llama's lazy scores


def record_simlayer(models: dict, stored: dict) -> dict:
    import kvpress
    from kvpress.presses.snapkv_press import SnapKVPress

    original = SnapKVPress.compute_window_attention
    lazy_scores: list[float] = []

    def recording(module, hidden_states, keys, window_size, position_embeddings):
        weights = original(module, hidden_states, keys, window_size, position_embeddings)
        mean = weights.mean((0, 1, 2))
        lazy_scores.append(float(mean[: current["n_initial"]].sum() + mean[-current["n_recent"] :].sum()))
        return weights

    SnapKVPress.compute_window_attention = staticmethod(recording)
    cases, current = [], {}
    try:
        for dtype, model in models.items():
            for length in rk.MODEL_LENGTHS:
                for settings in SIMLAYER_SETTINGS:
                    for threshold in SIMLAYER_THRESHOLDS:
                        current.update(settings)
                        lazy_scores.clear()
                        press = kvpress.SimLayerKVPress(lazy_threshold=threshold, **settings)
                        tracker = model_prefill(model, press, length, dtype, stored)
                        cases.append(
                            {
                                "kind": "model",
                                "inputs": f"model/sdpa/{dtype}/S{length}",
                                "dtype": dtype,
                                "lazy_threshold": threshold,
                                **settings,
                                "lazy_scores": list(lazy_scores),
                                "kept": tracker.kept(),
                            }
                        )
    finally:
        SnapKVPress.compute_window_attention = staticmethod(original)
    return {
        "method": "simlayerkv",
        "references": {"kvpress": {"package": "kvpress", "file": "kvpress/presses/simlayerkv_press.py"}},
        "cases": cases,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duo-attention", type=Path, required=True)
    parser.add_argument("--duo-commit", required=True)
    parser.add_argument("--headkv", type=Path, required=True)
    parser.add_argument("--headkv-commit", required=True)
    args = parser.parse_args(argv)
    if "kvbench" in sys.modules:
        raise SystemExit("record_heads.py must not run with kvbench imported")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    stored = load_file(str(KVPRESS_INPUTS))
    weights = rk.build_model_weights()
    for name, value in weights.items():
        if not torch.equal(stored[f"weights/{name}"], value):
            raise RuntimeError(f"weights/{name}: differs from the kvpress recordings' inputs")
    models = {dtype: rk.load_model(weights, DTYPES[dtype], "sdpa") for dtype in DTYPES}
    extra_inputs: dict[str, torch.Tensor] = {}
    payloads = {
        "DuoAttention": record_duo(args.duo_attention, args.duo_commit, models, stored),
        "HeadKV": record_headkv(args.headkv, args.headkv_commit, models, stored, extra_inputs),
        "SimLayerKV": record_simlayer(models, stored),
    }
    for name, payload in payloads.items():
        payload = {"format_version": FORMAT_VERSION, **payload, "versions": rk.versions()}
        rk.write_json(FIXTURES / f"{name}.json", payload)
        print(f"{name}: {len(payload['cases'])} cases", flush=True)
    save_file(extra_inputs, str(FIXTURES / "inputs.safetensors"), metadata={"query_seed": str(QUERY_SEED)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
