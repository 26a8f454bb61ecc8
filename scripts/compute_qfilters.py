"""Compute Q-Filters for a model from its own queries on local text (the paper's procedure), offline.

kvpress's ``QFilterPress`` downloads per-model filters from the Hub; this writes the same kind of file from a local
model and a local text, for ``method=qfilter method.params.filters=<out>``::

    python scripts/compute_qfilters.py --model models/tiny-niah --text README.md --out qfilters_tiny.safetensors
    python scripts/compute_qfilters.py --model /models/Llama-3.1-8B-Instruct --text corpus.txt --out q.safetensors

The text is tokenised (at most ``--max-tokens`` tokens) and run through the model once with kvbench's attention
function, which hands every layer's post-RoPE queries ``[H_q, N, D]`` to an observer; per layer,
:func:`kvbench.methods.qfilter.filters_from_queries` takes the first right singular vector of each KV head's
stacked group queries, oriented with the queries, negated for kvpress's sign convention.  The file holds
``q_filters`` ``[L, H_kv, D]`` float32 (one row per full-attention layer, as the method indexes them) and the model
name, text file and token count as metadata.  ``--model`` is a local path or Hub id loaded by transformers (the embedded
default is ``models/tiny-niah``), or ``builtin:<name>`` for kvbench's seeded random models.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from kvbench.inference.queries import full_attention_layers, record_queries
from kvbench.methods.qfilter import FILTERS_KEY, filters_from_queries


def load(model_name: str):
    """``builtin:<name>`` (a kvbench model with seeded random weights) or a transformers model, with its tokenizer."""
    if model_name.startswith("builtin:"):
        from kvbench.models.loading import build_builtin

        return build_builtin(model_name.removeprefix("builtin:"))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(model_name), AutoTokenizer.from_pretrained(model_name)


def compute(model, tokenizer, text: str, max_tokens: int) -> tuple[torch.Tensor, int]:
    """``([L, H_kv, D] float32 filters, tokens used)`` of ``model`` on ``text`` (full-attention layers only)."""
    ids = tokenizer(text, return_tensors="pt").input_ids[:, :max_tokens]
    if ids.shape[1] < 2:
        raise ValueError(f"the text gives {ids.shape[1]} token(s); Q-Filters need a longer calibration text")
    config = model.config.get_text_config()
    kv_heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    queries = record_queries(model, ids)
    layers = full_attention_layers(model)
    return torch.stack([filters_from_queries(queries[idx], kv_heads) for idx in layers]), int(ids.shape[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="local path, Hub id or builtin:<name>")
    parser.add_argument("--text", required=True, type=Path, help="local text file to calibrate on")
    parser.add_argument("--out", required=True, type=Path, help="safetensors file to write")
    parser.add_argument("--max-tokens", type=int, default=4096, help="tokens of the text to use (default 4096)")
    args = parser.parse_args(argv)
    if not args.text.is_file():
        print(f"error: --text {str(args.text)!r} is not a file", file=sys.stderr)
        return 2
    if args.max_tokens < 2:
        print(f"error: --max-tokens {args.max_tokens} must be at least 2", file=sys.stderr)
        return 2
    model, tokenizer = load(args.model)
    filters, used = compute(model.eval(), tokenizer, args.text.read_text(), args.max_tokens)
    metadata = {
        "model": args.model,
        "text": str(args.text),
        "tokens": str(used),
        "shape": json.dumps(list(filters.shape)),
    }
    save_file({FILTERS_KEY: filters.contiguous()}, str(args.out), metadata=metadata)
    print(f"{args.out}: q_filters {list(filters.shape)} from {used} tokens of {args.text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
