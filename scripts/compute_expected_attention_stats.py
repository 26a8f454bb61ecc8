"""Compute Expected Attention's query statistics for a model from its own queries on local text, offline.

kvpress's ``ExpectedAttentionStatsPress`` downloads per-model statistics from the Hub (computed by its
``collect_queries`` on ``kmfoda/booksum``); this writes the same statistics from a local model and local text, for
``method=expected_attention method.params.stats=<out>``::

    python scripts/compute_expected_attention_stats.py --model models/tiny-niah --text README.md --out ea.safetensors

kvpress's procedure, on local text: the text is cut into ``--num-samples`` samples of ``--sample-chars`` characters
(kvpress cuts each dataset row to ``sample_seq_len`` characters); each sample runs through the model once
(:func:`kvbench.inference.queries.record_queries`), its first ``--n-sink`` queries are dropped, and the pre-RoPE
queries of all samples are concatenated per layer and head: ``query_mean`` ``[L, H_q, D]`` and the unbiased
``query_cov`` ``[L, H_q, D, D]`` (divided by ``N - 1``, as kvpress), float32, one row per full-attention layer.
kvbench's pre-RoPE queries are the post-RoPE ones un-rotated with the model's rotary tables (kvpress captures them
before RoPE; equal up to float32 rounding).  ``--model``: a local path or Hub id loaded by transformers, or
``builtin:<name>``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from kvbench.inference.queries import full_attention_layers, prerope, record_queries


def load(model_name: str):
    """``builtin:<name>`` (a kvbench model with seeded random weights) or a transformers model, with its tokenizer."""
    if model_name.startswith("builtin:"):
        from kvbench.models.loading import build_builtin

        return build_builtin(model_name.removeprefix("builtin:"))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(model_name), AutoTokenizer.from_pretrained(model_name)


def compute(model, tokenizer, text: str, num_samples: int, sample_chars: int, n_sink: int):
    """``(query_mean [L, H_q, D], query_cov [L, H_q, D, D], samples used)`` float32 (module docstring)."""
    samples = [text[start : start + sample_chars] for start in range(0, len(text), sample_chars)][:num_samples]
    layers = full_attention_layers(model)
    collected: dict[int, list[torch.Tensor]] = {layer: [] for layer in layers}
    for sample in samples:
        ids = tokenizer(sample, return_tensors="pt").input_ids
        if ids.shape[1] <= n_sink:
            continue
        queries = record_queries(model, ids)
        for layer in layers:
            collected[layer].append(prerope(model, queries[layer])[:, n_sink:])
    if not collected[layers[0]]:
        raise ValueError(f"no sample of the text has more than n_sink={n_sink} tokens")
    means, covariances = [], []
    for layer in layers:
        stacked = torch.cat(collected[layer], dim=1)  # [H_q, N, D]
        mean = stacked.mean(dim=1)
        centred = stacked - mean[:, None]
        means.append(mean)
        covariances.append(centred.transpose(1, 2) @ centred / (stacked.shape[1] - 1))
    return torch.stack(means), torch.stack(covariances), len(collected[layers[0]])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="local path, Hub id or builtin:<name>")
    parser.add_argument("--text", required=True, type=Path, help="local text file to collect queries on")
    parser.add_argument("--out", required=True, type=Path, help="safetensors file to write")
    parser.add_argument("--num-samples", type=int, default=100, help="samples (kvpress: 100)")
    parser.add_argument("--sample-chars", type=int, default=1000, help="characters per sample (kvpress: 1000)")
    parser.add_argument("--n-sink", type=int, default=4, help="first queries of each sample dropped (kvpress: 4)")
    args = parser.parse_args(argv)
    if not args.text.is_file():
        print(f"error: --text {str(args.text)!r} is not a file", file=sys.stderr)
        return 2
    for name in ("num_samples", "sample_chars"):
        if getattr(args, name) < 1:
            print(f"error: --{name.replace('_', '-')} {getattr(args, name)} must be at least 1", file=sys.stderr)
            return 2
    if args.n_sink < 0:
        print(f"error: --n-sink {args.n_sink} must be at least 0", file=sys.stderr)
        return 2
    model, tokenizer = load(args.model)
    text = args.text.read_text()
    mean, covariance, used = compute(model.eval(), tokenizer, text, args.num_samples, args.sample_chars, args.n_sink)
    metadata = {"model": args.model, "text": str(args.text), "samples": str(used), "n_sink": str(args.n_sink),
                "sample_chars": str(args.sample_chars), "shape": json.dumps(list(mean.shape))}  # fmt: skip
    save_file({"query_mean": mean.contiguous(), "query_cov": covariance.contiguous()}, str(args.out), metadata=metadata)
    print(f"{args.out}: query_mean {list(mean.shape)}, query_cov {list(covariance.shape)} from {used} samples")
    return 0


if __name__ == "__main__":
    sys.exit(main())
