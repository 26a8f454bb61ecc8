"""Record what Zefan-Cai/R-KV's R1KV keeps, for kvbench's R-KV parity test (issue #44).

Runs the reference's own selection code (``rkv/compression/r1_kv.py`` and ``rkv/utils.py`` at the pinned commit, read
from a git checkout of the repository) outside kvbench, in any environment with torch (the kvpress venv is used for
the tiny Llama's states); it never imports kvbench::

    git clone https://github.com/Zefan-Cai/R-KV /tmp/R-KV && git -C /tmp/R-KV checkout d15c9767
    OMP_NUM_THREADS=1 /work/venvs/kvpress/bin/python scripts/reference/record_rkv.py --repo /tmp/R-KV \\
        --out tests/fixtures/reference/rkv

(``rkv/compression/__init__.py`` imports modules the commit does not have, so the two files are loaded by path, with
``cal_similarity`` / ``compute_attention_scores`` provided to ``r1_kv.py``'s relative import.)

Two kinds of cases, float32 and bfloat16, written to ``R1KV.json`` with their tensors in ``streams.safetensors``:

* ``call``: one ``R1KV.update_kv(keys [1, H_kv, L, D], queries [1, H_q, W, D], values)`` on seeded tensors;
* ``stream``: the decode flow of ``rkv/modeling.py`` driven over a stream of per-token keys and queries: the prompt
  (``P`` tokens, compressed at once, the query cache its last ``W`` queries), then one token per forward; a forward
  compresses after appending when the tokens fed before it are a multiple of ``divide_length``.  Streams: seeded
  tensors, and layer 0 of the tiny random Llama (its keys and post-RoPE queries of a 128-token prompt; layer 0's states
  do not depend on what the cache holds, so the teacher-forced stream is what the model computes).

* ``model``: the whole tiny Llama (both layers) teacher-forced over seeded ids, rkv/modeling.py's flow applied by hooks
  on each attention module (:func:`run_tiny_llama`).

Recorded per case: the cache's token positions per KV head in the reference cache's order (tracked through a value
channel that carries each token's position), and for streams the forwards at which it compressed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

COMMIT = "d15c9767e67c2bd9807128fecc35223fa2484a69"
ROOT = Path(__file__).resolve().parents[2]
KVPRESS_INPUTS = ROOT / "tests" / "fixtures" / "reference" / "kvpress" / "inputs.safetensors"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
SEED = 4406
DIM = 16
CALLS = [  # (kv heads, query heads, length, budget, window)
    (2, 4, 40, 24, 8),
    (2, 4, 97, 64, 8),
    (2, 2, 160, 64, 8),
    (2, 4, 160, 128, 16),
]
STREAMS = [  # (name, prompt, total, budget, window, divide_length)
    ("seeded", 40, 200, 32, 8, 16),
    ("seeded", 20, 150, 48, 8, 32),
    ("seeded", 64, 192, 24, 8, 8),
    ("tiny_llama_layer0", 40, 128, 24, 8, 16),
    ("tiny_llama_layer0", 33, 128, 40, 8, 20),
]


def load_reference(repo: Path):
    """``R1KV`` from ``rkv/compression/r1_kv.py``, its helpers from ``rkv/utils.py`` (both by path)."""
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert head == COMMIT, f"R-KV checkout is at {head}, want {COMMIT}"
    spec = importlib.util.spec_from_file_location("rkv_utils", repo / "rkv" / "utils.py")
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    package = types.ModuleType("rkv_compression")
    package.__path__ = [str(repo / "rkv" / "compression")]
    package.cal_similarity, package.compute_attention_scores = utils.cal_similarity, utils.compute_attention_scores
    sys.modules["rkv_compression"] = package
    spec = importlib.util.spec_from_file_location("rkv_compression.r1_kv", repo / "rkv" / "compression" / "r1_kv.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["rkv_compression.r1_kv"] = module
    spec.loader.exec_module(module)
    return module.R1KV


def positions_of(values: torch.Tensor) -> list[list[int]]:
    """The position channel (``values[..., 0]``, float32) of a ``[1, H, L, D]`` cache, per head in cache order."""
    return [[int(p) for p in values[0, h, :, 0].tolist()] for h in range(values.shape[1])]


def position_values(heads: int, positions: torch.Tensor) -> torch.Tensor:
    """``[1, H, n, D]`` float32 values whose channel 0 is each token's position."""
    values = torch.zeros(1, heads, positions.numel(), DIM)
    values[..., 0] = positions.float()
    return values


def run_stream(R1KV, keys, queries, prompt, budget, window, divide):
    """rkv/modeling.py's flow for one layer (batch 1): returns the final cache positions and the compressing forwards.

    ``keys`` ``[1, H_kv, T, D]``, ``queries`` ``[1, H_q, T, D]`` in the case's dtype."""
    kv = R1KV(budget=budget, window_size=window, mix_lambda=0.07, retain_ratio=0.2, retain_direction="last")
    heads, total = keys.shape[1], keys.shape[2]
    # The prefill forward: config.compression is None, so the prompt is compressed before it is stored.
    query_cache = queries[:, :, :prompt][:, :, -window:]
    cache_k, cache_v = kv.update_kv(keys[:, :, :prompt], query_cache, position_values(heads, torch.arange(prompt)))
    compressed_at = [0] if prompt >= budget else []
    length = prompt
    compress = length % divide == 0
    for token in range(prompt, total):
        query_cache = torch.cat([query_cache, queries[:, :, token : token + 1]], dim=2)[:, :, -window:]
        cache_k = torch.cat([cache_k, keys[:, :, token : token + 1]], dim=2)
        cache_v = torch.cat([cache_v, position_values(heads, torch.tensor([token]))], dim=2)
        if compress:
            if cache_k.shape[2] >= budget:
                compressed_at.append(token)
            cache_k, cache_v = kv.update_kv(cache_k, query_cache, cache_v)
        length += 1
        compress = length % divide == 0
    return positions_of(cache_v), compressed_at


def tiny_llama_layer0(dtype_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer 0's keys ``[1, 2, 128, 16]`` and post-RoPE queries ``[1, 4, 128, 16]`` of the tiny Llama's 128-token
    prompt (sdpa), computed by transformers 5.2's Llama in the case's dtype."""
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from record_kvpress import MODEL_CONFIG, build_model_weights, input_ids_for, load_model

    dtype = DTYPES[dtype_name]
    model: LlamaForCausalLM = load_model(build_model_weights(), dtype, "sdpa")
    assert isinstance(model.config, LlamaConfig) and MODEL_CONFIG["head_dim"] == DIM
    captured = {}

    def hook(module, args, kwargs, output):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        hidden = kwargs["hidden_states"]
        shape = (*hidden.shape[:-1], -1, module.head_dim)
        query = module.q_proj(hidden).view(shape).transpose(1, 2)
        key = module.k_proj(hidden).view(shape).transpose(1, 2)
        cos, sin = kwargs["position_embeddings"]
        captured["queries"], captured["keys"] = apply_rotary_pos_emb(query, key, cos, sin)

    handle = model.model.layers[0].self_attn.register_forward_hook(hook, with_kwargs=True)
    with torch.no_grad():
        model.model(input_ids=input_ids_for(128))
    handle.remove()
    stored = load_file(KVPRESS_INPUTS)[f"model/sdpa/{dtype_name}/S128/layer0/keys"]
    assert torch.equal(captured["keys"], stored.to(dtype)), "not the recorded tiny Llama"
    return captured["keys"].detach(), captured["queries"].detach()


MODEL_RUNS = [  # (prompt, total, budget, window, divide_length) over MODEL_IDS_SEED's ids
    (40, 100, 24, 8, 8),
    (30, 100, 32, 8, 16),
]
MODEL_IDS_SEED = 4408


def run_tiny_llama(R1KV, dtype_name: str, ids: torch.Tensor, prompt: int, budget: int, window: int, divide: int):
    """The tiny Llama (both layers, sdpa) teacher-forced over ``ids`` ``[1, T]`` with rkv/modeling.py's flow applied
    by hooks on each attention module: a pre-hook keeps the query cache (post-RoPE queries of the last ``window``
    tokens), a post-hook compresses the layer's cache when the flow says so (the reference compresses the prompt before
    storing it and a decoding step's cache after its attention: either way attention saw the whole cache).  Returns,
    per layer, the positions per KV head in cache order, and the compressing forwards."""
    from transformers import DynamicCache
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from record_kvpress import build_model_weights, load_model

    model = load_model(build_model_weights(), DTYPES[dtype_name], "sdpa")
    layers = model.model.layers
    kv = [R1KV(budget=budget, window_size=window, mix_lambda=0.07, retain_ratio=0.2, retain_direction="last")
          for _ in layers]  # fmt: skip
    query_cache: dict[int, torch.Tensor] = {}
    positions: dict[int, torch.Tensor] = {}
    flow = {"compression": None, "compressed_at": []}

    def before(module, args, kwargs):
        hidden = kwargs["hidden_states"]
        shape = (*hidden.shape[:-1], -1, module.head_dim)
        query = module.q_proj(hidden).view(shape).transpose(1, 2)
        cos, sin = kwargs["position_embeddings"]
        query, _ = apply_rotary_pos_emb(query, query, cos, sin)
        idx = module.layer_idx
        seen = query_cache.get(idx)
        query_cache[idx] = (query if seen is None else torch.cat([seen, query], dim=2))[:, :, -window:]

    def after(module, args, kwargs, output):
        idx = module.layer_idx
        layer = kwargs["past_key_values"].layers[idx]
        new = kwargs["hidden_states"].shape[1]
        start = 0 if idx not in positions else int(positions[idx].max()) + 1
        fresh = torch.arange(start, start + new).expand(layer.keys.shape[1], -1)
        positions[idx] = fresh if idx not in positions else torch.cat([positions[idx], fresh], dim=1)
        if flow["compression"] is False:
            return output
        if layer.keys.shape[2] >= budget and idx == 0:
            flow["compressed_at"].append(start if flow["compression"] is True else 0)
        tracked = torch.zeros(1, *positions[idx].shape, DIM)
        tracked[..., 0] = positions[idx].float()
        keys, values = layer.keys, layer.values
        layer.keys, layer.values = kv[idx].update_kv(keys, query_cache[idx], values)
        _, tracked = kv[idx].update_kv(keys, query_cache[idx], tracked)  # the same selection, carrying positions
        positions[idx] = tracked[0, :, :, 0].long()
        return output

    handles = []
    for layer in layers:
        handles.append(layer.self_attn.register_forward_pre_hook(before, with_kwargs=True))
        handles.append(layer.self_attn.register_forward_hook(after, with_kwargs=True))
    cache, length = DynamicCache(), 0
    with torch.no_grad():
        chunks = [(0, prompt)] + [(t, t + 1) for t in range(prompt, ids.shape[1])]
        for lo, hi in chunks:
            model.model(input_ids=ids[:, lo:hi], past_key_values=cache, position_ids=torch.arange(lo, hi)[None])
            length += hi - lo  # rkv/modeling.py's self.length; the flag for the next forward
            flow["compression"] = length % divide == 0
    for handle in handles:
        handle.remove()
    kept = [[[int(p) for p in positions[idx][h].tolist()] for h in range(positions[idx].shape[0])] for idx in positions]
    return kept, flow["compressed_at"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    R1KV = load_reference(args.repo)
    args.out.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(SEED)
    tensors: dict[str, torch.Tensor] = {}
    cases = []
    for index, (kv_heads, q_heads, length, budget, window) in enumerate(CALLS):
        tensors[f"call{index}/keys"] = torch.randn(1, kv_heads, length, DIM, generator=generator)
        tensors[f"call{index}/queries"] = torch.randn(1, q_heads, window, DIM, generator=generator)
        for dtype_name, dtype in DTYPES.items():
            kv = R1KV(budget=budget, window_size=window, mix_lambda=0.07, retain_ratio=0.2, retain_direction="last")
            keys, queries = tensors[f"call{index}/keys"].to(dtype), tensors[f"call{index}/queries"].to(dtype)
            _, values = kv.update_kv(keys, queries, position_values(kv_heads, torch.arange(length)))
            cases.append(
                {"kind": "call", "tensors": f"call{index}", "dtype": dtype_name, "budget": budget, "window": window,
                 "kept": positions_of(values)}
            )  # fmt: skip
    for index, (name, prompt, total, budget, window, divide) in enumerate(STREAMS):
        for dtype_name, dtype in DTYPES.items():
            if name == "seeded":
                key = f"stream{index}"
                if f"{key}/keys" not in tensors:
                    tensors[f"{key}/keys"] = torch.randn(1, 2, total, DIM, generator=generator)
                    tensors[f"{key}/queries"] = torch.randn(1, 4, total, DIM, generator=generator)
                keys, queries = tensors[f"{key}/keys"].to(dtype), tensors[f"{key}/queries"].to(dtype)
            else:
                key = f"tiny_llama_layer0/{dtype_name}"
                if f"{key}/keys" not in tensors:
                    tensors[f"{key}/keys"], tensors[f"{key}/queries"] = tiny_llama_layer0(dtype_name)
                keys, queries = tensors[f"{key}/keys"], tensors[f"{key}/queries"]
            kept, compressed_at = run_stream(R1KV, keys, queries, prompt, budget, window, divide)
            cases.append(
                {"kind": "stream", "tensors": key, "source": name, "dtype": dtype_name, "prompt": prompt,
                 "total": total, "budget": budget, "window": window, "divide_length": divide, "kept": kept,
                 "compressed_at": compressed_at}
            )  # fmt: skip
    ids = torch.randint(
        0, 128, (1, max(run[1] for run in MODEL_RUNS)), generator=torch.Generator().manual_seed(MODEL_IDS_SEED)
    )
    tensors["tiny_llama/input_ids"] = ids
    for prompt, total, budget, window, divide in MODEL_RUNS:
        for dtype_name in DTYPES:
            kept, compressed_at = run_tiny_llama(R1KV, dtype_name, ids[:, :total], prompt, budget, window, divide)
            cases.append(
                {"kind": "model", "tensors": "tiny_llama/input_ids", "source": "tiny_llama", "dtype": dtype_name,
                 "prompt": prompt, "total": total, "budget": budget, "window": window, "divide_length": divide,
                 "kept_per_layer": kept, "compressed_at": compressed_at}
            )  # fmt: skip
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(args.out / "streams.safetensors"))
    recording = {
        "reference": f"Zefan-Cai/R-KV@{COMMIT} rkv/compression/r1_kv.py (R1KV.update_kv), rkv/utils.py",
        "versions": {"torch": torch.__version__},
        "recorder": "scripts/reference/record_rkv.py",
        "settings": {"mix_lambda": 0.07, "kernel_size": 7, "threshold": 0.5, "retain_direction": "last"},
        "note": "kept: token positions per KV head in the reference cache's order; compressed_at: the token fed by "
        "each compressing forward (0: the prefill).",
        "cases": cases,
    }
    (args.out / "R1KV.json").write_text(json.dumps(recording) + "\n")
    print(f"{len(cases)} cases -> {args.out}")


if __name__ == "__main__":
    main()
