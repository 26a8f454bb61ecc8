"""Estimate a DuoAttention head pattern for a model, offline, in the released format -- a cheaper PROXY.

Writes a folder ``<out>/full_attention_heads.tsv`` (``[layers, KV heads]`` gates in [0, 1], tab-separated) and
``<out>/config.json`` (``sink_size``, ``recent_size``, and ``estimator`` naming this proxy), the format of
mit-han-lab/duo-attention's ``attn_patterns/<model>/<run>/``, for ``method=duo_attention
method.params.pattern=<out>``::

    python scripts/estimate_duo_pattern.py --model models/tiny-niah --tiny-niah 10 --out pattern/
    python scripts/estimate_duo_pattern.py --model <checkpoint> --probes probes.jsonl --out pattern/

What the paper does (``duo_attn/train.py``): it learns one gate per KV head by optimisation -- every head's output
is mixed ``gate * full + (1 - gate) * streaming`` (sinks + recent), and the gates are trained with AdamW for about
2000 steps to make the last hidden states on synthetic multi-passkey retrieval prompts match the full model's
(L2 distillation) while an L1 penalty pushes gates to 0.  That needs gradients through the whole model on long
contexts (GPUs).

What this command does instead, named the **streaming-deviation proxy**: one forward per probe, no training.  For
every layer and KV head it measures how much the head's attention output changes when the head keeps only the
``--sink-size`` first and ``--recent-size`` latest keys: the relative squared error ``||o_stream - o_full||^2 /
||o_full||^2`` of each of the last ``--last-rows`` query rows (the question; the paper's distillation loss is
measured on the answer's positions, ``label_mask`` in ``train.py``; rows within ``sink + recent`` of the start are
skipped), averaged over those rows, the head's GQA group and the probes; the gates are these deviations divided by
the largest one.  A head that streaming attention reproduces gets a gate near 0 (streaming), one that reads
far-away tokens a gate near 1 (retrieval): the quantity the paper's distillation penalises, measured per head in
isolation instead of through the model's output, without the L1 trade-off.  The ranking of heads is what
``params.sparsity`` uses; the gate values themselves are not the paper's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from head_probes import Probe, add_probe_arguments, load_model, read_probes
from transformers import DynamicCache

from kvbench.inference.queries import full_attention_layers, record_queries

ESTIMATOR = "kvbench streaming-deviation proxy (scripts/estimate_duo_pattern.py), not DuoAttention's optimised gates"


def streaming_deviation(
    queries, keys, values, scaling: float, sinks: int, recent: int, last_rows: int, rows: int = 512
) -> torch.Tensor:
    """``[H_kv]`` mean relative squared error of the streaming output per KV head.

    ``queries`` ``[H_q, N, D]``, ``keys``/``values`` ``[H_kv, N, D]`` (float32); the last ``last_rows`` rows, those
    ``i >= sinks + recent`` only.
    """
    heads, length, _ = queries.shape
    group = heads // keys.shape[0]
    keys = keys.repeat_interleave(group, dim=0)
    values = values.repeat_interleave(group, dim=0)
    total = torch.zeros(heads, dtype=torch.float64)
    counted = 0
    positions = torch.arange(length)
    for start in range(max(sinks + recent, length - last_rows), length, rows):
        row_ids = positions[start : start + rows]
        logits = queries[:, row_ids] @ keys.transpose(1, 2) * scaling  # [H_q, r, N]
        causal = positions[None, :] <= row_ids[:, None]
        streaming = causal & ((positions[None, :] < sinks) | (positions[None, :] > row_ids[:, None] - recent))
        full = torch.softmax(logits.masked_fill(~causal, float("-inf")), dim=-1) @ values
        stream = torch.softmax(logits.masked_fill(~streaming, float("-inf")), dim=-1) @ values
        error = (stream - full).pow(2).sum(-1) / full.pow(2).sum(-1).clamp_min(1e-12)  # [H_q, r]
        total += error.double().sum(-1)
        counted += len(row_ids)
    if counted == 0:
        raise ValueError(f"a probe of {length} tokens has no row past sink + recent = {sinks + recent}")
    return (total / counted).view(-1, group).mean(-1)


@torch.no_grad()
def probe_deviation(model, probe: Probe, sinks: int, recent: int, last_rows: int) -> torch.Tensor:
    """``[L, H_kv]`` streaming deviation of every full-attention layer's KV heads on one probe."""
    queries = record_queries(model, probe.input_ids)
    cache = DynamicCache()
    model(probe.input_ids, past_key_values=cache, use_cache=True)
    out = []
    for layer in full_attention_layers(model):
        keys, values = cache.layers[layer].keys[0].float(), cache.layers[layer].values[0].float()
        scaling = getattr(model.model.layers[layer].self_attn, "scaling", keys.shape[-1] ** -0.5)
        out.append(streaming_deviation(queries[layer], keys, values, float(scaling), sinks, recent, last_rows))
    return torch.stack(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_probe_arguments(parser)
    parser.add_argument("--sink-size", type=int, default=64, help="sinks of a streaming head (paper: 64 or 128)")
    parser.add_argument("--recent-size", type=int, default=256, help="recent tokens of a streaming head (paper: 256)")
    parser.add_argument("--last-rows", type=int, default=32, help="query rows measured, the last ones of a probe")
    parser.add_argument("--out", required=True, type=Path, help="folder to write")
    args = parser.parse_args(argv)
    for name, low in (("sink_size", 0), ("recent_size", 0), ("last_rows", 1)):
        if getattr(args, name) < low:
            print(f"error: --{name.replace('_', '-')} {getattr(args, name)} must be at least {low}", file=sys.stderr)
            return 2
    model, tokenizer = load_model(args.model)
    try:
        probes = read_probes(args, tokenizer)
        deviation = torch.stack(
            [probe_deviation(model, p, args.sink_size, args.recent_size, args.last_rows) for p in probes]
        )
    except (ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    mean = deviation.mean(0)
    gates = (mean / mean.max().clamp_min(1e-12)).numpy()
    args.out.mkdir(parents=True, exist_ok=True)
    np.savetxt(args.out / "full_attention_heads.tsv", gates, delimiter="\t")
    config = {"sink_size": args.sink_size, "recent_size": args.recent_size, "estimator": ESTIMATOR,
              "model": args.model, "probes": len(probes), "last_rows": args.last_rows}  # fmt: skip
    (args.out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    print(f"{args.out}: {gates.shape[0]} layers x {gates.shape[1]} KV heads from {len(probes)} probes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
