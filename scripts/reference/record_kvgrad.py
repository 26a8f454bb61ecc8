"""Record what kvpress's KVgradPress keeps, for kvbench's parity tests (issue #58).

Runs ONLY inside kvpress's own virtual environment (kvpress 0.5.5, transformers 5.2; see
``scripts/reference/record_kvpress.py``); it never imports kvbench and kvbench never imports it::

    OMP_NUM_THREADS=1 /work/venvs/kvpress/bin/python scripts/reference/record_kvgrad.py \
        [--smollm2 ~/.cache/kvbench/models/SmolLM2-135M-Instruct.Q4_1-<sha16>]

Inputs as ``record_kvzip_finch.py``'s KVzip cases (the tiny random Llama of
``tests/fixtures/reference/kvpress/inputs.safetensors``, sdpa, its character-level tokenizers in
``tests/fixtures/reference/kvzip/tokenizer{,_chat}/``, seeded prompt ids with salts from 200).  kvpress's pipeline
prefill runs the context inside ``with press(model)``; KVgradPress then replays it chunk by chunk with one forward and
one backward pass per chunk (outside inference mode) and masks the lowest scores.

With ``--smollm2`` (the folder kvbench's model cache holds after ``model=smollm2-135m-instruct`` ran once: weights,
tokenizer and chat template) also ``KVgradPress_SmolLM2-135M-Instruct.json``: 96 seeded ids
(``Generator().manual_seed(5996)``), ratio 0.5, KVgrad's default chunk (one replay), float32 and bfloat16.

Output ``tests/fixtures/reference/kvzip/KVgradPress.json`` in ``KVzipPress.json``'s schema: per case (dtype,
tokenizer, prompt ids, ratio, settings) the kept positions per layer and KV head (the complement of
``module.masked_key_indices``) and ``score_val`` (float32 ``[L, H, S]``, after the sinks' ``max + 1``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from kvpress import KVgradPress
from transformers import DynamicCache, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_kvpress import MODEL_CONFIG, kept_after_masking
from record_kvzip_finch import DTYPES, FIXTURES, float32_list, load_model, prompt_ids, write

CASES = [  # (length, tokenizer, ratio, settings)
    (48, "tokenizer", 0.5, {}),
    (48, "tokenizer_chat", 0.75, {}),
    (150, "tokenizer", 0.5, {"chunk_size": 64}),
    (150, "tokenizer_chat", 0.75, {"chunk_size": 64}),
    (150, "tokenizer", 0.5, {"chunk_size": 64, "layerwise": True}),
    (96, "tokenizer_chat", 0.25, {"chunk_size": 40, "n_sink": 2}),
]
SALT = 200


def record(out: Path) -> list[dict]:
    cases = []
    for dtype_name, dtype in DTYPES.items():
        for index, (length, tokenizer_dir, ratio, settings) in enumerate(CASES):
            model = load_model(dtype, str(out / tokenizer_dir))
            ids = prompt_ids(length, SALT + index)
            press = KVgradPress(compression_ratio=ratio, **settings)
            captured: dict = {}
            original = press.compress_post

            def capture(model, press=press, original=original, captured=captured):
                original(model)
                captured["scores"] = press.score_val[:, 0].float().clone()

            press.compress_post = capture
            with torch.no_grad(), press(model):
                model.model(input_ids=torch.tensor([ids]), past_key_values=DynamicCache())
            kept = kept_after_masking(model, MODEL_CONFIG["num_key_value_heads"], length)
            cases.append(
                {
                    "dtype": dtype_name,
                    "tokenizer": tokenizer_dir,
                    "input_ids": ids,
                    "compression_ratio": ratio,
                    "settings": {"n_sink": press.n_sink, "chunk_size": press.chunk_size, "layerwise": press.layerwise},
                    "kept": kept,
                    "scores": float32_list(captured["scores"]),
                }
            )
    return cases


#: SmolLM2 cases (``--smollm2``): (length, ratio, settings); ids from ``Generator().manual_seed(5900 + length)``.
SMOLLM2_CASES = [(96, 0.5, {})]  # one backward per case: the tiny model's cases cover several chunks


def record_smollm2(folder: Path) -> list[dict]:
    """KVgradPress on SmolLM2-135M-Instruct as kvbench converts it (its chat template and tokenizer in ``folder``)."""
    cases = []
    for dtype_name, dtype in DTYPES.items():
        model = LlamaForCausalLM.from_pretrained(str(folder), attn_implementation="sdpa", dtype=dtype).eval()
        heads = model.config.num_key_value_heads
        for length, ratio, settings in SMOLLM2_CASES:
            generator = torch.Generator().manual_seed(5900 + length)
            ids = torch.randint(0, model.config.vocab_size, (length,), generator=generator).tolist()
            press = KVgradPress(compression_ratio=ratio, **settings)
            captured: dict = {}
            original = press.compress_post

            def capture(model, press=press, original=original, captured=captured):
                original(model)
                captured["scores"] = press.score_val[:, 0].float().clone()

            press.compress_post = capture
            with torch.no_grad(), press(model):
                model.model(input_ids=torch.tensor([ids]), past_key_values=DynamicCache())
            kept = kept_after_masking(model, heads, length)
            cases.append(
                {
                    "dtype": dtype_name,
                    "input_ids": ids,
                    "compression_ratio": ratio,
                    "settings": {"n_sink": press.n_sink, "chunk_size": press.chunk_size, "layerwise": press.layerwise},
                    "kept": kept,
                    "scores": float32_list(captured["scores"]),
                }
            )
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smollm2", type=Path, default=None, help="kvbench's converted SmolLM2-135M-Instruct folder")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    kvzip_dir = FIXTURES / "kvzip"
    write(kvzip_dir / "KVgradPress.json", "KVgradPress", record(kvzip_dir))
    if args.smollm2 is not None:
        write(kvzip_dir / "KVgradPress_SmolLM2-135M-Instruct.json", "KVgradPress", record_smollm2(args.smollm2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
