"""Read the recorded outputs of NVIDIA kvpress (``tests/fixtures/reference/kvpress/``) for parity tests.

The recordings were made by ``scripts/reference/record_kvpress.py`` in a virtual environment of its own (kvpress
0.5.5, transformers 5.2); nothing here imports kvpress. Format and per-press notes:
``tests/fixtures/reference/kvpress/README.md``.

Typical use in a parity test::

    recording = load_recording("KnormPress")
    for case in recording.cases:
        inputs = case_inputs(case)            # keys/values [1, H_kv, S, D] per layer, in the case's dtype
        kept = my_method_keeps(inputs[0]["keys"], case.compression_ratio)
        for layer, heads in enumerate(case.kept):
            scores = case.layer_scores(layer)  # float32 [H_kv, S] from kvpress's score()
            for head, positions in enumerate(heads):
                assert is_valid_topk(scores[head], kept[head])  # same set, or another top-k where scores tie
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

RECORDINGS = Path(__file__).resolve().parent / "fixtures" / "reference" / "kvpress"
INPUTS_FILE = RECORDINGS / "inputs.safetensors"
FORMAT_VERSION = 1
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class ScoreCall:
    """One call of a ScorerPress's ``score()`` during a case: which press, which layer, its float32 output."""

    press: str
    layer: int
    scores: torch.Tensor  # float32 [H_kv, S_scored]


@dataclass(frozen=True)
class RecordedCase:
    """One run of a press: inputs, dtype, ratio, the press's settings, and what it kept per layer and KV head."""

    press: str
    kind: str  # "tensor" (press.compress on bare keys/values) or "model" (the tiny Llama's prefill/decoding)
    inputs: str  # key prefix into inputs.safetensors: "tensor/S37" or "model/sdpa/float32/S128"
    dtype: str  # "float32" or "bfloat16"
    compression_ratio: float
    settings: dict
    kept: list[list[list[int]]]  # [layer][kv_head] -> kept absolute positions, in kvpress's cache order
    score_calls: tuple[ScoreCall, ...]

    @property
    def length(self) -> int:
        """Context length S of the case's inputs."""
        return int(self.inputs.rsplit("/S", 1)[1])

    def layer_scores(self, layer: int, press: str | None = None) -> torch.Tensor:
        """``[H_kv, S]`` float32 scores of the only ``score()`` call (of ``press``, if given) on ``layer``."""
        calls = [c for c in self.score_calls if c.layer == layer and (press is None or c.press == press)]
        if len(calls) != 1:
            raise ValueError(f"{self.press}: {len(calls)} score calls on layer {layer}; pick one from score_calls")
        return calls[0].scores


@dataclass(frozen=True)
class Recording:
    """One ``<press>.json``: its cases, the versions that recorded it, and the checksums of the inputs it used."""

    press: str
    note: str
    versions: dict
    meta: dict
    inputs_checksums: dict
    cases: tuple[RecordedCase, ...]


def recorded_presses() -> list[str]:
    """Names of every recording (file stems), sorted."""
    return sorted(path.stem for path in RECORDINGS.glob("*.json"))


@cache
def load_recording(press: str) -> Recording:
    """Parse ``<press>.json``; a name that was not recorded raises ``ValueError`` listing the recorded ones."""
    path = RECORDINGS / f"{press}.json"
    if not path.is_file():
        raise ValueError(f"no kvpress recording {press!r}; recorded: {recorded_presses()}")
    raw = json.loads(path.read_text())
    if raw["format_version"] != FORMAT_VERSION:
        raise ValueError(f"{path.name}: format_version {raw['format_version']}, this loader reads {FORMAT_VERSION}")
    tables = [torch.tensor(t["values"], dtype=torch.float32).reshape(t["shape"]) for t in raw["score_tables"]]
    cases = tuple(
        RecordedCase(
            press=raw["press"],
            kind=c["kind"],
            inputs=c["inputs"],
            dtype=c["dtype"],
            compression_ratio=c["compression_ratio"],
            settings=c["settings"],
            kept=c["kept"],
            score_calls=tuple(ScoreCall(s["press"], s["layer"], tables[s["table"]]) for s in c["score_calls"]),
        )
        for c in raw["cases"]
    )
    return Recording(raw["press"], raw["note"], raw["versions"], raw["recording"], raw["inputs_checksums"], cases)


@cache
def _stored_inputs() -> dict[str, torch.Tensor]:
    return load_file(INPUTS_FILE)


def stored_input(name: str) -> torch.Tensor:
    """One tensor of ``inputs.safetensors`` (a copy), or ``"weights"``: all weights flattened in name order."""
    if name == "weights":
        weights = tiny_llama_weights(torch.bfloat16)
        return torch.cat([weights[key].reshape(-1) for key in sorted(weights)])
    return _stored_inputs()[name].clone()


def inputs_meta() -> dict:
    """The recording metadata of ``inputs.safetensors`` (model config, seeds, lengths, versions)."""
    with safe_open(str(INPUTS_FILE), framework="pt") as handle:
        return json.loads(handle.metadata()["recording"])


def case_inputs(case: RecordedCase) -> list[dict[str, torch.Tensor]]:
    """Per layer, what kvpress's hook saw for ``case``, in the case's dtype.

    ``tensor`` cases: one layer, ``keys``/``values`` ``[1, H_kv, S, D]`` (the stored float32 tensors cast with
    ``.to(dtype)``, as the recorder did). ``model`` cases: per layer ``hidden_states [1, S, hidden]`` (the attention
    module's input, after ``input_layernorm``), ``keys`` (post-RoPE) and ``values`` ``[1, H_kv, S, D]`` of the cache
    before compression, plus ``input_ids [1, S]`` on every layer.
    """
    dtype = DTYPES[case.dtype]
    if case.kind == "tensor":
        return [
            {
                "keys": stored_input(f"tensor/keys_S{case.length}").to(dtype),
                "values": stored_input(f"tensor/values_S{case.length}").to(dtype),
            }
        ]
    layers = []
    for layer in range(inputs_meta()["model_config"]["num_hidden_layers"]):
        prefix = f"{case.inputs}/layer{layer}/"
        tensors = {name: stored_input(prefix + name) for name in ("hidden_states", "keys", "values")}
        tensors["input_ids"] = stored_input(f"{case.inputs}/input_ids")
        layers.append(tensors)
    return layers


def tiny_llama_weights(dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """The tiny random Llama's state dict (bfloat16-representable numbers), cast to ``dtype``."""
    stored = _stored_inputs()
    return {name[len("weights/") :]: t.to(dtype) for name, t in stored.items() if name.startswith("weights/")}


def regenerate_tensor_inputs() -> dict[str, torch.Tensor]:
    """The seeded key/value tensors, regenerated from the recorded seed (one CPU generator, keys then values per S)."""
    meta = inputs_meta()
    shape = meta["tensor_shape"]
    generator = torch.Generator().manual_seed(meta["seeds"]["tensor"])
    out = {}
    for length in shape["lengths"]:
        size = (shape["batch"], shape["kv_heads"], length, shape["head_dim"])
        out[f"tensor/keys_S{length}"] = torch.randn(size, generator=generator)
        out[f"tensor/values_S{length}"] = torch.randn(size, generator=generator)
    return out


def checksum(tensor: torch.Tensor) -> dict:
    """The recorder's checksum: shape, dtype, sum, first four values, sha256 (16 hex) of the raw bytes."""
    data = tensor.detach().contiguous()
    flat = data.view(-1)
    return {
        "shape": list(data.shape),
        "dtype": str(data.dtype).replace("torch.", ""),
        "sum": float(flat.double().sum()),
        "first": [float(x) for x in flat[:4].double()],
        "sha256_16": hashlib.sha256(flat.view(torch.uint8).numpy().tobytes()).hexdigest()[:16],
    }


def kvpress_n_kept(length: int, compression_ratio: float) -> int:
    """kvpress's budget (``kvpress.utils.compute_n_kept``): ``max(1, int(S * (1 - ratio)))``, 0 when ratio >= 1."""
    if compression_ratio >= 1.0:
        return 0
    return max(1, int(length * (1 - compression_ratio)))


def is_valid_topk(scores: torch.Tensor, kept: list[int] | torch.Tensor) -> bool:
    """Whether ``kept`` (distinct positions) is one of the top-k sets of ``scores [S]`` for k = len(kept).

    True when every kept score is >= every evicted score: the same set as kvpress's, or another one that differs only
    among tied scores.
    """
    kept = torch.as_tensor(kept, dtype=torch.long)
    if kept.numel() != kept.unique().numel():
        return False
    if kept.numel() in (0, scores.numel()):
        return True
    evicted = torch.ones(scores.numel(), dtype=torch.bool)
    evicted[kept] = False
    return bool(scores[kept].min() >= scores[evicted].max())


def boundary_tie(scores: torch.Tensor, k: int) -> bool:
    """Whether the k-th and (k+1)-th largest of ``scores [S]`` are equal: kvpress's kept set there was chosen by
    ``torch.topk``'s tie-breaking, and only ``is_valid_topk`` (not set equality) is a fair comparison."""
    if k <= 0 or k >= scores.numel():
        return False
    ordered = scores.sort(descending=True).values
    return bool(ordered[k - 1] == ordered[k])


def recorded_kept_values(press: str) -> list[list[torch.Tensor]]:
    """Per case of a merging press's recording (``MergingPress_*``, ``CAMPress_*``), per layer, the values the
    compressed cache holds ``[H_kv, n, D]`` (float32, merged values included), in the order of the case's ``kept``
    (kvpress's cache order)."""
    raw = json.loads((RECORDINGS / f"{press}.json").read_text())
    tables = [torch.tensor(t["values"], dtype=torch.float32).reshape(t["shape"]) for t in raw["value_tables"]]
    return [[tables[index] for index in case["kept_values"]] for case in raw["cases"]]
