"""Record what kvpress's KVzipPress and FinchPress keep, for kvbench's parity tests (issue #44).

Runs ONLY inside kvpress's own virtual environment (kvpress 0.5.5, transformers 5.2; see
``scripts/reference/record_kvpress.py``); it never imports kvbench and kvbench never imports it::

    OMP_NUM_THREADS=1 /work/venvs/kvpress/bin/python scripts/reference/record_kvzip_finch.py

Inputs: the tiny random Llama of ``tests/fixtures/reference/kvpress/inputs.safetensors`` (``weights/*``; the float32
model holds the same bfloat16-representable numbers), sdpa attention, and a character-level tokenizer written here to
``tests/fixtures/reference/kvzip/tokenizer{,_chat}/`` (97 ids below the model's vocabulary of 128; the ``_chat``
one has a chat template, so KVzip's prefix and assistant suffix are not empty).  Prompt ids are seeded.

Outputs (JSON, one file per press, in ``tests/fixtures/reference/{kvzip,finch}/``):

* ``KVzipPress.json``: per case (dtype, tokenizer, prompt ids, ratio, settings) the kept positions per layer and KV
  head (the complement of ``module.masked_key_indices``) and ``score_val`` (float32 ``[L, H, S]``, after the sinks'
  ``max + 1``);
* ``FinchPress.json``: per case (dtype, context ids, question ids, ratio, settings) the kept positions per layer and
  KV head (the indices ``KeyRerotationPress.rerotate_keys`` received), ``score()`` (float32 ``[H, S]``), the
  position the pipeline continues from, and (in ``finch/tensors.safetensors``, the case's dtype) the compressed
  cache's keys ``[H, n, D]`` per layer;
* ``KeyRerotationPress.json``: ``rerotate_keys`` alone on seeded random keys and kept positions (the kept keys and
  the result in ``finch/tensors.safetensors``); ``KVzipPress_select.json``: ``compress_post`` alone on seeded random
  (and rounded, so tied) ``score_val``.
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import sys
from pathlib import Path

import torch
from kvpress import FinchPress, KVzipPress
from kvpress.presses.key_rerotation_press import KeyRerotationPress
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, models
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_kvpress import MODEL_CONFIG, kept_after_masking  # the tiny Llama whose weights are inputs.safetensors

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "reference"
WEIGHTS = FIXTURES / "kvpress" / "inputs.safetensors"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
CHAT_TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)
PROMPT_SEED = 4400
#: Ids drawn for prompts: the tokenizer's 97 characters (ids 0..96).
PROMPT_VOCAB = 97
FINCH_DELIMITER = 127
#: Tensors the JSON files name (``tensors`` keys), written to ``finch/tensors.safetensors`` in their dtype.
TENSORS: dict[str, torch.Tensor] = {}


def write_tokenizer(path: Path, chat: bool) -> None:
    """A character-level tokenizer (``\\n``, printable ASCII, ``<unk>``): ids 0..96."""
    chars = ["\n"] + [chr(c) for c in range(32, 127)]
    vocab = {ch: i for i, ch in enumerate(chars)}
    vocab["<unk>"] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
    if chat:
        tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)


def load_model(dtype: torch.dtype, name_or_path: str) -> LlamaForCausalLM:
    model = LlamaForCausalLM(LlamaConfig(**MODEL_CONFIG, attn_implementation="sdpa"))
    weights = {k[len("weights/") :]: v.to(dtype) for k, v in load_file(WEIGHTS).items() if k.startswith("weights/")}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and all("lm_head" in name for name in missing), (missing, unexpected)
    model.config.name_or_path = name_or_path
    return model.to(dtype).eval()


def prompt_ids(length: int, salt: int) -> list[int]:
    generator = torch.Generator().manual_seed(PROMPT_SEED + 1000 * salt + length)
    return torch.randint(0, PROMPT_VOCAB, (length,), generator=generator).tolist()


def float32_list(tensor: torch.Tensor) -> list:
    return tensor.detach().float().tolist()


# ------------------------------------------------------------------------------------------------ KVzip
KVZIP_CASES = [  # (length, tokenizer, ratio, settings)
    (48, "tokenizer", 0.5, {}),
    (48, "tokenizer_chat", 0.75, {}),
    (150, "tokenizer", 0.5, {"chunk_size": 64}),
    (150, "tokenizer_chat", 0.75, {"chunk_size": 64}),
    (150, "tokenizer", 0.5, {"chunk_size": 64, "layerwise": True}),
    (96, "tokenizer_chat", 0.25, {"chunk_size": 40, "n_sink": 2}),
]


def record_kvzip(out: Path) -> list[dict]:
    cases = []
    for dtype_name, dtype in DTYPES.items():
        for salt, (length, tokenizer_dir, ratio, settings) in enumerate(KVZIP_CASES):
            model = load_model(dtype, str(out / tokenizer_dir))
            ids = prompt_ids(length, salt)
            press = KVzipPress(compression_ratio=ratio, **settings)
            captured = {}
            original = press.compress_post

            def capture(model, press=press, original=original, captured=captured):
                original(model)
                captured["scores"] = press.score_val[:, 0].float().clone()

            press.compress_post = capture
            cache = DynamicCache()
            with torch.no_grad(), press(model):
                model.model(input_ids=torch.tensor([ids]), past_key_values=cache)
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


# ------------------------------------------------------------------------------------------------ Finch
FINCH_CASES = [  # (context length, question length, ratio, settings)
    (48, 8, 0.5, {}),
    (120, 12, 0.75, {}),
    (120, 12, 0.5, {"normalize_scores": False}),
    (200, 20, 0.875, {}),
    (80, 6, 0.25, {"rerotate_keys": False}),
]


def record_finch(out: Path) -> list[dict]:
    cases = []
    original_rerotate = KeyRerotationPress.rerotate_keys
    for dtype_name, dtype in DTYPES.items():
        for salt, (length, question, ratio, settings) in enumerate(FINCH_CASES):
            model = load_model(dtype, str(out))
            ids = prompt_ids(length + question, 100 + salt)
            context, question_ids = ids[:length], ids[length:]
            press = FinchPress(compression_ratio=ratio, **settings)
            press.delimiter_token_id = FINCH_DELIMITER
            scores, indices = {}, {}
            original_score = press.score

            def score(module, *args, original_score=original_score, scores=scores, **kwargs):
                result = original_score(module, *args, **kwargs)
                scores[int(module.layer_idx)] = result[0].float().clone()
                return result

            def rerotate(module, kept, keys, indices=indices):
                indices[int(module.layer_idx)] = kept[0].clone()
                return original_rerotate(module, kept, keys)

            press.score = score
            KeyRerotationPress.rerotate_keys = staticmethod(rerotate)
            cache = DynamicCache()
            try:
                with torch.no_grad(), press(model):
                    prompt = torch.tensor([[*context, FINCH_DELIMITER, *question_ids]])
                    model.model(input_ids=prompt, past_key_values=cache)
            finally:
                KeyRerotationPress.rerotate_keys = staticmethod(original_rerotate)
            layers = range(MODEL_CONFIG["num_hidden_layers"])
            tensor_name = f"finch/{dtype_name}/case{salt}"
            for layer in layers:
                TENSORS[f"{tensor_name}/layer{layer}/keys"] = cache.layers[layer].keys[0].contiguous()
            if press.rerotate_keys:
                kept = [indices[layer].tolist() for layer in layers]
            else:  # top-k of the recorded scores, as FinchPress.compress (unsorted: sort per head)
                n_kept = max(1, int((length + question) * (1 - ratio)))
                kept = [scores[layer].topk(n_kept, dim=-1).indices.sort(dim=-1).values.tolist() for layer in layers]
            cases.append(
                {
                    "dtype": dtype_name,
                    "context_ids": context,
                    "question_ids": question_ids,
                    "compression_ratio": ratio,
                    "settings": {
                        "normalize_scores": press.normalize_scores,
                        "rerotate_keys": press.rerotate_keys,
                        "window_size": press.window_size,
                    },
                    "kept": kept,
                    "scores": [float32_list(scores[layer]) for layer in layers],
                    "tensors": tensor_name,
                    "next_position": cache.get_seq_length(),
                }
            )
    return cases


# ------------------------------------------------------------------------------------------------ seeded tensors
TENSOR_SEED = 4401
#: (layers, KV heads, tokens, ratio, layerwise, levels): ``levels`` > 0 rounds the scores to that many values (ties).
SELECT_CASES = [
    (2, 2, 40, 0.5, False, 0),
    (3, 2, 64, 0.75, False, 0),
    (2, 4, 50, 0.6, False, 8),
    (2, 2, 40, 0.5, True, 0),
    (3, 2, 33, 0.3, True, 5),
]


def record_kvzip_select() -> list[dict]:
    """``KVzipPress.compress_post`` on seeded random ``score_val`` ``[L, 1, H, S]`` (the selection alone)."""
    cases = []
    generator = torch.Generator().manual_seed(TENSOR_SEED)
    for dtype_name, dtype in DTYPES.items():
        for layers, heads, length, ratio, layerwise, levels in SELECT_CASES:
            scores = torch.rand((layers, 1, heads, length), generator=generator)
            if levels:
                scores = (scores * levels).floor() / levels
            config = dict(MODEL_CONFIG, num_hidden_layers=layers, num_key_value_heads=heads, num_attention_heads=heads)
            model = LlamaForCausalLM(LlamaConfig(**config, attn_implementation="sdpa"))
            press = KVzipPress(compression_ratio=ratio, layerwise=layerwise)
            press.score_val = scores.to(dtype)
            press.compress_post(model)
            kept = kept_after_masking(model, heads, length)
            cases.append(
                {
                    "dtype": dtype_name,
                    "compression_ratio": ratio,
                    "settings": {"n_sink": press.n_sink, "layerwise": layerwise},
                    "scores": float32_list(scores[:, 0].to(dtype)),
                    "final_scores": float32_list(press.score_val[:, 0]),
                    "kept": kept,
                }
            )
    return cases


#: (KV heads, tokens, kept): seeded random keys ``[1, H, S, 16]`` and per head ``kept`` sorted random positions.
REROTATE_CASES = [(2, 40, 12), (2, 300, 77), (3, 128, 128)]


def record_rerotation() -> list[dict]:
    """``KeyRerotationPress.rerotate_keys`` on seeded random keys and kept positions (the tiny Llama's rotary)."""
    cases = []
    generator = torch.Generator().manual_seed(TENSOR_SEED + 1)
    model = LlamaForCausalLM(LlamaConfig(**MODEL_CONFIG))
    module = model.model.layers[0].self_attn
    module.rotary_emb = model.model.rotary_emb
    for dtype_name, dtype in DTYPES.items():
        for heads, length, kept in REROTATE_CASES:
            keys = torch.randn((1, heads, length, MODEL_CONFIG["head_dim"]), generator=generator)
            order = torch.stack([torch.randperm(length, generator=generator)[:kept] for _ in range(heads)])
            indices = order.sort(dim=-1).values[None]
            rotated = KeyRerotationPress.rerotate_keys(module, indices, keys.to(dtype))
            kept_keys = keys[0].gather(1, indices[0, :, :, None].expand(-1, -1, keys.shape[-1]))
            name = f"rerotation/{dtype_name}/case{len(cases)}"
            TENSORS[f"{name}/kept_keys"] = kept_keys.to(dtype).contiguous()
            TENSORS[f"{name}/rotated"] = rotated[0].contiguous()
            cases.append({"dtype": dtype_name, "tensors": name, "length": length, "positions": indices[0].tolist()})
    return cases


def versions() -> dict:
    return {name: metadata.version(name) for name in ("kvpress", "transformers", "torch")} | {
        "python": sys.version.split()[0]
    }


def write(path: Path, press: str, cases: list[dict]) -> None:
    payload = {
        "press": press,
        "versions": versions(),
        "model_config": MODEL_CONFIG,
        "weights": "tests/fixtures/reference/kvpress/inputs.safetensors weights/* (cast to the case's dtype)",
        "prompt_seed": PROMPT_SEED,
        "cases": cases,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, separators=(",", ":")) + "\n")


def main() -> int:
    torch.set_num_threads(1)
    kvzip_dir = FIXTURES / "kvzip"
    write_tokenizer(kvzip_dir / "tokenizer", chat=False)
    write_tokenizer(kvzip_dir / "tokenizer_chat", chat=True)
    write(kvzip_dir / "KVzipPress.json", "KVzipPress", record_kvzip(kvzip_dir))
    write(kvzip_dir / "KVzipPress_select.json", "KVzipPress", record_kvzip_select())
    finch_dir = FIXTURES / "finch"
    write(finch_dir / "FinchPress.json", "FinchPress", record_finch(finch_dir))
    write(finch_dir / "KeyRerotationPress.json", "KeyRerotationPress", record_rerotation())
    save_file(TENSORS, finch_dir / "tensors.safetensors", metadata={"recorder": Path(__file__).name})
    (finch_dir / "tensors.safetensors").chmod(0o644)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
