"""Record what NVIDIA kvpress keeps, for kvbench's parity tests (issues #41 and #43).

Size: one self-contained script (input builders, the kept-index tracker, every press's settings, the writers) so that
the recordings can be regenerated from this single file inside kvpress's own virtual environment.

This script runs ONLY inside a virtual environment of its own with kvpress installed (kvpress 0.5.x pins
transformers < 5.3, kvbench needs 5.23); it never imports kvbench and kvbench never imports it. Reproduce with::

    python -m venv --system-site-packages /work/venvs/kvpress      # reuses the system's CPU torch (kvpress: torch<3)
    /work/venvs/kvpress/bin/pip install kvpress==0.5.5             # pulls transformers 5.2.0 into the venv
    OMP_NUM_THREADS=1 /work/venvs/kvpress/bin/python scripts/reference/record_kvpress.py \
        --out tests/fixtures/reference/kvpress [--only KnormPress,RandomPress]

What it records (format: ``tests/fixtures/reference/kvpress/README.md``):

* ``inputs.safetensors``: the seeded inputs every press sees: random key/value tensors ``[1, H_kv, S, D]`` (float32;
  the bfloat16 cases use ``.to(torch.bfloat16)`` of them), the tiny random Llama's weights (bfloat16-representable,
  so the float32 and bfloat16 models hold the same numbers) and, per (attention implementation, dtype, length), the
  ``input_ids`` and what each layer's attention hook saw: ``hidden_states [1, S, hidden]``, ``keys``/``values``
  ``[1, H_kv, S, D]`` (the cache before compression).
* ``<Press>.json`` per press: for every case (inputs, dtype, compression ratio, settings), per layer the KEPT token
  positions per KV head, in kvpress's cache order, and the scores ``score()`` returned (float32), so a consumer can
  check that its kept set is a valid top-k of the same scores where scores tie.

How kept positions are recovered: a forward hook registered before the press's hook snapshots the layer's cache
(keys, and the absolute position of every row); a hook registered after it reads the compressed cache and matches each
kept key row to the snapshot (exact equality; a row that matches twice is an error). Presses that mask rather than
remove (AdaKV, CriticalAdaKV) leave the cache whole and set ``module.masked_key_indices``; kept = not masked.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.metadata as metadata
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import kvpress
import torch
from kvpress.presses.scorer_press import ScorerPress
from safetensors.torch import save_file
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

# The fixtures' reader defines the checksum format; it imports only torch and safetensors (never kvbench).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.reference_recordings import checksum

FORMAT_VERSION = 1
RATIOS = (0.25, 0.5, 0.75, 0.875)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

# ------------------------------------------------------------------------------------------------ seeded inputs
TENSOR_SEED = 20260
TENSOR_HEADS, TENSOR_DIM = 2, 16
TENSOR_LENGTHS = (16, 37, 64, 128, 300)  # stored; a press records DEFAULT_TENSOR_LENGTHS unless it says
DEFAULT_TENSOR_LENGTHS = (16, 37, 64, 128)

MODEL_SEED = 41
INPUT_IDS_SEED = 43
MODEL_LENGTHS = (48, 128)  # 48 < SnapKV/PyramidKV's default window of 64: their short-context branch
MODEL_CONFIG = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    initializer_range=0.1,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
# Global torch seed set before every case: presses that draw from the global generator (LeverageScorePress's
# Gaussian sketch, RandomPress(seed=None)) draw after torch.manual_seed(GLOBAL_SEED).
GLOBAL_SEED = 1234


def tensor_inputs() -> dict[str, torch.Tensor]:
    """``keys_S{S}``/``values_S{S}`` float32 ``[1, H_kv, S, D]`` from one CPU generator seeded TENSOR_SEED."""
    generator = torch.Generator().manual_seed(TENSOR_SEED)
    out = {}
    for length in TENSOR_LENGTHS:
        shape = (1, TENSOR_HEADS, length, TENSOR_DIM)
        out[f"keys_S{length}"] = torch.randn(shape, generator=generator)
        out[f"values_S{length}"] = torch.randn(shape, generator=generator)
    return out


def build_model_weights() -> dict[str, torch.Tensor]:
    """The tiny Llama's state dict, initialised under torch.manual_seed(MODEL_SEED) and rounded to bfloat16."""
    torch.manual_seed(MODEL_SEED)
    model = LlamaForCausalLM(LlamaConfig(**MODEL_CONFIG))
    return {name: tensor.detach().to(torch.bfloat16).contiguous() for name, tensor in model.state_dict().items()}


def flat_weights(weights: dict[str, torch.Tensor]) -> torch.Tensor:
    """All weights flattened and concatenated in name order (what ``inputs_checksums["weights"]`` covers)."""
    return torch.cat([weights[name].reshape(-1) for name in sorted(weights)])


def load_model(weights: dict[str, torch.Tensor], dtype: torch.dtype, attn: str) -> LlamaForCausalLM:
    model = LlamaForCausalLM(LlamaConfig(**MODEL_CONFIG, attn_implementation=attn))
    state = {name: tensor.to(dtype) for name, tensor in weights.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("lm_head" in name for name in missing), (missing, unexpected)
    return model.to(dtype).eval()


def input_ids_for(length: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(INPUT_IDS_SEED + length)
    return torch.randint(0, MODEL_CONFIG["vocab_size"], (1, length), generator=generator)


# ------------------------------------------------------------------------------------------------ kept-index tracker
def match_rows(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """Index into ``before [L, D]`` of every row of ``after [L', D]`` (exact equality, each row matched once)."""
    equal = (after[:, None, :] == before[None, :, :]).all(-1)
    counts = equal.sum(-1)
    if not bool((counts == 1).all()):
        raise RuntimeError(f"ambiguous key match: counts {counts.tolist()}")
    return equal.float().argmax(-1)


class Tracker:
    """Follows every cache row's absolute position through the press's hook, per layer and KV head."""

    def __init__(self, model: LlamaForCausalLM):
        self.layers = model.model.layers
        self.positions: dict[int, list[torch.Tensor]] = {}
        self.snapshots: dict[int, dict[str, torch.Tensor]] = {}
        self.prefill_inputs: dict[int, dict[str, torch.Tensor]] = {}
        self.masked: dict[int, list[list[int]]] = {}
        self.handles: list[Any] = []
        self.next_positions: torch.Tensor | None = None  # absolute positions of the next forward's tokens

    def attach_before(self) -> None:
        for layer in self.layers:
            self.handles.append(layer.self_attn.register_forward_hook(self._before, with_kwargs=True))
            layer.self_attn.masked_key_indices = None

    def attach_after(self) -> list[Any]:
        """Register the after-hooks (call inside the press's context, so they run after its hooks)."""
        handles = [layer.self_attn.register_forward_hook(self._after, with_kwargs=True) for layer in self.layers]
        self.handles.extend(handles)
        return handles

    def detach(self, handles: list[Any] | None = None) -> None:
        """Remove ``handles`` (default: every hook this tracker registered)."""
        for handle in self.handles if handles is None else handles:
            handle.remove()
        self.handles = [] if handles is None else [h for h in self.handles if h not in handles]

    def _before(self, module, args, kwargs, output):
        idx = module.layer_idx
        cache_layer = kwargs["past_key_values"].layers[idx]
        keys = cache_layer.keys.detach().clone()
        new = self.next_positions if self.next_positions is not None else kwargs["cache_position"].detach().clone()
        heads = keys.shape[1]
        old = self.positions.get(idx, [torch.zeros(0, dtype=torch.long)] * heads)
        self.positions[idx] = [torch.cat([old[h], new]) for h in range(heads)]
        assert all(len(p) == keys.shape[2] for p in self.positions[idx])
        self.snapshots[idx] = {"keys": keys}
        if idx not in self.prefill_inputs:
            self.prefill_inputs[idx] = {
                "hidden_states": kwargs["hidden_states"].detach().clone(),
                "keys": keys,
                "values": cache_layer.values.detach().clone(),
            }
        return output

    def _after(self, module, args, kwargs, output):
        idx = module.layer_idx
        keys = kwargs["past_key_values"].layers[idx].keys
        before = self.snapshots[idx]["keys"]
        if keys.shape[2] != before.shape[2]:
            self.positions[idx] = [
                self.positions[idx][h][match_rows(before[0, h], keys[0, h])] for h in range(keys.shape[1])
            ]
        masked = getattr(module, "masked_key_indices", None)
        if masked is not None:
            _, head_idx, seq_idx = masked
            per_head = [sorted(seq_idx[head_idx == h].tolist()) for h in range(keys.shape[1])]
            self.masked[idx] = per_head
            module.masked_key_indices = None
        return output

    def kept(self) -> list[list[list[int]]]:
        """``[layer][kv_head] -> kept positions`` (cache order; masked rows removed)."""
        out = []
        for idx in sorted(self.positions):
            heads = []
            for h, positions in enumerate(self.positions[idx]):
                masked = set(self.masked.get(idx, [[]] * len(self.positions[idx]))[h])
                heads.append([int(p) for i, p in enumerate(positions.tolist()) if i not in masked])
            out.append(heads)
        return out


# ------------------------------------------------------------------------------------------------ score capture
def scorer_presses(press: Any) -> list[ScorerPress]:
    """Every ScorerPress inside ``press`` (itself, or the ``press``/``base_press``/``presses`` it wraps)."""
    found, stack, seen = [], [press], set()
    while stack:
        item = stack.pop()
        if id(item) in seen or item is None:
            continue
        seen.add(id(item))
        if isinstance(item, ScorerPress):
            found.append(item)
        for name in (
            "press",
            "base_press",
            "prefilling_press",
            "decoding_press",
            "_leverage_press",
            "_non_causal_press",
        ):
            stack.append(getattr(item, name, None))
        stack.extend(getattr(item, "presses", []) or [])
    return found


def _recording_score(original: Callable, name: str, calls: list[dict]) -> Callable:
    def recording(module, *args, **kwargs):
        scores = original(module, *args, **kwargs)
        calls.append({"press": name, "layer": module.layer_idx, "scores": scores.detach().float().clone()})
        return scores

    return recording


def capture_scores(press: Any, calls: list[dict]) -> None:
    """Wrap the ``score`` of every ScorerPress in ``press`` (instance attribute) to record each call's output."""
    for scorer in scorer_presses(press):
        original = scorer.score

        scorer.score = _recording_score(original, type(scorer).__name__, calls)


# ------------------------------------------------------------------------------------------------ running cases
def run_model_prefill(model, press, input_ids) -> tuple[Tracker, list[dict]]:
    """kvpress's pipeline prefill: ``model.model(input_ids, past_key_values=DynamicCache())`` under the press."""
    tracker, calls = Tracker(model), []
    capture_scores(press, calls)
    tracker.attach_before()
    try:
        torch.manual_seed(GLOBAL_SEED)
        with torch.no_grad(), press(model):
            tracker.attach_after()
            model.model(input_ids=input_ids, past_key_values=DynamicCache())
    finally:
        tracker.detach()
    return tracker, calls


def run_model_decoding(model, press, input_ids, decode_ids) -> tuple[Tracker, list[dict]]:
    """kvpress's pipeline with a decoding press: the context prefilled (under the press only for a
    PrefillDecodingPress, in a context of its own), then under the press a question of QUESTION_TOKENS tokens in one
    forward and single tokens after it (teacher-forced ``decode_ids`` in place of greedy ones), each call given only
    ``position_ids`` as ``KVPressTextGenerationPipeline.generate_answer`` does."""
    tracker, calls = Tracker(model), []
    capture_scores(press, calls)
    cache = DynamicCache()
    tracker.attach_before()
    try:
        torch.manual_seed(GLOBAL_SEED)
        with torch.no_grad():
            tracker.next_positions = torch.arange(input_ids.shape[1])
            if isinstance(press, kvpress.PrefillDecodingPress):
                with press(model):
                    after = tracker.attach_after()
                    model.model(input_ids=input_ids, past_key_values=cache)
                tracker.detach(after)
            else:
                model.model(input_ids=input_ids, past_key_values=cache)
            with press(model):
                tracker.attach_after()
                start = input_ids.shape[1]
                chunks = [(0, QUESTION_TOKENS)] + [(i, i + 1) for i in range(QUESTION_TOKENS, decode_ids.shape[1])]
                for lo, hi in chunks:
                    positions = torch.arange(start + lo, start + hi)
                    tracker.next_positions = positions
                    model.model(input_ids=decode_ids[:, lo:hi], past_key_values=cache, position_ids=positions[None])
    finally:
        tracker.detach()
    return tracker, calls


def run_tensor(press, keys, values) -> tuple[list[list[list[int]]], list[dict]]:
    """``press.compress`` on bare tensors with a stand-in module (``head_dim``, ``layer_idx`` only)."""
    calls: list[dict] = []
    capture_scores(press, calls)
    module = SimpleNamespace(head_dim=keys.shape[-1], layer_idx=0)
    torch.manual_seed(GLOBAL_SEED)
    with torch.no_grad():
        new_keys, _ = press.compress(module, None, keys, values, None, {})
    kept = [[int(i) for i in match_rows(keys[0, h], new_keys[0, h]).tolist()] for h in range(keys.shape[1])]
    return [kept], calls


# ------------------------------------------------------------------------------------------------ writers
def float32_list(tensor: torch.Tensor) -> list:
    """Nested lists of the shortest decimal that round-trips each float32 (non-finite as JSON Infinity/NaN)."""
    import numpy as np

    def convert(array):
        if array.ndim == 1:
            return [float(str(value)) for value in array]
        return [convert(row) for row in array]

    return convert(tensor.detach().float().numpy().astype(np.float32))


class ScoreTables:
    """Score tensors deduplicated by content: cases refer to them by index."""

    def __init__(self):
        self.tables: list[dict] = []
        self.index: dict[str, int] = {}

    def add(self, scores: torch.Tensor) -> int:
        scores = scores[0] if scores.dim() == 3 else scores
        key = hashlib.sha256(scores.contiguous().numpy().tobytes() + str(tuple(scores.shape)).encode()).hexdigest()
        if key not in self.index:
            self.index[key] = len(self.tables)
            self.tables.append({"shape": list(scores.shape), "values": float32_list(scores)})
        return self.index[key]


def settings_of(press: Any) -> dict:
    """The press's dataclass fields, wrapped presses as nested dicts with their class name."""
    out: dict[str, Any] = {"class": type(press).__name__}
    for field in dataclasses.fields(press):
        if not field.init:
            continue
        value = getattr(press, field.name)
        if dataclasses.is_dataclass(value):
            value = settings_of(value)
        elif isinstance(value, (list, tuple)) and value and dataclasses.is_dataclass(value[0]):
            value = [settings_of(v) for v in value]
        elif not isinstance(value, (int, float, str, bool, type(None))):
            value = repr(value)
        out[field.name] = value
    return out


# ------------------------------------------------------------------------------------------------ the presses
@dataclasses.dataclass
class Spec:
    """One press recording: ``make(ratio)`` builds the press; where it runs and with which attention."""

    name: str
    make: Callable[[float], Any]
    tensor: bool = False  # also on bare key/value tensors (presses that read only keys/values)
    tensor_lengths: tuple = DEFAULT_TENSOR_LENGTHS
    model_lengths: tuple = MODEL_LENGTHS
    model: bool = True
    attn: str = "sdpa"
    ratios: tuple = RATIOS
    decoding: bool = False
    note: str = ""


QFILTER_SEED = 4303


def seeded_qfilters() -> torch.Tensor:
    """``[layers, H_kv, D]`` bfloat16 stand-ins for the Hub's Q-Filters (``nthngdy/<model>_qfilt``: not reachable)."""
    shape = (MODEL_CONFIG["num_hidden_layers"], MODEL_CONFIG["num_key_value_heads"], MODEL_CONFIG["head_dim"])
    return torch.randn(shape, generator=torch.Generator().manual_seed(QFILTER_SEED)).to(torch.bfloat16)


@dataclasses.dataclass
class SeededQFilterPress(kvpress.QFilterPress):
    """kvpress's QFilterPress with the filters set from ``seeded_qfilters()`` where it would download them; cast to
    the model's dtype as ``QFilterPress.post_init_from_model`` does (kvpress's own tests substitute filters too)."""

    def post_init_from_model(self, model):
        self.q_filters = seeded_qfilters().to(model.dtype)


def specs() -> list[Spec]:
    P = kvpress
    decoding_note = (
        f"DecodingPress: context prefilled uncompressed; then a {QUESTION_TOKENS}-token question in one forward and "
        "single tokens (ids in inputs decode_ids/S{S}); kept = positions in the cache after the last step"
    )
    return [
        # Issue #41: the two baselines.
        Spec("KnormPress", lambda r: P.KnormPress(compression_ratio=r), tensor=True),
        Spec("RandomPress", lambda r: P.RandomPress(compression_ratio=r, seed=0), tensor=True),
        Spec(
            "RandomPress_seed_None",
            lambda r: P.RandomPress(compression_ratio=r),
            tensor=True,
            note=f"seed=None: draws from torch's global CPU generator, here after torch.manual_seed({GLOBAL_SEED})",
        ),
        # Issue #43: scorers.
        Spec("ExpectedAttentionPress", lambda r: P.ExpectedAttentionPress(compression_ratio=r)),
        Spec("KeyDiffPress", lambda r: P.KeyDiffPress(compression_ratio=r), tensor=True),
        Spec(
            "LagKVPress",
            lambda r: P.LagKVPress(compression_ratio=r),
            tensor=True,
            tensor_lengths=(37, 128, 300),
            note="defaults (n_sink 4, lag_size 128): only S >= 260 takes the lag path; shorter S get the ramp scores",
        ),
        Spec("LagKVPress_lag16", lambda r: P.LagKVPress(compression_ratio=r, lag_size=16), tensor=True),
        Spec("NonCausalAttnPress", lambda r: P.NonCausalAttnPress(compression_ratio=r, chunk_size=32)),
        Spec(
            "LeverageScorePress",
            lambda r: P.LeverageScorePress(compression_ratio=r),
            note=f"Gaussian sketch from torch's global CPU generator, drawn after torch.manual_seed({GLOBAL_SEED})",
        ),
        Spec(
            "CompactorPress",
            lambda r: P.CompactorPress(compression_ratio=r, chunk_size=32),
            note=f"its leverage part draws from torch's global CPU generator after torch.manual_seed({GLOBAL_SEED})",
        ),
        Spec("CURPress", lambda r: P.CURPress(compression_ratio=r), tensor=True),
        Spec(
            "QFilterPress_seeded_filters",
            lambda r: SeededQFilterPress(compression_ratio=r),
            note="filters from inputs 'qfilters' [layers, H_kv, D] (seeded, bfloat16) in place of the Hub download",
        ),
        # kvpress's own versions of methods kvbench already has.
        Spec(
            "SnapKVPress",
            lambda r: P.SnapKVPress(compression_ratio=r),
            model_lengths=(128,),
            note="window_size 64: kvpress asserts S > window_size, so S=48 is not recorded",
        ),
        Spec("SnapKVPress_window16", lambda r: P.SnapKVPress(compression_ratio=r, window_size=16)),
        Spec("StreamingLLMPress", lambda r: P.StreamingLLMPress(compression_ratio=r), tensor=True),
        Spec("TOVAPress", lambda r: P.TOVAPress(compression_ratio=r)),
        Spec(
            "PyramidKVPress",
            lambda r: P.PyramidKVPress(compression_ratio=r),
            model_lengths=(128,),
            note="window_size 64: kvpress asserts S > window_size, so S=48 is not recorded",
        ),
        Spec("PyramidKVPress_window16", lambda r: P.PyramidKVPress(compression_ratio=r, window_size=16)),
        Spec("ObservedAttentionPress", lambda r: P.ObservedAttentionPress(compression_ratio=r), attn="eager"),
        # Wrappers.
        Spec(
            "ChunkKVPress_KnormPress",
            lambda r: P.ChunkKVPress(press=P.KnormPress(compression_ratio=r), chunk_length=8),
            tensor=True,
        ),
        Spec(
            "ChunkKVPress_SnapKVPress",
            lambda r: P.ChunkKVPress(press=P.SnapKVPress(compression_ratio=r, window_size=16), chunk_length=8),
        ),
        Spec(
            "BlockPress_KeyDiffPress", lambda r: P.BlockPress(press=P.KeyDiffPress(compression_ratio=r), block_size=32)
        ),
        Spec("BlockPress_KnormPress", lambda r: P.BlockPress(press=P.KnormPress(compression_ratio=r), block_size=32)),
        Spec("AdaKVPress_KnormPress", lambda r: P.AdaKVPress(press=P.KnormPress(compression_ratio=r))),
        Spec(
            "AdaKVPress_SnapKVPress",
            lambda r: P.AdaKVPress(press=P.SnapKVPress(compression_ratio=r, window_size=16)),
        ),
        Spec(
            "AdaKVPress_ExpectedAttentionPress",
            lambda r: P.AdaKVPress(press=P.ExpectedAttentionPress(compression_ratio=r, epsilon=1e-2)),
            note="kvpress's leaderboard 'expected_attention' entry",
        ),
        Spec(
            "CriticalKVPress_SnapKVPress",
            lambda r: P.CriticalKVPress(press=P.SnapKVPress(compression_ratio=r, window_size=16)),
        ),
        Spec("CriticalKVPress_KnormPress", lambda r: P.CriticalKVPress(press=P.KnormPress(compression_ratio=r))),
        Spec(
            "CriticalAdaKVPress_SnapKVPress",
            lambda r: P.CriticalAdaKVPress(press=P.SnapKVPress(compression_ratio=r, window_size=16)),
        ),
        Spec(
            "DecodingPress_KnormPress",
            lambda r: P.DecodingPress(base_press=P.KnormPress(), compression_interval=4, target_size=48),
            ratios=(0.0,),
            decoding=True,
            note=decoding_note,
        ),
        Spec(
            "CompressionRatioDecodingPress_KnormPress",
            lambda r: P.CompressionRatioDecodingPress(
                base_press=P.KnormPress(), compression_interval=4, target_compression_ratio=r
            ),
            decoding=True,
            note=decoding_note + "; target = max(1, int(tokens seen * (1 - ratio))), tokens seen from position_ids",
        ),
        Spec(
            "PrefillDecodingPress_KnormPress",
            lambda r: P.PrefillDecodingPress(
                prefilling_press=P.KnormPress(compression_ratio=r),
                decoding_press=P.DecodingPress(base_press=P.KnormPress(), compression_interval=4, target_size=24),
            ),
            decoding=True,
            note=decoding_note + "; the prefill is compressed by the prefilling press in a context of its own",
        ),
        Spec(
            "ChunkPress_KnormPress",
            lambda r: P.ChunkPress(press=P.KnormPress(compression_ratio=r), chunk_length=20),
            note="each chunk of chunk_length compressed on its own: max(1, int(chunk * (1 - ratio))) per chunk",
        ),
        Spec(
            "DecodingPress_KnormPress_buffer0",
            lambda r: P.DecodingPress(
                base_press=P.KnormPress(), compression_interval=3, target_size=40, hidden_states_buffer_size=0
            ),
            ratios=(0.0,),
            decoding=True,
            note=decoding_note,
        ),
    ]


# ------------------------------------------------------------------------------------------------ main
class Recorder:
    def __init__(self, out: Path):
        self.out = out
        self.tensors = tensor_inputs()
        self.weights = build_model_weights()
        self.models: dict[tuple[str, str], LlamaForCausalLM] = {}
        self.layer_inputs: dict[str, torch.Tensor] = {}

    def model(self, dtype: str, attn: str) -> LlamaForCausalLM:
        if (dtype, attn) not in self.models:
            self.models[(dtype, attn)] = load_model(self.weights, DTYPES[dtype], attn)
        return self.models[(dtype, attn)]

    def remember_inputs(self, attn: str, dtype: str, length: int, tracker: Tracker) -> str:
        """Store (first time) or check (afterwards) what each layer saw; returns the inputs' key prefix."""
        prefix = f"model/{attn}/{dtype}/S{length}"
        tensors = {f"{prefix}/input_ids": input_ids_for(length)}
        for layer, seen in sorted(tracker.prefill_inputs.items()):
            for name, value in seen.items():
                value = value[..., :length, :] if name != "hidden_states" else value[:, :length]
                tensors[f"{prefix}/layer{layer}/{name}"] = value.contiguous()
        for name, value in tensors.items():
            if name in self.layer_inputs:
                if not torch.equal(self.layer_inputs[name], value):
                    raise RuntimeError(f"{name}: inputs differ between presses")
            else:
                self.layer_inputs[name] = value
        return prefix

    def record(self, spec: Spec) -> dict:
        tables = ScoreTables()
        cases = []
        if spec.tensor:
            for dtype in DTYPES:
                for length in spec.tensor_lengths:
                    keys = self.tensors[f"keys_S{length}"].to(DTYPES[dtype])
                    values = self.tensors[f"values_S{length}"].to(DTYPES[dtype])
                    for ratio in spec.ratios:
                        press = spec.make(ratio)
                        kept, calls = run_tensor(press, keys, values)
                        cases.append(self.case("tensor", f"tensor/S{length}", dtype, ratio, press, kept, calls, tables))
        if spec.model:
            for dtype in DTYPES:
                model = self.model(dtype, spec.attn)
                for length in spec.model_lengths:
                    ids = input_ids_for(length)
                    for ratio in spec.ratios:
                        press = spec.make(ratio)
                        if spec.decoding:
                            decode_ids = input_ids_for(1000 + length)[:, :DECODE_STEPS]
                            tracker, calls = run_model_decoding(model, press, ids, decode_ids)
                            self.layer_inputs[f"decode_ids/S{length}"] = decode_ids
                        else:
                            tracker, calls = run_model_prefill(model, press, ids)
                        prefix = self.remember_inputs(spec.attn, dtype, length, tracker)
                        cases.append(self.case("model", prefix, dtype, ratio, press, tracker.kept(), calls, tables))
        used = {"weights": flat_weights(self.weights)} if spec.model else {}
        if spec.name.startswith("QFilterPress"):
            used["qfilters"] = seeded_qfilters()
        for case in cases:
            if case["kind"] == "tensor":
                length = case["inputs"].split("/S")[-1]
                used[f"tensor/keys_S{length}"] = self.tensors[f"keys_S{length}"]
                used[f"tensor/values_S{length}"] = self.tensors[f"values_S{length}"]
            else:
                prefix = case["inputs"] + "/"
                used.update({k: v for k, v in self.layer_inputs.items() if k.startswith(prefix)})
                if spec.decoding:
                    length = case["inputs"].split("/S")[-1]
                    used[f"decode_ids/S{length}"] = self.layer_inputs[f"decode_ids/S{length}"]
        return {
            "format_version": FORMAT_VERSION,
            "press": spec.name,
            "note": spec.note,
            "versions": versions(),
            "recording": recording_meta(),
            "inputs_checksums": {name: checksum(used[name]) for name in sorted(used)},
            "cases": cases,
            "score_tables": tables.tables,
        }

    @staticmethod
    def case(kind, inputs, dtype, ratio, press, kept, calls, tables) -> dict:
        return {
            "kind": kind,
            "inputs": inputs,
            "dtype": dtype,
            "compression_ratio": ratio,
            "settings": settings_of(press),
            "n_kept": [[len(h) for h in layer] for layer in kept],
            "kept": kept,
            "score_calls": [
                {"press": call["press"], "layer": call["layer"], "table": tables.add(call["scores"])} for call in calls
            ],
        }


DECODE_STEPS = 14
QUESTION_TOKENS = 4


def versions() -> dict:
    return {
        "kvpress": metadata.version("kvpress"),
        "transformers": metadata.version("transformers"),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
    }


def recording_meta() -> dict:
    """Seeds, shapes and the model config: enough to regenerate the seeded inputs without this script."""
    return {
        "model_config": MODEL_CONFIG,
        "seeds": {
            "tensor": TENSOR_SEED,
            "model": MODEL_SEED,
            "input_ids": INPUT_IDS_SEED,
            "global": GLOBAL_SEED,
            "qfilters": QFILTER_SEED,
        },
        "tensor_shape": {"batch": 1, "kv_heads": TENSOR_HEADS, "head_dim": TENSOR_DIM, "lengths": TENSOR_LENGTHS},
        "model_lengths": MODEL_LENGTHS,
        "decode": {"steps": DECODE_STEPS, "question_tokens": QUESTION_TOKENS},
        "versions": versions(),
    }


def write_json(path: Path, payload: dict) -> None:
    path.write_text(json.dumps(payload, separators=(",", ":"), sort_keys=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("tests/fixtures/reference/kvpress"))
    parser.add_argument("--only", default="", help="comma-separated press names (default: all)")
    args = parser.parse_args(argv)
    if "kvbench" in sys.modules:
        raise SystemExit("record_kvpress.py must not run with kvbench imported")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    args.out.mkdir(parents=True, exist_ok=True)
    recorder = Recorder(args.out)
    wanted = [name for name in args.only.split(",") if name]
    all_specs = specs()
    unknown = sorted(set(wanted) - {spec.name for spec in all_specs})
    if unknown:
        raise SystemExit(f"unknown press(es) {unknown}; valid: {[spec.name for spec in all_specs]}")
    for spec in all_specs:
        if wanted and spec.name not in wanted:
            continue
        payload = recorder.record(spec)
        write_json(args.out / f"{spec.name}.json", payload)
        print(f"{spec.name}: {len(payload['cases'])} cases", flush=True)
    save_inputs(args.out, recorder)
    return 0


def save_inputs(out: Path, recorder: Recorder) -> None:
    """``inputs.safetensors``: merged with what is already there (so ``--only`` runs keep the other presses' inputs)."""
    path = out / "inputs.safetensors"
    tensors: dict[str, torch.Tensor] = {}
    if path.exists():
        from safetensors.torch import load_file

        tensors.update(load_file(path))
    tensors.update({f"tensor/{name}": value for name, value in recorder.tensors.items()})
    tensors.update({f"weights/{name}": value for name, value in recorder.weights.items()})
    tensors["qfilters"] = seeded_qfilters()
    for name, value in recorder.layer_inputs.items():
        if name in tensors and not torch.equal(tensors[name], value):
            raise RuntimeError(f"{name}: differs from the stored inputs")
        tensors[name] = value
    # One metadata key: safetensors writes a multi-key metadata map in no fixed order.
    meta = {"recording": json.dumps(recording_meta(), sort_keys=True)}
    save_file(dict(sorted(tensors.items())), str(path), metadata=meta)


if __name__ == "__main__":
    raise SystemExit(main())
