"""Bench: multiple-choice scoring through the lm-eval bridge, compress-once versus recompress-per-choice.

For synthetic multiple-choice questions (``--docs`` documents of ``--context`` tokens, ``--choices`` answers of
``--answer`` tokens each) on the tiny random model (``builtin:tiny-random-llama``, byte-level tokens), per method at a
ratio budget, this times:

* ``compress_once``: what the bridge does (kvbench/lmeval/loglikelihood.py): one compressed prefill per document, every
  choice scored on a copy of that cache;
* ``recompress``: the naive alternative: every choice prefills and compresses its context again;

and checks that both give identical log-likelihoods.  Reports requests (choices) per second and the speed-up.
Writes ``results/bench/lmeval.json`` (``--out``) and prints a table.  Not a test: numbers depend on the machine (and
on its load: say whether it was shared).  Example::

    python scripts/bench_lmeval.py --methods snapkv h2o ahakv --context 512 --docs 8
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time
from pathlib import Path

import torch

from kvbench.budget import parse_budget
from kvbench.eviction.base import build_method
from kvbench.lmeval.loglikelihood import compress_context, score_continuation
from kvbench.lmeval.presets import method_config
from kvbench.models.loading import build_builtin


def _requests(docs: int, context: int, choices: int, answer: int, vocab: int, seed: int) -> list[tuple[list, list]]:
    rng = random.Random(seed)
    return [
        ([rng.randrange(3, vocab) for _ in range(context)], [[rng.randrange(3, vocab) for _ in range(answer)]
                                                             for _ in range(choices)])
        for _ in range(docs)
    ]  # fmt: skip


def bench_method(model, name: str, budget: str, requests, question_mode: str) -> dict:
    method, parsed = build_method(method_config(name)), parse_budget(budget)
    timings, scores = {}, {}
    for mode in ("compress_once", "recompress"):
        out = []
        start = time.perf_counter()
        for context, answers in requests:
            shared = None
            for answer in answers:
                if shared is None or mode == "recompress":
                    shared = compress_context(model, context, method=method, budget=parsed, question_mode=question_mode)
                out.append(score_continuation(model, shared, answer))
        timings[mode] = time.perf_counter() - start
        scores[mode] = out
    n = sum(len(answers) for _, answers in requests)
    return {
        "method": name,
        "budget": budget,
        "requests": n,
        "compress_once_s": round(timings["compress_once"], 4),
        "recompress_s": round(timings["recompress"], 4),
        "compress_once_req_per_s": round(n / timings["compress_once"], 2),
        "recompress_req_per_s": round(n / timings["recompress"], 2),
        "speedup": round(timings["recompress"] / timings["compress_once"], 2),
        "identical_scores": scores["compress_once"] == scores["recompress"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=["snapkv", "h2o", "ahakv", "streamingllm", "tova"])
    parser.add_argument("--budget", default="0.2x")
    parser.add_argument("--context", type=int, default=512, help="context tokens per document")
    parser.add_argument("--docs", type=int, default=8)
    parser.add_argument("--choices", type=int, default=4)
    parser.add_argument("--answer", type=int, default=8, help="tokens per answer choice")
    parser.add_argument("--question-mode", default="agnostic", choices=["agnostic", "aware"])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default="results/bench/lmeval.json")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = build_builtin("tiny-random-llama", seed=0)
    model.set_attn_implementation("kvbench")
    model.eval()
    requests = _requests(args.docs, args.context, args.choices, args.answer, len(tokenizer), seed=0)
    compress_context(model, requests[0][0][:64], method=build_method(method_config("snapkv")),
                     budget=parse_budget(args.budget))  # warm-up  # fmt: skip
    rows = [bench_method(model, m, args.budget, requests, args.question_mode) for m in args.methods]
    report = {
        "model": "builtin:tiny-random-llama (4 layers, hidden 64, float32)",
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads",
        "settings": {k: v for k, v in vars(args).items() if k not in ("out",)},
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'method':<14}{'req':>5}{'once req/s':>12}{'recompress req/s':>18}{'speed-up':>10}  identical")
    for r in rows:
        print(f"{r['method']:<14}{r['requests']:>5}{r['compress_once_req_per_s']:>12}{r['recompress_req_per_s']:>18}"
              f"{r['speedup']:>10}  {r['identical_scores']}")  # fmt: skip
    print(f"written: {out}")


if __name__ == "__main__":
    main()
