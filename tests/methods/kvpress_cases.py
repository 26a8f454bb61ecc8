"""kvpress's recorded selections (``tests/fixtures/reference/kvpress/``, recorded with kvpress 0.5.5 by
``scripts/reference/record_kvpress.py``) replayed through kvbench: the tensor cases of one press, each compressed by
kvbench's eviction session at the budget kvpress keeps (``<n>/layer`` with kvpress's ``n_kept``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from kvbench.eviction.base import EvictionMethod
from tests.methods.helpers import prefill_one_layer

RECORDINGS = Path(__file__).resolve().parents[1] / "fixtures" / "reference" / "kvpress"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def recording(press: str) -> dict[str, Any]:
    """The recording of ``press`` (skips when the recordings are not in this checkout)."""
    path = RECORDINGS / f"{press}.json"
    if not path.is_file():
        pytest.skip(f"kvpress recordings not in this checkout ({path})")
    return json.loads(path.read_text())


def tensor_cases(press: str) -> Iterator[tuple[dict[str, Any], torch.Tensor, torch.Tensor]]:
    """Per tensor case: the case, its keys ``[H, S, D]`` in the case's dtype, and kvpress's scores ``[H, S]``."""
    from safetensors.torch import load_file

    data = recording(press)
    inputs = load_file(RECORDINGS / "inputs.safetensors")
    for case in data["cases"]:
        if case["kind"] != "tensor":
            continue
        length = case["inputs"].split("/S")[-1]
        keys = inputs[f"tensor/keys_S{length}"][0].to(DTYPES[case["dtype"]])
        (call,) = case["score_calls"]
        table = data["score_tables"][call["table"]]
        yield case, keys, torch.tensor(table["values"], dtype=torch.float32).reshape(table["shape"][-2:])


def check_selection(method: EvictionMethod, case: dict[str, Any], keys: torch.Tensor, scores: torch.Tensor) -> None:
    """kvbench's session keeps, per head, kvpress's kept positions (where scores tie at the cut, any valid top-n of
    the same scores: what kvpress's ``topk`` keeps among equals is unspecified)."""
    (n_kept,) = {n for row in case["n_kept"] for n in row}
    cache = prefill_one_layer(method, f"{n_kept}/layer", keys, torch.zeros_like(keys))
    layer = cache.headwise_layers[0]
    for head, reference in enumerate(case["kept"][0]):
        ours = sorted(layer.positions[head].tolist())
        if ours == sorted(reference):
            continue
        row = scores[head]
        evicted = sorted(set(range(row.numel())) - set(ours))
        assert len(ours) == n_kept and row[ours].min() >= row[evicted].max(), (case["inputs"], case["dtype"], head)
        assert sorted(row[ours].tolist()) == sorted(row[reference].tolist()), (case["inputs"], head)
