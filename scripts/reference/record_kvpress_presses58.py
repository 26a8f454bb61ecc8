"""Record what NVIDIA kvpress 0.5.5's composition, threshold and merging presses keep (issue #58), for kvbench's parity
tests: ``ComposedPress``, ``PerLayerCompressionPress``, ``DMSPress``, ``MergingPress`` and ``CAMPress``.

A sibling of ``record_kvpress.py``: the same seeded inputs, tiny Llama, kept-index tracker and file format
(``tests/fixtures/reference/kvpress/README.md``), imported from it, into the same folder (``inputs.safetensors`` is
merged, the layer inputs checked equal).  Runs ONLY in kvpress's own virtual environment, never with kvbench::

    OMP_NUM_THREADS=1 /work/venvs/kvpress/bin/python scripts/reference/record_kvpress_presses58.py \
        --out tests/fixtures/reference/kvpress [--only MergingPress_KnormPress]

What it adds to the format, per case (optional keys a reader of the older recordings ignores):

* merging presses (``MergingPress``, ``CAMPress``): ``kept_values`` ``[layer] -> value table index``; the table
  (``value_tables``, as ``score_tables``) is ``[H_kv, n_kept, D]`` float32: the values the compressed cache holds,
  in the order of ``kept`` (kvpress's cache order), merged values included;
* ``DMSPress``: ``threshold`` (the press's); ``compression_ratio`` is what the press measured
  (``DMSPress.compression_ratio``: the masked fraction averaged over layers), ``kept`` the positions not masked.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

import kvpress
import torch
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record_kvpress as base  # the sibling recorder: inputs, tracker, writers

P = kvpress
#: DMS thresholds: KNorm's scores are minus the key norms (about -1.4 to -5.6 on the tiny Llama), SnapKV's are window
#: attention averages (about 1 / S).
KNORM_THRESHOLDS = (-2.5, -3.0, -3.5)
SNAPKV_THRESHOLDS = (0.006, 0.008, 0.011)


class KeepMaskTracker(base.Tracker):
    """The tracker, reading ``module.masked_key_indices`` without clearing it (DMS accumulates its masks over the
    forwards, and kvpress's attention patch reads them at every later forward)."""

    def _after(self, module, args, kwargs, output):
        masked = getattr(module, "masked_key_indices", None)
        module.masked_key_indices = None
        try:
            super()._after(module, args, kwargs, output)
        finally:
            module.masked_key_indices = masked
        if masked is not None:
            _, head_idx, seq_idx = masked
            heads = kwargs["past_key_values"].layers[module.layer_idx].keys.shape[1]
            self.masked[module.layer_idx] = [sorted(seq_idx[head_idx == h].tolist()) for h in range(heads)]
        return output


def run_prefill(model, press, input_ids, tracker_class=base.Tracker):
    """kvpress's pipeline prefill under the press (as ``record_kvpress.run_model_prefill``); also the cache."""
    tracker, calls, cache = tracker_class(model), [], DynamicCache()
    base.capture_scores(press, calls)
    tracker.attach_before()
    try:
        torch.manual_seed(base.GLOBAL_SEED)
        with torch.no_grad(), press(model):
            tracker.attach_after()
            model.model(input_ids=input_ids, past_key_values=cache)
    finally:
        tracker.detach()
    return tracker, calls, cache


def run_decoding(model, press, input_ids, decode_ids, *, prefill_under_press: bool, tracker_class=base.Tracker):
    """The context prefilled (under the press when ``prefill_under_press``: DMS), then under the press a question of
    ``QUESTION_TOKENS`` tokens in one forward and single tokens, as ``record_kvpress.run_model_decoding``; also the
    cache."""
    tracker, calls, cache = tracker_class(model), [], DynamicCache()
    base.capture_scores(press, calls)
    tracker.attach_before()
    try:
        torch.manual_seed(base.GLOBAL_SEED)
        with torch.no_grad():
            tracker.next_positions = torch.arange(input_ids.shape[1])
            if prefill_under_press:
                with press(model):
                    after = tracker.attach_after()
                    model.model(input_ids=input_ids, past_key_values=cache)
                tracker.detach(after)
            else:
                model.model(input_ids=input_ids, past_key_values=cache)
            with press(model):
                tracker.attach_after()
                start = input_ids.shape[1]
                chunks = [(0, base.QUESTION_TOKENS)]
                chunks += [(i, i + 1) for i in range(base.QUESTION_TOKENS, decode_ids.shape[1])]
                for lo, hi in chunks:
                    positions = torch.arange(start + lo, start + hi)
                    tracker.next_positions = positions
                    model.model(input_ids=decode_ids[:, lo:hi], past_key_values=cache, position_ids=positions[None])
    finally:
        tracker.detach()
    return tracker, calls, cache


def run_kvcompose(model, press, input_ids):
    """KVComposePress's pipeline prefill: ``model.model(input_ids)`` inside ``with press(model)`` (its forward
    prefills in eager attention, replays the context, and the context's exit compresses every layer); kept positions
    from the compressed cache (structured) or the masks (unstructured), the context's only; the enhanced scores
    ``[L, H_kv, S]`` as one score call per layer."""
    cache, calls, seen = DynamicCache(), [], {}

    def first_call(module, args, kwargs, output):
        layer = kwargs["past_key_values"].layers[module.layer_idx]
        if module.layer_idx not in seen:
            seen[module.layer_idx] = {
                "hidden_states": kwargs["hidden_states"].detach().clone(),
                "keys": layer.keys.detach().clone(),
                "values": layer.values.detach().clone(),
            }
        return output

    prepare = press.prepare_important_masks

    def prepare_and_record():
        prepare()
        for layer, scores in enumerate(press.scores):
            calls.append({"press": "KVComposePress", "layer": layer, "scores": scores.detach().float().clone()})

    press.prepare_important_masks = prepare_and_record
    handles = []
    torch.manual_seed(base.GLOBAL_SEED)
    with torch.no_grad(), press(model):
        handles = [layer.self_attn.register_forward_hook(first_call, with_kwargs=True) for layer in model.model.layers]
        model.model(input_ids=input_ids, past_key_values=cache)
    for handle in handles:
        handle.remove()
    length, kept = input_ids.shape[1], []
    for index, layer in enumerate(model.model.layers):
        before = seen[index]["keys"][0, :, :length]
        if press.structured:
            after = cache.layers[index].keys[0]
            kept.append([base.match_rows(before[h], after[h]).tolist() for h in range(after.shape[0])])
        else:
            _, heads, positions = layer.self_attn.masked_key_indices
            layer.self_attn.masked_key_indices = None
            masked = [set(positions[heads == h].tolist()) for h in range(before.shape[0])]
            kept.append([[p for p in range(length) if p not in masked[h]] for h in range(before.shape[0])])
    tracker = dataclasses.make_dataclass("Seen", [("prefill_inputs", dict)])(seen)
    return tracker, calls, kept


@dataclasses.dataclass
class Spec58:
    """One recording: ``make(x)`` builds the press for each ``x`` of ``sweep`` (a compression ratio, or DMS's
    threshold); ``mode`` is ``prefill``, ``decoding`` (the question and single steps under the press) or ``dms``."""

    name: str
    make: Any
    sweep: tuple = base.RATIOS
    model_lengths: tuple = base.MODEL_LENGTHS
    tensor: bool = False
    tensor_lengths: tuple = (37, 128)
    mode: str = "prefill"
    values: bool = False
    note: str = ""


LUKV_SEED = 5801


def seeded_lukv_curve() -> torch.Tensor:
    """``[99, layers, H_kv]`` float32 per-head prune ratios in ``[0, 1)``, increasing with the row (the compression
    ratio's percent - 1): a seeded stand-in for LU-KV's curves (a Hub download per model: unreachable here)."""
    shape = (99, MODEL_LAYERS, base.MODEL_CONFIG["num_key_value_heads"])
    spread = torch.rand(shape[1:], generator=torch.Generator().manual_seed(LUKV_SEED)) - 0.5  # per layer and head
    target = torch.arange(1, 100, dtype=torch.float32)[:, None, None] / 100
    return (target + 0.3 * spread * target * (1 - target) * 4).clamp(0.0, 0.99)


MODEL_LAYERS = base.MODEL_CONFIG["num_hidden_layers"]


@dataclasses.dataclass
class SeededCurveLUKVPress(kvpress.LUKVPress):
    """kvpress's LUKVPress with the curve set from ``seeded_lukv_curve()`` where it would download one."""

    def _load_budget_curves(self, model):
        return seeded_lukv_curve().numpy()


def specs() -> list[Spec58]:
    decoding_note = (
        f"DecodingPress: context prefilled uncompressed; then a {base.QUESTION_TOKENS}-token question in one forward "
        "and single tokens (ids in inputs decode_ids/S{S}); kept = positions in the cache after the last step"
    )
    return [
        Spec58(
            "ComposedPress_SnapKVPress_KnormPress",
            lambda r: P.ComposedPress([P.SnapKVPress(compression_ratio=r), P.KnormPress(compression_ratio=0.5)]),
            sweep=(0.1, 0.25, 0.4, 0.5),
            model_lengths=(128,),
            note="SnapKVPress (window 64) at the case's ratio (keeping at least its window), then KnormPress(0.5)",
        ),
        Spec58(
            "ComposedPress_KeyDiffPress_KnormPress",
            lambda r: P.ComposedPress([P.KeyDiffPress(compression_ratio=r), P.KnormPress(compression_ratio=0.5)]),
            note="KeyDiffPress at the case's ratio, then KnormPress(0.5) on what it kept",
        ),
        Spec58(
            "PerLayerCompressionPress_KnormPress",
            lambda r: P.PerLayerCompressionPress(press=P.KnormPress(), compression_ratios=[r, 0.5]),
            note="compression_ratios [ratio, 0.5] (layer 0, layer 1); compression_ratio = their mean",
        ),
        Spec58(
            "PerLayerCompressionPress_SnapKVPress",
            lambda r: P.PerLayerCompressionPress(press=P.SnapKVPress(), compression_ratios=[0.25, r]),
            model_lengths=(128,),
            note="compression_ratios [0.25, ratio] (layer 0, layer 1); SnapKVPress window 64",
        ),
        Spec58(
            "MergingPress_KnormPress",
            lambda r: P.MergingPress(press=P.KnormPress(compression_ratio=r)),
            tensor=True,
            values=True,
            note="kept_values: the merged values the cache holds, in kept order",
        ),
        Spec58(
            "MergingPress_KnormPress_gated",
            lambda r: P.MergingPress(
                press=P.KnormPress(compression_ratio=r), similarity_threshold=0.1, merge_fraction=0.75
            ),
            sweep=(0.5, 0.875),
            model_lengths=(),
            tensor=True,
            values=True,
            note="similarity_threshold 0.1, merge_fraction 0.75 (the quantile gate); tensor cases only",
        ),
        Spec58(
            "MergingPress_SnapKVPress",
            lambda r: P.MergingPress(press=P.SnapKVPress(compression_ratio=r, window_size=16)),
            model_lengths=(48,),
            values=True,
            note="SnapKVPress window 16",
        ),
        Spec58(
            "DMSPress_KnormPress",
            lambda t: P.DMSPress(press=P.KnormPress(), threshold=t, sliding_window_size=16),
            sweep=KNORM_THRESHOLDS,
            mode="dms",
            note="prefill only; sliding_window_size 16; compression_ratio = the masked fraction kvpress measured",
        ),
        Spec58(
            "DMSPress_SnapKVPress",
            lambda t: P.DMSPress(press=P.SnapKVPress(window_size=16), threshold=t, sliding_window_size=32),
            sweep=SNAPKV_THRESHOLDS,
            mode="dms",
            note="prefill only; SnapKVPress window 16, sliding_window_size 32",
        ),
        Spec58(
            "DMSPress_KnormPress_decoding",
            lambda t: P.DMSPress(press=P.KnormPress(), threshold=t, sliding_window_size=8, decoding=True),
            sweep=KNORM_THRESHOLDS,
            mode="dms_decoding",
            note=decoding_note.replace("uncompressed", "under the press")
            + "; decoding=True, sliding_window_size 8; kept = positions not masked after the last step",
        ),
        Spec58(
            "EntropyGatedChunkKVPress_KnormPress",
            lambda r: P.EntropyGatedChunkKVPress(press=P.KnormPress(compression_ratio=r), chunk_length=8),
            tensor=True,
            tensor_lengths=(37, 64, 128),
            note="chunk_length 8, low_entropy_chunk_length 4 (KNorm's scores are negative: the gate rebases them)",
        ),
        Spec58(
            "EntropyGatedChunkKVPress_SnapKVPress",
            lambda r: P.EntropyGatedChunkKVPress(press=P.SnapKVPress(compression_ratio=r, window_size=16)),
            note="chunk_length 10 (default), low_entropy_chunk_length 4; SnapKVPress window 16",
        ),
        Spec58(
            "LUKVPress_KnormPress_seeded_curve",
            lambda r: SeededCurveLUKVPress(press=P.KnormPress(), compression_ratio=r),
            note="curve from inputs 'lukv_curve' [99, layers, H_kv] (seeded stand-in for the Hub's); sink 4, window 1",
        ),
        Spec58(
            "LUKVPress_ExpectedAttentionPress_seeded_curve",
            lambda r: SeededCurveLUKVPress(compression_ratio=r),
            note="the default press ExpectedAttentionPress(epsilon=2e-2); the seeded curve; sink 4, window 1",
        ),
        Spec58(
            "CapPress", lambda r: P.CapPress(compression_ratio=r), note="defaults: tau 5, 512 future positions, 4 sinks"
        ),
        Spec58(
            "KVComposePress",
            lambda r: P.KVComposePress(compression_ratio=r),
            mode="kvcompose",
            note="eager attention (its forward forces it): inputs under model/eager; the context replayed once",
        ),
        Spec58(
            "KVComposePress_unstructured",
            lambda r: P.KVComposePress(compression_ratio=r, structured=False),
            mode="kvcompose",
            note="structured=False: per-head counts; kvpress masks (its replayed tokens stay in its cache)",
        ),
        Spec58(
            "CAMPress_KnormPress",
            lambda r: P.CAMPress(base_press=P.KnormPress(), compression_interval=4, target_size=40, merge_budget=4),
            sweep=(0.0,),
            mode="decoding",
            values=True,
            note=decoding_note
            + f"; Bernoulli draws from torch's global generator after manual_seed({base.GLOBAL_SEED})",
        ),
    ]


class ValueTables(base.ScoreTables):
    """Value tensors ``[H_kv, n, D]`` (float32) deduplicated by content, as the score tables."""

    def add(self, values: torch.Tensor) -> int:
        values = values.detach().float().contiguous()
        key = base.hashlib.sha256(values.numpy().tobytes() + str(tuple(values.shape)).encode()).hexdigest()
        if key not in self.index:
            self.index[key] = len(self.tables)
            rows = [base.float32_list(head) for head in values]
            self.tables.append({"shape": list(values.shape), "values": rows})
        return self.index[key]


class Recorder58(base.Recorder):
    def record58(self, spec: Spec58) -> dict:
        tables, values = base.ScoreTables(), ValueTables()
        cases = []
        if spec.tensor:
            for dtype in base.DTYPES:
                for length in spec.tensor_lengths:
                    keys = self.tensors[f"keys_S{length}"].to(base.DTYPES[dtype])
                    vals = self.tensors[f"values_S{length}"].to(base.DTYPES[dtype])
                    for x in spec.sweep:
                        press = spec.make(x)
                        kept, calls, new_values = run_tensor(press, keys, vals)
                        case = self.case("tensor", f"tensor/S{length}", dtype, x, press, kept, calls, tables)
                        case["kept_values"] = [values.add(new_values[0])]
                        cases.append(case)
        for dtype in base.DTYPES:
            model = self.model(dtype, "eager" if spec.mode == "kvcompose" else "sdpa")
            for length in spec.model_lengths:
                ids = base.input_ids_for(length)
                decode_ids = base.input_ids_for(1000 + length)[:, : base.DECODE_STEPS]
                for x in spec.sweep:
                    press = spec.make(x)
                    if spec.mode == "kvcompose":
                        tracker, calls, kept = run_kvcompose(model, press, ids)
                        prefix = self.remember_inputs("eager", dtype, length, tracker)
                        cases.append(self.case("model", prefix, dtype, x, press, kept, calls, tables))
                        continue
                    if spec.mode == "prefill":
                        tracker, calls, cache = run_prefill(model, press, ids)
                    elif spec.mode == "dms":
                        tracker, calls, cache = run_prefill(model, press, ids, KeepMaskTracker)
                    else:
                        self.layer_inputs[f"decode_ids/S{length}"] = decode_ids
                        tracker, calls, cache = run_decoding(
                            model,
                            press,
                            ids,
                            decode_ids,
                            prefill_under_press=spec.mode == "dms_decoding",
                            tracker_class=KeepMaskTracker if spec.mode == "dms_decoding" else base.Tracker,
                        )
                    prefix = self.remember_inputs("sdpa", dtype, length, tracker)
                    ratio = x if spec.mode in ("prefill", "decoding") else float(press.compression_ratio)
                    case = self.case("model", prefix, dtype, ratio, press, tracker.kept(), calls, tables)
                    if spec.mode.startswith("dms"):
                        case["threshold"] = x
                    if spec.values:
                        case["kept_values"] = [values.add(layer.values[0].detach()) for layer in cache.layers]
                    cases.append(case)
        used: dict[str, torch.Tensor] = {}
        if spec.model_lengths:
            used["weights"] = base.flat_weights(self.weights)
        if spec.name.startswith("LUKVPress"):
            used["lukv_curve"] = seeded_lukv_curve()
        for case in cases:
            length = case["inputs"].split("/S")[-1]
            if case["kind"] == "tensor":
                used[f"tensor/keys_S{length}"] = self.tensors[f"keys_S{length}"]
                used[f"tensor/values_S{length}"] = self.tensors[f"values_S{length}"]
                continue
            prefix = case["inputs"] + "/"
            used.update({k: v for k, v in self.layer_inputs.items() if k.startswith(prefix)})
            if spec.mode in ("decoding", "dms_decoding"):
                used[f"decode_ids/S{length}"] = self.layer_inputs[f"decode_ids/S{length}"]
        payload = {
            "format_version": base.FORMAT_VERSION,
            "press": spec.name,
            "note": spec.note,
            "versions": base.versions(),
            "recording": base.recording_meta(),
            "inputs_checksums": {name: base.checksum(used[name]) for name in sorted(used)},
            "cases": cases,
            "score_tables": tables.tables,
        }
        if spec.values:
            payload["value_tables"] = values.tables
        return payload


def run_tensor(press, keys, values):
    """``press.compress`` on bare tensors with a stand-in module (as ``record_kvpress.run_tensor``); also the values."""
    calls: list[dict] = []
    base.capture_scores(press, calls)
    module = dataclasses.make_dataclass("Module", [("head_dim", int), ("layer_idx", int)])(keys.shape[-1], 0)
    torch.manual_seed(base.GLOBAL_SEED)
    with torch.no_grad():
        new_keys, new_values = press.compress(module, None, keys, values, None, {})
    kept = [[int(i) for i in base.match_rows(keys[0, h], new_keys[0, h]).tolist()] for h in range(keys.shape[1])]
    return [kept], calls, new_values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("tests/fixtures/reference/kvpress"))
    parser.add_argument("--only", default="", help="comma-separated recording names (default: all)")
    args = parser.parse_args(argv)
    if "kvbench" in sys.modules:
        raise SystemExit("record_kvpress_presses58.py must not run with kvbench imported")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    args.out.mkdir(parents=True, exist_ok=True)
    recorder = Recorder58(args.out)
    wanted = [name for name in args.only.split(",") if name]
    all_specs = specs()
    unknown = sorted(set(wanted) - {spec.name for spec in all_specs})
    if unknown:
        raise SystemExit(f"unknown recording(s) {unknown}; valid: {[spec.name for spec in all_specs]}")
    for spec in all_specs:
        if wanted and spec.name not in wanted:
            continue
        payload = recorder.record58(spec)
        base.write_json(args.out / f"{spec.name}.json", payload)
        print(f"{spec.name}: {len(payload['cases'])} cases", flush=True)
    recorder.layer_inputs["lukv_curve"] = seeded_lukv_curve()
    base.save_inputs(args.out, recorder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
