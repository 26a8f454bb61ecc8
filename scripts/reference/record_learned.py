"""Record what kvpress's learned-scorer presses keep with kvbench's small checkpoints (issue #58), for parity tests.

Runs ONLY inside kvpress's own virtual environment (kvpress 0.5.5, transformers 5.2; see
``scripts/reference/record_kvpress.py``); it never imports kvbench and kvbench never imports it::

    OMP_NUM_THREADS=1 /work/venvs/kvpress/bin/python scripts/reference/record_learned.py \\
        [--smollm2 ~/.cache/kvbench/models/SmolLM2-135M-Instruct.Q4_1-<sha16>]

``KVzapPress`` loads ``nvidia/KVzap-<type>-<model>`` from the Hub, which these machines cannot reach; here its
``post_init_from_model`` loads kvbench's shipped checkpoint instead (``models/kvzap/<model>/<type>/``, the published
format, through kvpress's own ``KVzapModel.from_pretrained``): the same weights kvbench's ``method=kvzap`` reads.

Models: kvbench's embedded ``models/tiny-niah`` (``LlamaForCausalLM.from_pretrained``, sdpa, float32 and
bfloat16) and, with ``--smollm2``, SmolLM2-135M-Instruct as kvbench converts it (the folder kvbench's model cache
holds after ``model=smollm2-135m-instruct`` ran once).  Prompt ids: ``torch.randint`` over the vocabulary (special
tokens excluded) from ``Generator().manual_seed(5800 + length)``.  Each case runs kvpress's pipeline prefill
(``model.model(input_ids, past_key_values=DynamicCache())`` inside ``with press(model)``); kept positions are
recovered as ``record_kvpress.py`` does (its ``Tracker``), scores are every ``score()`` call's output.

Output: ``tests/fixtures/reference/learned/KVzapPress_<model>.json`` in ``record_kvpress.py``'s format (format
version 1: ``cases`` with ``kind: model``, ``dtype``, ``compression_ratio``, ``settings``, ``n_kept``, ``kept``,
``score_calls``; ``score_tables``), each case also carrying its ``input_ids`` and ``checkpoint`` (the folder,
relative to the repository).  Format and notes: ``tests/fixtures/reference/learned/README.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import torch
from kvpress import KVzapPress
from kvpress.presses.kvzap_press import KVzapModel
from transformers import LlamaForCausalLM

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
from record_kvpress import FORMAT_VERSION, ScoreTables, run_model_prefill, settings_of, versions  # noqa: E402

from tests.reference_recordings import checksum  # noqa: E402  (torch + safetensors only)

OUT = ROOT / "tests" / "fixtures" / "reference" / "learned"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
PROMPT_SEED = 5800
#: (model name, folder of kvbench's shipped checkpoints, lengths, ratios, first id drawn)
TINY = ("tiny-niah", ROOT / "models" / "kvzap" / "tiny-niah", (48, 160), (0.25, 0.5, 0.75), 4)
SMOLLM2 = ("SmolLM2-135M-Instruct", ROOT / "models" / "kvzap" / "SmolLM2-135M-Instruct", (96,), (0.5,), 0)


@dataclasses.dataclass
class LocalKVzapPress(KVzapPress):
    """kvpress's KVzapPress with its surrogate read from a local checkpoint folder (module docstring)."""

    checkpoint: str = ""

    def post_init_from_model(self, model):
        if self.kvzap_model_name != self.checkpoint:
            self.kvzap_model_name = self.checkpoint
            self.kvzap_model = KVzapModel.from_pretrained(self.checkpoint)


def load(folder: Path, dtype: torch.dtype) -> LlamaForCausalLM:
    """As a kvpress user loads it: ``from_pretrained(..., dtype=...)`` (the rotary ``inv_freq`` stays float32; a
    ``.to(bfloat16)`` of a float32 model would round it)."""
    return LlamaForCausalLM.from_pretrained(str(folder), attn_implementation="sdpa", dtype=dtype).eval()


def prompt(length: int, vocab: int, first: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(PROMPT_SEED + length)
    return torch.randint(first, vocab, (1, length), generator=generator)


def record(name: str, model_folder: Path, checkpoints: Path, lengths, ratios, first: int) -> dict:
    tables, cases = ScoreTables(), []
    used = {}
    for dtype_name, dtype in DTYPES.items():
        model = load(model_folder, dtype)
        for model_type in ("linear", "mlp"):
            folder = checkpoints / model_type
            for length in lengths:
                ids = prompt(length, model.config.vocab_size, first)
                for ratio in ratios:
                    press = LocalKVzapPress(compression_ratio=ratio, model_type=model_type, checkpoint=str(folder))
                    tracker, calls = run_model_prefill(model, press, ids)
                    kept = tracker.kept()
                    settings = settings_of(press)
                    settings["checkpoint"] = str(folder.relative_to(ROOT))
                    cases.append(
                        {
                            "kind": "model",
                            "inputs": f"model/{name}/sdpa/{dtype_name}/S{length}",
                            "dtype": dtype_name,
                            "compression_ratio": ratio,
                            "settings": settings,
                            "n_kept": [[len(h) for h in layer] for layer in kept],
                            "kept": kept,
                            "score_calls": [
                                {"press": c["press"], "layer": c["layer"], "table": tables.add(c["scores"])}
                                for c in calls
                            ],
                            "input_ids": ids[0].tolist(),
                            "checkpoint": str(folder.relative_to(ROOT)),
                        }
                    )
            for file in ("config.json", "model.safetensors"):
                raw = torch.frombuffer(bytearray((folder / file).read_bytes()), dtype=torch.uint8)
                used[f"{folder.relative_to(ROOT)}/{file}"] = raw
    return {
        "format_version": FORMAT_VERSION,
        "press": f"KVzapPress_{name}",
        "note": (
            f"KVzapPress with kvbench's shipped CPU-trained checkpoints for {name} (not NVIDIA's), loaded by "
            "kvpress's KVzapModel.from_pretrained; pipeline prefill, sdpa"
        ),
        "versions": versions(),
        "recording": {"model": name, "prompt_seed": PROMPT_SEED, "lengths": list(lengths), "ratios": list(ratios)},
        "inputs_checksums": {key: checksum(value) for key, value in sorted(used.items())},
        "cases": cases,
        "score_tables": tables.tables,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smollm2", type=Path, default=None, help="kvbench's converted SmolLM2-135M-Instruct folder")
    args = parser.parse_args(argv)
    if "kvbench" in sys.modules:
        raise SystemExit("record_learned.py must not run with kvbench imported")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    OUT.mkdir(parents=True, exist_ok=True)
    runs = [(TINY, ROOT / "models" / "tiny-niah")]
    if args.smollm2 is not None:
        runs.append((SMOLLM2, args.smollm2.expanduser()))
    for (name, checkpoints, lengths, ratios, first), model_folder in runs:
        payload = record(name, model_folder, checkpoints, lengths, ratios, first)
        path = OUT / f"{payload['press']}.json"
        path.write_text(json.dumps(payload, separators=(",", ":")) + "\n")
        print(f"{path.name}: {len(payload['cases'])} cases", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
