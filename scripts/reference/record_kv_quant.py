"""Record the quantized-KV references kvbench's ``kv_quant`` reproduces (issue #59): KIVI's quantization functions and
transformers' ``QuantizedCache`` (quanto and HQQ backends), numerics and greedy tokens.

This script runs the references themselves outside kvbench, in a virtual environment of its own that adds
optimum-quanto and HQQ to kvbench's packages (transformers 5.23, CPU torch); it never imports kvbench::

    python -m venv --system-site-packages /work/venvs/i59-quant
    /work/venvs/i59-quant/bin/pip install optimum-quanto==0.2.7
    /work/venvs/i59-quant/bin/pip install --no-build-isolation hqq==0.2.8.post1
    git clone https://github.com/jy-yuan/KIVI /tmp/kivi && git -C /tmp/kivi checkout 876b4d2d
    OMP_NUM_THREADS=1 /work/venvs/i59-quant/bin/python scripts/reference/record_kv_quant.py --kivi /tmp/kivi \
        --tiny models/tiny-niah --smollm2 ~/.cache/kvbench/models/SmolLM2-135M-Instruct.Q4_1-b179c9523d0e6a0f \
        --out tests/fixtures/reference/kv_quant

What runs:

* KIVI: ``quant/new_pack.py`` imported from the clone (it imports triton at the top; its pure-PyTorch functions need
  no GPU): ``quant_and_pack_kcache`` -> ``unpack_and_dequant_kcache`` (keys, per channel, groups of ``G`` tokens)
  and ``quant_and_pack_vcache`` -> ``unpack_and_dequant_vcache`` (values, per token, groups of ``G`` channels).
* transformers' ``QuantoQuantizedLayer`` / ``HQQQuantizedLayer``: ``_quantize`` then ``_dequantize`` of one tensor,
  and a layer's ``update`` sequence (a prefill, then one token at a time: what each update returns, i.e. what
  attention reads, at each step).
* ``generate`` (greedy) of the tiny model and of SmolLM2-135M (float32, CPU, sdpa) with a ``QuantizedCache``.

Inputs are seeded (:func:`seeded`: the tests regenerate them); ``kv_quant.json`` holds each case's settings, the
sha256 of every input and output tensor (:func:`digest`: dtype, shape and bytes, so a match is bit-identity), the
package versions and, for generation, the prompt ids and the greedy tokens.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as metadata
import importlib.util
import json
import subprocess
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.cache_utils import HQQQuantizedLayer, QuantizedCache, QuantoQuantizedLayer

#: The update sequence's steps whose returned states are stored (after the prefill of 20; flushes at 24 and 28).
RECORDED_STEPS = (21, 24, 25, 31)
#: Tensor shape of the numerics cases: ``[1, H, S, D]``.
SHAPE = (1, 2, 64, 64)


def digest(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's dtype, shape and bytes (bfloat16 read as int16): what the tests compare."""
    flat = tensor.detach().contiguous().cpu()
    data = flat.view(torch.int16) if flat.dtype == torch.bfloat16 else flat
    header = f"{flat.dtype}{tuple(flat.shape)}".encode()
    return hashlib.sha256(header + data.numpy().tobytes()).hexdigest()


def seeded(seed: int, dtype: torch.dtype, shape: tuple[int, ...] = SHAPE) -> torch.Tensor:
    """Gaussian states with a few outlier channels (as keys have), then cast to ``dtype``; channel 3 of head 0 is
    constant over the first 32 tokens (a group of zero range)."""
    generator = torch.Generator().manual_seed(seed)
    states = torch.randn(shape, generator=generator)
    states[..., 5] *= 8.0
    states[..., 17] += 4.0
    states[0, 0, :32, 3] = 0.75
    return states.to(dtype)


def load_kivi(root: Path):
    spec = importlib.util.spec_from_file_location("kivi_new_pack", root / "quant" / "new_pack.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def layer(backend: str, nbits: int, axis_key: int, axis_value: int, group: int, residual: int):
    cls = QuantoQuantizedLayer if backend == "quanto" else HQQQuantizedLayer
    return cls(nbits=nbits, axis_key=axis_key, axis_value=axis_value, q_group_size=group, residual_length=residual)


def record_numerics(kivi, tensors: dict[str, str], cases: list[dict]) -> None:
    for dtype_name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        inputs = seeded(7, dtype)
        tensors[f"input/{dtype_name}"] = digest(inputs)
        for bits in (2, 4, 8):
            code, scale, mn = kivi.quant_and_pack_kcache(inputs.clone(), 32, bits)
            keys = kivi.unpack_and_dequant_kcache(code, scale, mn, 32, bits)
            code, scale, mn = kivi.quant_and_pack_vcache(inputs.clone(), 32, bits)
            values = kivi.unpack_and_dequant_vcache(code, scale, mn, 32, bits)
            for side, out in (("keys", keys), ("values", values)):
                name = f"kivi/{side}/{dtype_name}/{bits}"
                tensors[name] = digest(out)
                cases.append(
                    {"name": name, "scheme": "kivi", "side": side, "dtype": dtype_name, "nbits": bits, "group_size": 32}
                )
        settings = [("quanto", b, a, g) for b in (2, 4) for a in (0, -1) for g in (32, 64)]
        settings += [("hqq", b, a, g) for b in (2, 4, 8) for a in (0, 1) for g in (32, 64)]
        for backend, bits, axis, group in settings:
            quant = layer(backend, bits, axis, axis, group, 128)
            quant.lazy_initialization(inputs, inputs)
            out = quant._dequantize(quant._quantize(inputs.contiguous(), axis=axis))
            name = f"{backend}/{dtype_name}/{bits}/{axis}/{group}"
            tensors[name] = digest(out)
            cases.append(
                {"name": name, "scheme": backend, "dtype": dtype_name, "nbits": bits, "axis": axis, "group_size": group}
            )


def record_updates(tensors: dict[str, str], cases: list[dict]) -> None:
    """A layer's update sequence: a 20-token prefill, then 11 one-token steps, residual length 4."""
    states = seeded(11, torch.float32, (1, 2, 31, 32))
    values = seeded(12, torch.float32, (1, 2, 31, 32))
    tensors["updates/keys"], tensors["updates/values"] = digest(states), digest(values)
    for backend, bits, axis, group in (
        ("quanto", 4, 0, 32),
        ("quanto", 2, 0, 32),
        ("hqq", 4, 1, 32),
        ("hqq", 8, 0, 64),
    ):
        quant = layer(backend, bits, axis, axis, group, 4)
        steps = [(0, 20)] + [(t, t + 1) for t in range(20, 31)]
        name = f"updates/{backend}/{bits}/{axis}/{group}"
        for start, stop in steps:
            keys, vals = quant.update(states[:, :, start:stop].contiguous(), values[:, :, start:stop].contiguous())
            if stop in RECORDED_STEPS:  # the prefill returns its own states
                tensors[f"{name}/keys/{stop}"], tensors[f"{name}/values/{stop}"] = digest(keys), digest(vals)
        cases.append(
            {
                "name": name,
                "scheme": backend,
                "nbits": bits,
                "axis": axis,
                "group_size": group,
                "residual_length": 4,
                "prefill": 20,
                "steps": 11,
            }
        )


def record_generation(model_dir: str, label: str, prompt_ids: list[int], settings: list[dict], new_tokens: int) -> list:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    records = []
    for setting in settings:
        cache = QuantizedCache(config=model.config, **setting)
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt_ids]),
                max_new_tokens=new_tokens,
                do_sample=False,
                past_key_values=cache,
                num_beams=1,
                top_p=None,
                top_k=None,
                temperature=None,
            )
        tokens = out[0, len(prompt_ids) :].tolist()
        records.append({"model": label, "settings": setting, "prompt_ids": prompt_ids, "tokens": tokens})
        print(label, setting, tokens)
    return records


#: A niah_multivalue prompt of kvbench's tiny_niah generator (``build_instance("niah_multivalue", 12, 40.0, "kvq")``:
#: four needles, the answer enumerates them), so the tiny model's greedy answer runs for 15 tokens.
TINY_PROMPT = (
    "some special magic numbers are hidden within the following text . make sure to memorize them . i "
    "will quiz you about the numbers afterwards . together flows other reads sings . one of the special "
    "magic numbers is gefeka first 97 60 . reads gentle garden book friend when slowly road tower short . "
    "one of the special magic numbers is gefeka second 34 10 . before each early walks by goes rises "
    "alone . where sea story blue fast into bright . falls after along rises farmer teacher grass . one "
    "of the special magic numbers is gefeka third 39 16 . short cold never only but without . dark here "
    "every other blue . bridge child rain another at letter . voice high carries and . soft lake winter "
    "tree . away road also year looks loud city . one of the special magic numbers is gefeka fourth 96 21 "
    ". looks again late that over . what are all the special magic numbers for gefeka ? the special magic "
    "numbers are gefeka first"
)


def tiny_prompt(model_dir: str) -> list[int]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return tokenizer(TINY_PROMPT, add_special_tokens=False)["input_ids"]


def smollm2_prompt(model_dir: str) -> list[int]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    text = (
        "Paris is the capital of France. Its river is the Seine, and its best known tower was built by Gustave "
        "Eiffel for the 1889 World's Fair. "
    ) * 4 + "Question: who built the tower, and for which event?"
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer(chat, add_special_tokens=False)["input_ids"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kivi", type=Path, required=True)
    parser.add_argument("--tiny", required=True)
    parser.add_argument("--smollm2", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tensors: dict[str, str] = {}
    cases: list[dict] = []
    record_numerics(load_kivi(args.kivi), tensors, cases)
    record_updates(tensors, cases)
    tiny_settings = [
        {"backend": "quanto", "nbits": 4, "q_group_size": 32, "residual_length": 2, "axis_key": 0, "axis_value": 0},
        {"backend": "quanto", "nbits": 2, "q_group_size": 32, "residual_length": 2, "axis_key": 0, "axis_value": 0},
        {"backend": "hqq", "nbits": 4, "q_group_size": 32, "residual_length": 2, "axis_key": 1, "axis_value": 1},
        {"backend": "hqq", "nbits": 8, "q_group_size": 64, "residual_length": 2, "axis_key": 0, "axis_value": 0},
    ]
    smol_settings = [
        {"backend": "quanto", "nbits": 4, "q_group_size": 64, "residual_length": 16, "axis_key": 0, "axis_value": 0},
        {"backend": "hqq", "nbits": 4, "q_group_size": 64, "residual_length": 16, "axis_key": 1, "axis_value": 1},
    ]
    generation = record_generation(args.tiny, "tiny", tiny_prompt(args.tiny), tiny_settings, 16)
    generation += record_generation(
        args.smollm2, "smollm2-135m-instruct", smollm2_prompt(args.smollm2), smol_settings, 16
    )
    kivi_commit = subprocess.run(["git", "-C", str(args.kivi), "rev-parse", "HEAD"], capture_output=True, text=True)
    meta = {
        "format_version": 1,
        "recorder": "scripts/reference/record_kv_quant.py",
        "versions": {name: metadata.version(name) for name in ("torch", "transformers", "optimum-quanto", "hqq")},
        "kivi_commit": kivi_commit.stdout.strip(),
        "cases": cases,
        "digests": tensors,
        "generation": generation,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kv_quant.json").write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    main()
