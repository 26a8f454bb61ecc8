"""Record kvpress presses running over transformers' quantized cache (issue #59): what kvpress scores when eviction
and quantization are both on, and the greedy tokens of its pipeline.

kvpress's forward hook (``BasePress.forward_hook``, kvpress 0.5.5) reads a ``QuantizedCache`` layer through
``extract_keys_and_values`` (the *dequantized* prompt states), runs the press's ``compress`` on them and quantizes the
kept states again.  This script runs that outside kvbench, in a virtual environment with kvpress 0.5.5, its pinned
transformers 5.2 and optimum-quanto 0.2.7 (never importing kvbench)::

    python -m venv --system-site-packages /work/venvs/i59-kvpress-quant
    /work/venvs/i59-kvpress-quant/bin/pip install kvpress==0.5.5 transformers==5.2.0 optimum-quanto==0.2.7
    python -c "from kvbench.tasks.tiny_niah import build_instance as b; i = b('niah_multivalue', 40, 40.0, 'kvq'); \
        open('/tmp/ctx.txt', 'w').write(' '.join(i.context)); open('/tmp/q.txt', 'w').write(' '.join(i.question))"
    OMP_NUM_THREADS=1 /work/venvs/i59-kvpress-quant/bin/python scripts/reference/record_kv_quant_press.py \
        --tiny models/tiny-niah --context /tmp/ctx.txt --question /tmp/q.txt --out tests/fixtures/reference/kv_quant

What runs, per press (``SnapKVPress(window_size=64, kernel_size=5)``, ``TOVAPress``; compression ratio 0.5) and
cache (``QuantizedCache(backend="quanto", nbits=4, q_group_size=32, residual_length=16)``, and a ``DynamicCache``
for comparison): the tiny model (float32, sdpa) prefills the context under the press (kvpress's pipeline:
``model.model(context_ids, past_key_values=cache)``), each ``score`` call's output is kept (float32 ``[H, S]`` per
layer), then ``KVPressTextGenerationPipeline.generate_answer`` feeds the question on top of the compressed cache and
decodes greedily.  The context and question are a niah_multivalue prompt of kvbench's tiny_niah generator
(``build_instance("niah_multivalue", 40, 40.0, "kvq")``), given as text files (the first command above; kvbench's
own environment writes them, this script reads them).

Output: ``kv_quant_press.json``: per case the press, the cache, the prompt ids, per layer the kept positions (the
top-k of ``ScorerPress.compress``) and, over the quantized cache, the scores, and the greedy tokens (read from the ids
``generate_answer`` decodes).
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import json
from pathlib import Path

import torch
from kvpress import KVPressTextGenerationPipeline, SnapKVPress, TOVAPress
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, QuantizedCache

QUANTIZED = {"backend": "quanto", "nbits": 4, "q_group_size": 32, "residual_length": 16}
RATIO = 0.5
NEW_TOKENS = 12


def prompt_words(path: Path) -> str:
    return path.read_text(encoding="utf-8").strip()


def recorded_scores(press, calls: list[dict]):
    original = press.score

    def score(module, *args, **kwargs):
        scores = original(module, *args, **kwargs)
        scores_f32 = scores[0].detach().float()
        n_kept = int(scores_f32.shape[-1] * (1 - press.compression_ratio))
        kept = scores_f32.topk(n_kept, dim=-1).indices.sort(dim=-1).values  # ScorerPress.compress's top-k
        calls.append({"layer": int(module.layer_idx), "scores": scores_f32.tolist(), "kept": kept.tolist()})
        return scores

    press.score = score
    return press


def run_case(model, tokenizer, press_name: str, quantized: bool, context: list[int], question: list[int]) -> dict:
    calls: list[dict] = []
    press = SnapKVPress(RATIO, window_size=64, kernel_size=5) if press_name == "SnapKVPress" else TOVAPress(RATIO)
    press = recorded_scores(press, calls)
    cache = QuantizedCache(config=model.config, **QUANTIZED) if quantized else DynamicCache()
    with torch.no_grad():
        with press(model):
            model.model(input_ids=torch.tensor([context]), past_key_values=cache)
        pipeline = KVPressTextGenerationPipeline(model=model, tokenizer=tokenizer)
        pipeline.model.generation_config.eos_token_id = None  # a fixed number of tokens, no stop
        answer_ids: list[int] = []
        original_decode = tokenizer.decode

        def decode(ids, **kwargs):  # generate_answer returns text: its token ids are read where it decodes them
            answer_ids.extend(int(i) for i in ids)
            return original_decode(ids, **kwargs)

        tokenizer.decode = decode
        try:
            pipeline.generate_answer(torch.tensor([question]), cache, len(context), NEW_TOKENS)
        finally:
            tokenizer.decode = original_decode
    if not quantized:  # the comparison case: its kept positions only
        calls = [{"layer": call["layer"], "kept": call["kept"]} for call in calls]
    return {
        "press": press_name,
        "cache": QUANTIZED if quantized else "dynamic",
        "compression_ratio": RATIO,
        "scores": sorted(calls, key=lambda call: call["layer"]),
        "tokens": answer_ids,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", required=True)
    parser.add_argument("--context", type=Path, required=True, help="the context's text (words separated by spaces)")
    parser.add_argument("--question", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(args.tiny, dtype=torch.float32, attn_implementation="sdpa").eval()
    tokenizer = AutoTokenizer.from_pretrained(args.tiny)
    context = tokenizer(prompt_words(args.context) + "\n", add_special_tokens=False)["input_ids"]
    question = tokenizer(prompt_words(args.question), add_special_tokens=False)["input_ids"]
    cases = [
        run_case(model, tokenizer, press, quantized, context, question)
        for press in ("SnapKVPress", "TOVAPress")
        for quantized in (True, False)
    ]
    for case in cases:
        print(case["press"], case["cache"], case["tokens"])
    meta = {
        "format_version": 1,
        "recorder": "scripts/reference/record_kv_quant_press.py",
        "versions": {name: metadata.version(name) for name in ("torch", "transformers", "kvpress", "optimum-quanto")},
        "context_ids": context,
        "question_ids": question,
        "cases": cases,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kv_quant_press.json").write_text(json.dumps(meta) + "\n")


if __name__ == "__main__":
    main()
