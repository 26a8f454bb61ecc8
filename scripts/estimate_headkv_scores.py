"""Estimate HeadKV's retrieval-reasoning head scores for a model, offline, in the released JSON format.

Writes ``{"<layer>-<head>": [one score per probe]}`` (one line, layer-major; query heads), the format of FYYFU/HeadKV's
``Important_Head/head_score/<model>_retrieval_reasoning_heads.json``, for ``method=headkv
method.params.head_scores=<out>``::

    python scripts/estimate_headkv_scores.py --model models/tiny-niah --tiny-niah 10 --out scores.json
    python scripts/estimate_headkv_scores.py --model <checkpoint> --probes probes.jsonl --out scores.json

The procedure is the reference's scoring rule (``Important_Head/retrieval_head_detection_r2.py``,
``retrieval_calculate``): for every probe (a prompt hiding a needle of ``n`` tokens), the model decodes greedily
``--answer-tokens`` tokens (the reference: 50) and, at every step, each query head's attention row of the newest
token is read: of its top ``n`` attended positions, the attention weights of those inside the needle are added,
divided by ``n``.  A probe's sum is that head's score for the probe; the JSON holds one per probe.  What differs is
the data: the reference probes with its reasoning needles (``haystack_for_detect_r2/needles.jsonl``) in Paul Graham
essays at many lengths and depths; here the probes are the user's (``--probes``) or kvbench's ``tiny_niah`` prompts
(``--tiny-niah``), so the scores are the reference's statistic on other probes, not the released numbers.
Attention weights come from transformers' eager attention (``output_attentions``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from head_probes import Probe, add_probe_arguments, load_model, read_probes
from transformers import DynamicCache


@torch.no_grad()
def probe_scores(model, probe: Probe, answer_tokens: int) -> torch.Tensor:
    """``[L, H_q]`` float64: the reference's retrieval-reasoning score of every head on one probe."""
    length = probe.needle_end - probe.needle_start
    cache = DynamicCache()
    out = model(probe.input_ids, past_key_values=cache, output_attentions=True, use_cache=True)
    scores = None
    for _ in range(answer_tokens):
        rows = torch.stack([attention[0, :, -1].float() for attention in out.attentions])  # [L, H_q, S]
        values, positions = rows.topk(min(length, rows.shape[-1]), dim=-1)
        inside = (positions >= probe.needle_start) & (positions < probe.needle_end)
        step = (values * inside).sum(-1).double() / length
        scores = step if scores is None else scores + step
        token = out.logits[:, -1:].argmax(-1)
        out = model(token, past_key_values=cache, output_attentions=True, use_cache=True)
    return scores


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_probe_arguments(parser)
    parser.add_argument("--answer-tokens", type=int, default=50, help="greedy tokens per probe (reference: 50)")
    parser.add_argument("--out", required=True, type=Path, help="JSON file to write")
    args = parser.parse_args(argv)
    if args.answer_tokens < 1:
        print(f"error: --answer-tokens {args.answer_tokens} must be at least 1", file=sys.stderr)
        return 2
    model, tokenizer = load_model(args.model, attn_implementation="eager")
    model.config._attn_implementation = "eager"
    try:
        probes = read_probes(args, tokenizer)
    except (ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    per_probe = [probe_scores(model, probe, args.answer_tokens) for probe in probes]
    layers, heads = per_probe[0].shape
    table = {f"{lay}-{h}": [float(s[lay, h]) for s in per_probe] for lay in range(layers) for h in range(heads)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(table) + "\n")
    print(f"{args.out}: {layers} layers x {heads} query heads from {len(probes)} probes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
