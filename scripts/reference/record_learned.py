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

``FastKVzipPress`` downloads its gates from ``Jang-Hyun/Fast-KVzip``; here ``post_init_from_model`` builds kvpress's
own ``FastKVzipGate`` modules from kvbench's shipped gate file (``models/fastkvzip/tiny-niah/q2_dim16_sink16.pt``),
cast to the model's dtype (kvpress runs the gates' linear maps in the file's dtype, which must be the model's).

Output: ``tests/fixtures/reference/learned/FastKVzipPress_tiny-niah.json`` (``KVzipPress.json``'s schema: per case
``dtype``, ``input_ids``, ``compression_ratio``, ``settings``, ``checkpoint``, ``kept``, ``scores`` ``[L, H, S]``) and
``tests/fixtures/reference/learned/KVzapPress_<model>.json`` in ``record_kvpress.py``'s format (format
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
from kvpress import FastKVzipPress, KVzapPress
from kvpress.presses.fastkvzip_press import FastKVzipGate
from kvpress.presses.kvzap_press import KVzapModel
from transformers import DynamicCache, LlamaForCausalLM

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
from record_kvpress import (  # noqa: E402
    FORMAT_VERSION,
    ScoreTables,
    float32_list,
    kept_after_masking,
    run_model_prefill,
    settings_of,
    versions,
)

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


@dataclasses.dataclass
class LocalFastKVzipPress(FastKVzipPress):
    """kvpress's FastKVzipPress with its gates built as ``load_fastkvzip`` builds them, from a local gate file (cast
    to ``gate_dtype`` first: kvpress runs the gates' linear maps in their own dtype, which must be the model's)."""

    checkpoint: str = ""
    gate_dtype: str = "float32"

    def post_init_from_model(self, model):
        if self.gates is None:
            states = torch.load(self.checkpoint, weights_only=True)["module"]
            states = [{k: v.to(DTYPES[self.gate_dtype]) for k, v in state.items()} for state in states]
            out_dim = states[0]["q_norm.weight"].shape[-1]
            heads = states[0]["k_proj.weight"].shape[0] // out_dim
            groups = states[0]["q_proj.weight"].shape[0] // (heads * out_dim)
            dtype, hidden = states[0]["q_proj.weight"].dtype, states[0]["q_proj.weight"].shape[1]
            sink = states[0]["k_base"].shape[2]
            self.gates = []
            for index, state in enumerate(states):
                gate = FastKVzipGate(index, hidden, heads, groups, dtype, out_dim, sink)
                gate.load_state_dict(state)
                self.gates.append(gate)


def record_fastkvzip(name: str, model_folder: Path, gate_file: Path, lengths, ratios, first: int) -> dict:
    """FastKVzipPress cases in ``KVzipPress.json``'s schema (kept = complement of the masked indices; ``scores`` =
    ``score_val`` ``[L, H, S]`` float32)."""
    cases = []
    for dtype_name, dtype in DTYPES.items():
        model = load(model_folder, dtype)
        heads = model.config.num_key_value_heads
        for length in lengths:
            ids = prompt(length, model.config.vocab_size, first)
            for ratio, layerwise in [(r, False) for r in ratios] + [(ratios[-1], True)]:
                press = LocalFastKVzipPress(
                    compression_ratio=ratio, layerwise=layerwise, checkpoint=str(gate_file), gate_dtype=dtype_name
                )
                captured = {}
                original = press.compress_post

                def capture(model, press=press, original=original, captured=captured):
                    original(model)
                    captured["scores"] = press.score_val[:, 0].float().clone()

                press.compress_post = capture
                with torch.no_grad(), press(model):
                    model.model(input_ids=ids, past_key_values=DynamicCache())
                kept = kept_after_masking(model, heads, length)
                cases.append(
                    {
                        "dtype": dtype_name,
                        "input_ids": ids[0].tolist(),
                        "compression_ratio": ratio,
                        "settings": {k: v for k, v in settings_of(press).items() if k != "checkpoint"},
                        "checkpoint": str(gate_file.relative_to(ROOT)),
                        "kept": kept,
                        "scores": float32_list(captured["scores"]),
                    }
                )
    raw = torch.frombuffer(bytearray(gate_file.read_bytes()), dtype=torch.uint8)
    return {
        "press": f"FastKVzipPress_{name}",
        "note": f"FastKVzipPress with kvbench's shipped CPU-trained gates for {name} (not the authors'); sdpa",
        "versions": versions(),
        "inputs_checksums": {str(gate_file.relative_to(ROOT)): checksum(raw)},
        "cases": cases,
    }


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
    gate_file = ROOT / "models" / "fastkvzip" / "tiny-niah" / "q2_dim16_sink16.pt"
    payload = record_fastkvzip("tiny-niah", ROOT / "models" / "tiny-niah", gate_file, (48, 160), (0.25, 0.5, 0.75), 4)
    (OUT / f"{payload['press']}.json").write_text(json.dumps(payload, separators=(",", ":")) + "\n")
    print(f"{payload['press']}.json: {len(payload['cases'])} cases", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
