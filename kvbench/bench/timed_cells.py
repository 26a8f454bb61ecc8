"""One bench cell: prefill a random context with eviction, then decode greedily, timing each phase and counting
cache bytes (:func:`run_cell`)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from kvbench.bench.timing import synchronize
from kvbench.budget import Budget
from kvbench.cache.kv_cache import KVBenchCache
from kvbench.cache.paged import PagedLayer
from kvbench.eviction.base import EvictionMethod
from kvbench.inference.prefill import forward_logits, prefill


@dataclass
class RunSpec:
    """One bench cell: architecture x backend x method x context."""

    arch: str
    method: str
    context: int
    budget: str
    decode_tokens: int
    backend: str = "auto"
    page_size: int | None = None
    repeats: int = 1
    #: Tokens per prefill forward (0: the whole context in one forward; ``run.prefill_chunk``).
    prefill_chunk: int = 0
    #: Attention-statistics kernels of the scorers (``auto``: fused; ``dense``: the materialising reference).
    scoring_impl: str = "auto"


def run_cell(
    model: torch.nn.Module, method: EvictionMethod, budget: Budget, spec: RunSpec, device: torch.device
) -> dict[str, Any]:
    """Prefill ``spec.context`` random tokens with eviction, then decode ``spec.decode_tokens`` greedily.

    Returns timings (s), cache bytes after prefill and at the end, kept tokens, peak memory (CUDA) and the
    decode bytes read per token (weights + cache).
    """
    config = model.config
    expand = 1
    if method.gqa_granularity == "query_head":
        expand = int(config.num_attention_heads) // int(config.num_key_value_heads)
    cache = KVBenchCache(
        int(config.num_hidden_layers), expand_factor=expand, backend=spec.backend, page_size=spec.page_size
    )
    gen = torch.Generator().manual_seed(spec.context)
    ids = torch.randint(10, int(config.vocab_size), (1, spec.context), generator=gen).to(device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    base_mem = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    synchronize(device)
    state = prefill(
        model,
        ids[0].tolist(),
        method=method,
        budget=budget,
        prefill_chunk=spec.prefill_chunk,
        cache=cache,
        scoring_impl=spec.scoring_impl,
    )
    session, logits = state.session, state.logits
    session.begin_decode()
    synchronize(device)
    prefill_s = time.perf_counter() - state.started
    bytes_after_prefill = cache.stored_bytes()
    kept_after_prefill = sum(map(sum, cache.head_lengths()))
    cache.reserve(spec.decode_tokens)  # paged: decode headroom, so no pool growth inside the timed loop
    decode_times, cache_bytes_seen = [], []
    next_id = torch.argmax(logits).view(1, 1)
    for step in range(spec.decode_tokens):
        synchronize(device)
        start = time.perf_counter()
        logits = forward_logits(model, next_id, spec.context + step, cache, session, device)[-1]
        next_id = torch.argmax(logits).view(1, 1)
        synchronize(device)
        decode_times.append(time.perf_counter() - start)
        cache_bytes_seen.append(cache.stored_bytes())
    record = session.finish()
    peak_mem = torch.cuda.max_memory_allocated(device) - base_mem if device.type == "cuda" else None
    per_token = statistics.median(decode_times) if decode_times else float("nan")
    weights = _weight_bytes_read_per_token(model)
    kept_final = sum(map(sum, cache.head_lengths()))
    stored_final = cache.stored_bytes()
    return {
        "prefill_s": prefill_s,
        "decode_s": sum(decode_times),
        "decode_ms_per_token": 1000 * per_token,
        "cache_bytes_after_prefill": bytes_after_prefill,
        "kept_tokens_after_prefill": kept_after_prefill,
        "cache_bytes_final": cache.stored_bytes(),
        "kept_tokens_final": kept_final,
        # What the backend holds per stored byte (the paged pool's partly filled pages and decode headroom).
        "stored_bytes_ratio": cache.allocated_bytes() / stored_final if stored_final else float("nan"),
        "peak_prefill_cache_bytes": getattr(record, "peak_prefill_bytes", ""),
        "peak_mem_bytes": peak_mem if peak_mem is not None else "",
        "weight_bytes_read": weights,
        "cache_bytes_read_per_token": statistics.mean(cache_bytes_seen) if cache_bytes_seen else 0,
        "backend_used": _backend_of(cache),
    }


def _backend_of(cache: KVBenchCache) -> str:
    return "paged" if isinstance(cache.layers[0], PagedLayer) else "torch"


def _weight_bytes_read_per_token(model: torch.nn.Module) -> int:
    """Parameter bytes a decode step reads: everything but the input embedding (one row of it is read)."""
    embedding = model.get_input_embeddings().weight
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    return total - embedding.numel() * embedding.element_size() + embedding.shape[1] * embedding.element_size()
