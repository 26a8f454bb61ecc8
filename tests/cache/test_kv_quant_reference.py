"""Quantized KV storage against its references (issue #59), from the recordings of
``scripts/reference/record_kv_quant.py`` (``tests/fixtures/reference/kv_quant/``: KIVI's pure-PyTorch functions at
jy-yuan/KIVI 876b4d2, transformers 5.23's ``QuantizedCache`` layers with optimum-quanto 0.2.7 and HQQ 0.2.8):

* every scheme's dequantized keys and values are bit-identical to the reference's (float32 and bfloat16 inputs; the
  recording holds the sha256 of the reference's outputs, over dtype, shape and bytes);
* a cache layer fed a prefill then one token at a time hands attention, at every recorded step, exactly what
  transformers' ``QuantizedLayer.update`` returns (residual window, flush, re-quantization), on both backends.
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path

import pytest
import torch

from kvbench.cache.quant_schemes import hqq_roundtrip, kivi_keys, kivi_values, quanto_roundtrip
from kvbench.cache.quantized import QuantizedHeadwiseLayer, QuantizedPagedLayer
from kvbench.config import KVQuantConfig

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "reference" / "kv_quant"


@cache
def recording() -> tuple[dict, dict[str, str]]:
    meta = json.loads((FIXTURES / "kv_quant.json").read_text())
    return meta, meta["digests"]


def seeded(seed: int, dtype: torch.dtype, shape: tuple[int, ...] = (1, 2, 64, 64)) -> torch.Tensor:
    """The recorder's inputs (``seeded`` there): Gaussian states with outlier channels and one constant group."""
    generator = torch.Generator().manual_seed(seed)
    states = torch.randn(shape, generator=generator)
    states[..., 5] *= 8.0
    states[..., 17] += 4.0
    states[0, 0, :32, 3] = 0.75
    return states.to(dtype)


def digest(tensor: torch.Tensor) -> str:
    """The recorder's ``digest``: sha256 of dtype, shape and bytes (bfloat16 read as int16)."""
    flat = tensor.detach().contiguous().cpu()
    data = flat.view(torch.int16) if flat.dtype == torch.bfloat16 else flat
    return hashlib.sha256(f"{flat.dtype}{tuple(flat.shape)}".encode() + data.numpy().tobytes()).hexdigest()


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def numerics_cases() -> list[dict]:
    return [case for case in recording()[0]["cases"] if not case["name"].startswith("updates/")]


def ours(case: dict, inputs: torch.Tensor) -> torch.Tensor:
    bits, group = case["nbits"], case["group_size"]
    if case["scheme"] == "kivi" and case["side"] == "values":
        return kivi_values(inputs, group, bits)
    if case["scheme"] == "kivi":  # per head: tokens [S, D], groups of G consecutive positions
        heads = [kivi_keys(head, torch.arange(head.shape[0]) // group, bits) for head in inputs[0]]
        return torch.stack(heads)[None]
    roundtrip = quanto_roundtrip if case["scheme"] == "quanto" else hqq_roundtrip
    return roundtrip(inputs, bits, case["axis"], group)


def test_recording_covers_every_scheme_and_width() -> None:
    meta, _ = recording()
    covered = {(case["scheme"], case["nbits"]) for case in numerics_cases()}
    assert covered == {
        ("kivi", 2),
        ("kivi", 4),
        ("kivi", 8),
        ("quanto", 2),
        ("quanto", 4),
        ("hqq", 2),
        ("hqq", 4),
        ("hqq", 8),
    }
    assert meta["kivi_commit"].startswith("876b4d2")


@pytest.mark.parametrize("name", [case["name"] for case in numerics_cases()])
def test_dequantized_states_are_bit_identical(name: str) -> None:
    """Each reference's quantize -> dequantize on seeded states with outlier channels and a constant group."""
    meta, digests = recording()
    case = next(case for case in meta["cases"] if case["name"] == name)
    inputs = seeded(7, DTYPES[case["dtype"]])
    assert digest(inputs) == digests[f"input/{case['dtype']}"]  # the recorder's inputs
    got = ours(case, inputs)
    assert digest(got) == digests[name], f"{name}: {got.dtype} {tuple(got.shape)} differs from the reference"
    assert not torch.equal(got.float(), inputs.float())  # something was quantized


def update_cases() -> list[dict]:
    return [case for case in recording()[0]["cases"] if case["name"].startswith("updates/")]


@pytest.mark.parametrize("backend", ["torch", "paged"])
@pytest.mark.parametrize("name", [case["name"] for case in update_cases()])
def test_layer_hands_attention_what_transformers_returns(name: str, backend: str) -> None:
    """A prefill of 20 tokens then 11 single tokens (residual length 4): at each recorded step the layer's keys and
    values equal ``QuantizedLayer.update``'s return (full-precision residual and new token, the rest dequantized,
    re-quantized in full at every flush)."""
    meta, digests = recording()
    case = next(case for case in meta["cases"] if case["name"] == name)
    spec = KVQuantConfig(
        name="t",
        scheme=case["scheme"],
        nbits=case["nbits"],
        group_size=case["group_size"],
        residual_length=case["residual_length"],
        axis_key=case["axis"],
        axis_value=case["axis"],
    )
    layer = QuantizedHeadwiseLayer(spec) if backend == "torch" else QuantizedPagedLayer(spec, page_size=8, impl="torch")
    keys, values = seeded(11, torch.float32, (1, 2, 31, 32)), seeded(12, torch.float32, (1, 2, 31, 32))
    assert (digest(keys), digest(values)) == (digests["updates/keys"], digests["updates/values"])
    checked = 0
    for start, stop in [(0, case["prefill"])] + [(t, t + 1) for t in range(case["prefill"], keys.shape[2])]:
        layer.update(keys[:, :, start:stop], values[:, :, start:stop])
        if f"{name}/keys/{stop}" in digests:
            got_keys, got_values = layer.dense_kv()
            assert digest(got_keys[None]) == digests[f"{name}/keys/{stop}"], f"keys differ at step {stop}"
            assert digest(got_values[None]) == digests[f"{name}/values/{stop}"], f"values differ at step {stop}"
            checked += 1
        layer.attention_done()
    assert checked == 4
