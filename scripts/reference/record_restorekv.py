"""Record what kvpress's RestoreKVPress keeps, and the restore tokens' keys and values, with kvbench's small
CPU-trained weights (issue #58), for kvbench's parity test.

Runs ONLY inside kvpress's own virtual environment (kvpress 0.5.5, transformers 5.2, peft 0.21.2; see
``scripts/reference/record_kvpress.py``); it never imports kvbench and kvbench never imports it::

    OMP_NUM_THREADS=1 /work/venvs/kvpress/bin/python scripts/reference/record_restorekv.py

``RestoreKVPress.post_init_from_model`` downloads ``higokri/RestoreKV-<model>`` from the Hub, which these machines
cannot reach; here it reads kvbench's shipped folder instead (``models/restorekv/tiny-niah/``, the published
format): ``restore_embeddings.safetensors`` by ``safetensors.torch.load_file`` cast to the model's dtype, and the LoRA
adapter by the model's own ``load_adapter(<folder>, adapter_name="restorekv")`` (PEFT), then ``disable_adapters()``
-- the press's lines with the Hub id replaced by the folder; nothing else is changed.

Model: kvbench's embedded ``models/tiny-niah`` (``LlamaForCausalLM.from_pretrained(dtype=...)``, sdpa; its own
tokenizer, no chat template), float32 and bfloat16.  Prompt ids: ``torch.randint(4, vocab)`` from
``Generator().manual_seed(5800 + S)`` (as ``record_learned.py``).  Each case runs kvpress's pipeline prefill
(``model.model(input_ids, past_key_values=DynamicCache())`` inside ``with press(model)``).

Output ``tests/fixtures/reference/learned/RestoreKVPress_tiny-niah.json`` (``../kvzip/KVzipPress.json``'s schema):
per case ``dtype``, ``input_ids``, ``compression_ratio``, ``settings``, ``checkpoint``, ``restore_tokens`` (n),
``kept`` (the prompt's kept positions per layer and KV head: the complement of ``masked_key_indices`` over
``0 .. S-1``; the restore tokens at ``S .. S+n-1`` are never masked), ``scores`` (``score_val`` ``[L, H, S]`` float32,
after the sinks' ``max + 1``), ``restore_kv`` (the key of ``RestoreKVPress_tiny-niah.safetensors`` holding the
cache's restore-token keys and values, ``<key>/keys`` and ``<key>/values`` ``[L, H, n, D]`` in the case's dtype).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import torch
from kvpress import RestoreKVPress
from safetensors.torch import load_file, save_file
from transformers import DynamicCache, LlamaForCausalLM

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
from record_kvpress import kept_after_masking, settings_of, versions  # noqa: E402

from tests.reference_recordings import checksum  # noqa: E402  (torch + safetensors only)

OUT = ROOT / "tests" / "fixtures" / "reference" / "learned"
MODEL = ROOT / "models" / "tiny-niah"
WEIGHTS = ROOT / "models" / "restorekv" / "tiny-niah"
FILES = ("adapter_config.json", "adapter_model.safetensors", "restore_embeddings.safetensors")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
PROMPT_SEED = 5800
#: (prompt length, compression ratio, layerwise): 48 tokens at 0.9 raises the ratio past 1 (every prompt token goes).
CASES = ((48, 0.25, False), (48, 0.5, False), (48, 0.9, False), (160, 0.5, False), (160, 0.75, False),
         (160, 0.5, True))  # fmt: skip


@dataclasses.dataclass
class LocalRestoreKVPress(RestoreKVPress):
    """kvpress's RestoreKVPress reading a local folder in place of ``hf_hub_download`` (module docstring)."""

    checkpoint: str = ""

    def post_init_from_model(self, model):
        if self.checkpoint == self.restore_model_name:
            return
        embeddings = load_file(str(Path(self.checkpoint) / "restore_embeddings.safetensors"))["restore_embeddings"]
        self.restore_embeddings = embeddings.to(model.device, dtype=model.dtype)
        if self.adapter_name not in getattr(model, "peft_config", {}):
            model.load_adapter(self.checkpoint, adapter_name=self.adapter_name)
        model.disable_adapters()
        self.restore_model_name = self.checkpoint


def main() -> int:
    if "kvbench" in sys.modules:
        raise SystemExit("record_restorekv.py must not run with kvbench imported")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cases, tensors = [], {}
    for dtype_name, dtype in DTYPES.items():
        model = LlamaForCausalLM.from_pretrained(str(MODEL), attn_implementation="sdpa", dtype=dtype).eval()
        heads = model.config.num_key_value_heads
        for length, ratio, layerwise in CASES:
            generator = torch.Generator().manual_seed(PROMPT_SEED + length)
            ids = torch.randint(4, model.config.vocab_size, (1, length), generator=generator)
            press = LocalRestoreKVPress(compression_ratio=ratio, layerwise=layerwise, checkpoint=str(WEIGHTS))
            captured = {}
            original = press.compress_post

            def capture(model, press=press, original=original, captured=captured, length=length):
                original(model)
                captured["scores"] = press.score_val[:, 0].float().clone()
                layers = press._cache.layers
                captured["keys"] = torch.stack([layer.keys[0, :, length:] for layer in layers]).clone()
                captured["values"] = torch.stack([layer.values[0, :, length:] for layer in layers]).clone()

            press.compress_post = capture
            with torch.no_grad(), press(model):
                model.model(input_ids=ids, past_key_values=DynamicCache())
            kept = kept_after_masking(model, heads, length)
            key = f"{dtype_name}/S{length}/c{ratio}/{'layerwise' if layerwise else 'global'}"
            tensors[f"{key}/keys"] = captured["keys"].contiguous()
            tensors[f"{key}/values"] = captured["values"].contiguous()
            cases.append(
                {
                    "dtype": dtype_name,
                    "input_ids": ids[0].tolist(),
                    "compression_ratio": ratio,
                    "settings": {k: v for k, v in settings_of(press).items() if k != "checkpoint"},
                    "checkpoint": str(WEIGHTS.relative_to(ROOT)),
                    "restore_tokens": int(press_tokens(captured)),
                    "kept": kept,
                    "scores": [[[float(x) for x in head] for head in layer] for layer in captured["scores"]],
                    "restore_kv": key,
                }
            )
    used = {
        f"{WEIGHTS.relative_to(ROOT)}/{name}": torch.frombuffer(
            bytearray((WEIGHTS / name).read_bytes()), dtype=torch.uint8
        )
        for name in FILES
    }
    payload = {
        "press": "RestoreKVPress_tiny-niah",
        "note": "RestoreKVPress with kvbench's shipped CPU-trained weights for tiny-niah (not the authors'); sdpa",
        "versions": {**versions(), "peft": _version("peft")},
        "inputs_checksums": {key: checksum(value) for key, value in sorted(used.items())},
        "cases": cases,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "RestoreKVPress_tiny-niah.json").write_text(json.dumps(payload, separators=(",", ":")) + "\n")
    save_file(tensors, str(OUT / "RestoreKVPress_tiny-niah.safetensors"))
    print(f"RestoreKVPress_tiny-niah.json: {len(cases)} cases", flush=True)
    return 0


def press_tokens(captured: dict) -> int:
    return captured["keys"].shape[2]


def _version(name: str) -> str:
    import importlib.metadata as metadata

    return metadata.version(name)


if __name__ == "__main__":
    raise SystemExit(main())
