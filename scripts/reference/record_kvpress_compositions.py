"""Record kvpress's composed presses and decoding presses over window-keeping scorers (issue #54), for kvbench's
parity tests: a sibling of ``record_kvpress.py`` (same inputs, same fixture format, same folder), which it imports.

Runs ONLY inside kvpress's own virtual environment (see ``record_kvpress.py``)::

    OMP_NUM_THREADS=1 /work/venvs/kvpress/bin/python scripts/reference/record_kvpress_compositions.py \
        --out tests/fixtures/reference/kvpress [--only BlockPress_SnapKVPress,...]

What it adds to ``record_kvpress.py``'s recordings:

* compositions of a wrapper with ``SnapKVPress`` (``BlockPress``, and ``ChunkKVPress`` / ``CriticalKVPress`` /
  ``AdaKVPress`` at SnapKVPress's default window 64), and presses at compression ratios where ``S (1 - ratio)`` is
  fractional (``*_fractional``: kvpress's own rounding of chunk counts, CriticalKV's first stage, Compactor's
  blending);
* the decoding presses (``DecodingPress``, ``CompressionRatioDecodingPress``, ``PrefillDecodingPress``) over
  ``SnapKVPress`` (a small window: kvpress asserts that more hidden states are buffered than the window), over
  ``ExpectedAttentionPress`` and over ``KnormPress``, at several compression intervals, for 26 teacher-forced tokens
  (a 4-token question in one forward, then single tokens; ids ``decode_ids26/S{S}``).  Besides the final ``kept``,
  each decoding case has ``steps``: after the prefill and after every later forward, per layer and KV head the
  positions the cache holds **in kvpress's cache order** (a compression leaves its top-k order; new tokens are
  appended), so a test can replay every compression step.
* ``PrefillDecodingPress_SnapKVPress_window64``: the prefill compressed by ``SnapKVPress`` (window 64) and decoding by
  ``DecodingPress(SnapKVPress(window_size=64), interval 4, target 64)`` -- kvbench's ``method=snapkv_kvpress
  method.params.decode_interval=4 budget=64/layer``.  kvpress's ``SnapKVPress.score`` asserts more buffered hidden
  states than its window (4 < 64 here), so the decoding scorer is :class:`UnassertedSnapKVPress`: kvpress's own
  ``compute_window_attention`` and the steps of ``score`` after its assertion, on the buffered rows there are.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

import kvpress
import torch
from torch.nn import functional as F
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record_kvpress as base  # the sibling recorder: inputs, tracker, writers

DECODE_STEPS = 26
RATIOS_FRACTIONAL = (0.1, 0.3, 0.6, 0.9)


@dataclasses.dataclass
class UnassertedSnapKVPress(kvpress.SnapKVPress):
    """kvpress's ``SnapKVPress`` without its ``hidden_states.shape[1] > window_size`` assertion: with enough rows it
    is the parent's ``score``; with fewer, kvpress's own ``compute_window_attention`` (the rows there are, rotated
    with the current forward's last positions, kvpress's causal mask) then ``score``'s steps after the assertion."""

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        if hidden_states.shape[1] > self.window_size or attentions is not None:
            return super().score(module, hidden_states, keys, values, attentions, kwargs)
        bsz, heads, k_len, _ = keys.shape
        groups = module.config.num_attention_heads // heads
        weights = self.compute_window_attention(
            module, hidden_states, keys, self.window_size, kwargs["position_embeddings"]
        )
        scores = weights.mean(dim=-2)
        scores = F.avg_pool1d(scores, kernel_size=self.kernel_size, padding=self.kernel_size // 2, stride=1)
        scores = scores.view(bsz, heads, groups, k_len - self.window_size).mean(2)
        return F.pad(scores, (0, self.window_size), value=scores.max().item() + 1)


class StepTracker(base.Tracker):
    """The recorder's tracker, also snapshotting every layer's positions (cache order) after each forward."""

    def __init__(self, model):
        super().__init__(model)
        self.forward = -1  # -1: the prefill
        self.steps: dict[int, dict[int, list[list[int]]]] = {}

    def _after(self, module, args, kwargs, output):
        output = super()._after(module, args, kwargs, output)
        positions = self.positions[module.layer_idx]
        self.steps.setdefault(self.forward, {})[module.layer_idx] = [[int(p) for p in h.tolist()] for h in positions]
        return output

    def step_list(self) -> list[list[list[list[int]]]]:
        """``[forward][layer][kv_head]`` -> positions in cache order (forward 0: after the prefill)."""
        return [[self.steps[f][layer] for layer in sorted(self.steps[f])] for f in sorted(self.steps)]


def run_decoding_steps(model, press, input_ids, decode_ids) -> tuple[StepTracker, list[dict]]:
    """As ``record_kvpress.run_model_decoding`` (kvpress's pipeline: the prefill under the press only for a
    PrefillDecodingPress; a 4-token question in one forward, then single tokens, ``position_ids`` only), with the
    positions snapshotted after the prefill and after every later forward."""
    tracker, calls = StepTracker(model), []
    base.capture_scores(press, calls)
    cache = DynamicCache()
    tracker.attach_before()
    try:
        torch.manual_seed(base.GLOBAL_SEED)
        with torch.no_grad():
            tracker.next_positions = torch.arange(input_ids.shape[1])
            with press(model) if isinstance(press, kvpress.PrefillDecodingPress) else _no_press():
                after = tracker.attach_after()
                model.model(input_ids=input_ids, past_key_values=cache)
            tracker.detach(after)
            with press(model):
                tracker.attach_after()
                start = input_ids.shape[1]
                chunks = [(0, base.QUESTION_TOKENS)]
                chunks += [(i, i + 1) for i in range(base.QUESTION_TOKENS, decode_ids.shape[1])]
                for index, (lo, hi) in enumerate(chunks):
                    positions = torch.arange(start + lo, start + hi)
                    tracker.next_positions, tracker.forward = positions, index
                    model.model(input_ids=decode_ids[:, lo:hi], past_key_values=cache, position_ids=positions[None])
    finally:
        tracker.detach()
    return tracker, calls


class _no_press:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def specs() -> list[base.Spec]:
    P = kvpress
    note = (
        f"decoding: a {base.QUESTION_TOKENS}-token question in one forward then single tokens "
        "(ids decode_ids26/S{S}); steps[f][layer][head]: positions in kvpress's cache order after the prefill "
        "(f=0) and after forward f"
    )

    def decoding(name, make, ratios=(0.0,), lengths=base.MODEL_LENGTHS, extra=""):
        return base.Spec(name, make, ratios=ratios, decoding=True, model_lengths=lengths, note=note + extra)

    def snap(window):
        return UnassertedSnapKVPress(window_size=window)

    return [
        # Compositions with SnapKVPress (item 2).
        base.Spec(
            "BlockPress_SnapKVPress",
            lambda r: P.BlockPress(press=P.SnapKVPress(compression_ratio=r, window_size=8), block_size=32),
            note="SnapKV scores each block's candidates (kept + block) with their own hidden states (reshaped per KV"
            " head) and the prompt's last 8 rotary positions (window 8: every candidate set here has more than 8"
            " rows, which SnapKVPress asserts)",
        ),
        base.Spec(
            "ChunkPress_SnapKVPress",
            lambda r: P.ChunkPress(press=P.SnapKVPress(compression_ratio=r, window_size=8), chunk_length=32),
            note="SnapKV scores each chunk with the chunk's own hidden states, rotated at the prompt's last 8 positions"
            " (window 8, chunk 32: every chunk here has more than 8 tokens, which SnapKVPress asserts)",
        ),
        base.Spec(
            "ChunkKVPress_SnapKVPress_window64",
            lambda r: P.ChunkKVPress(press=P.SnapKVPress(compression_ratio=r)),
            model_lengths=(128,),
            note="kvpress's leaderboard 'chunkkv': SnapKVPress() defaults (window 64), chunk_length 20",
        ),
        base.Spec(
            "CriticalKVPress_SnapKVPress_window64",
            lambda r: P.CriticalKVPress(press=P.SnapKVPress(compression_ratio=r)),
            model_lengths=(128,),
        ),
        base.Spec(
            "AdaKVPress_SnapKVPress_window64",
            lambda r: P.AdaKVPress(press=P.SnapKVPress(compression_ratio=r)),
            model_lengths=(128,),
        ),
        # kvpress's arithmetic where S (1 - ratio) is fractional (item 3).
        base.Spec(
            "ChunkKVPress_KnormPress_fractional",
            lambda r: P.ChunkKVPress(press=P.KnormPress(compression_ratio=r), chunk_length=8),
            tensor=True,
            tensor_lengths=(37, 64, 300),
            model=False,
            ratios=RATIOS_FRACTIONAL,
        ),
        base.Spec(
            "ChunkPress_KnormPress_fractional",
            lambda r: P.ChunkPress(press=P.KnormPress(compression_ratio=r), chunk_length=20),
            ratios=RATIOS_FRACTIONAL,
        ),
        base.Spec(
            "CriticalKVPress_KnormPress_fractional",
            lambda r: P.CriticalKVPress(press=P.KnormPress(compression_ratio=r)),
            ratios=RATIOS_FRACTIONAL,
        ),
        base.Spec(
            "CompactorPress_fractional",
            lambda r: P.CompactorPress(compression_ratio=r, chunk_size=32),
            ratios=RATIOS_FRACTIONAL,
            note="its leverage part draws from torch's global CPU generator after "
            f"torch.manual_seed({base.GLOBAL_SEED})",
        ),
        # Decoding presses (item 1).
        decoding(
            "DecodingPress_SnapKVPress_interval3",
            lambda r: P.DecodingPress(base_press=snap(2), compression_interval=3, target_size=40),
        ),
        decoding(
            "DecodingPress_SnapKVPress_interval5",
            lambda r: P.DecodingPress(base_press=snap(4), compression_interval=5, target_size=44),
        ),
        decoding(
            "DecodingPress_ExpectedAttentionPress_interval6",
            lambda r: P.DecodingPress(base_press=P.ExpectedAttentionPress(), compression_interval=6, target_size=40),
        ),
        decoding(
            "DecodingPress_KnormPress_interval5",
            lambda r: P.DecodingPress(base_press=P.KnormPress(), compression_interval=5, target_size=44),
        ),
        decoding(
            "CompressionRatioDecodingPress_SnapKVPress_interval3",
            lambda r: P.CompressionRatioDecodingPress(
                base_press=snap(2), compression_interval=3, target_compression_ratio=r
            ),
            ratios=base.RATIOS,
        ),
        decoding(
            "CompressionRatioDecodingPress_ExpectedAttentionPress_interval8",
            lambda r: P.CompressionRatioDecodingPress(
                base_press=P.ExpectedAttentionPress(), compression_interval=8, target_compression_ratio=r
            ),
            ratios=base.RATIOS,
        ),
        decoding(
            "CompressionRatioDecodingPress_KnormPress_interval3",
            lambda r: P.CompressionRatioDecodingPress(
                base_press=P.KnormPress(), compression_interval=3, target_compression_ratio=r
            ),
            ratios=base.RATIOS,
        ),
        decoding(
            "PrefillDecodingPress_SnapKVPress",
            lambda r: P.PrefillDecodingPress(
                prefilling_press=P.SnapKVPress(compression_ratio=r, window_size=16),
                decoding_press=P.DecodingPress(base_press=snap(16), compression_interval=3, target_size=24),
            ),
            ratios=base.RATIOS,
            extra="; one window (16) for the prefill and the decoding scorer, as kvbench's method.window "
            "(UnassertedSnapKVPress: 3 buffered rows)",
        ),
        decoding(
            "PrefillDecodingPress_ExpectedAttentionPress",
            lambda r: P.PrefillDecodingPress(
                prefilling_press=P.ExpectedAttentionPress(compression_ratio=r),
                decoding_press=P.DecodingPress(
                    base_press=P.ExpectedAttentionPress(), compression_interval=6, target_size=24
                ),
            ),
            ratios=base.RATIOS,
        ),
        decoding(
            "PrefillDecodingPress_KnormPress_interval5",
            lambda r: P.PrefillDecodingPress(
                prefilling_press=P.KnormPress(compression_ratio=r),
                decoding_press=P.DecodingPress(base_press=P.KnormPress(), compression_interval=5, target_size=24),
            ),
            ratios=base.RATIOS,
        ),
        decoding(
            "PrefillDecodingPress_SnapKVPress_window64",
            lambda r: P.PrefillDecodingPress(
                prefilling_press=P.SnapKVPress(compression_ratio=r),
                decoding_press=P.DecodingPress(base_press=snap(64), compression_interval=4, target_size=64),
            ),
            ratios=(0.25, 0.5),
            lengths=(128,),
            extra="; decoding scorer: UnassertedSnapKVPress (kvpress's SnapKVPress asserts more buffered rows than "
            "its window; its steps after the assertion on the rows there are)",
        ),
    ]


class StepRecorder(base.Recorder):
    """``record_kvpress.Recorder`` with decoding cases run by :func:`run_decoding_steps` (``steps`` recorded)."""

    def record(self, spec: base.Spec) -> dict:
        if not spec.decoding:
            return super().record(spec)
        tables, cases, used = base.ScoreTables(), [], {"weights": base.flat_weights(self.weights)}
        for dtype in base.DTYPES:
            model = self.model(dtype, spec.attn)
            for length in spec.model_lengths:
                ids = base.input_ids_for(length)
                decode_ids = base.input_ids_for(1000 + length)[:, :DECODE_STEPS]
                decode_key = f"decode_ids{DECODE_STEPS}/S{length}"
                self.layer_inputs[decode_key] = decode_ids
                for ratio in spec.ratios:
                    press = spec.make(ratio)
                    tracker, calls = run_decoding_steps(model, press, ids, decode_ids)
                    prefix = self.remember_inputs(spec.attn, dtype, length, tracker)
                    case = self.case("model", prefix, dtype, ratio, press, tracker.kept(), calls, tables)
                    case["decode_inputs"] = decode_key
                    case["steps"] = tracker.step_list()
                    cases.append(case)
                    used.update({k: v for k, v in self.layer_inputs.items() if k.startswith(prefix + "/")})
                    used[decode_key] = decode_ids
        return {
            "format_version": base.FORMAT_VERSION,
            "press": spec.name,
            "note": spec.note,
            "versions": base.versions(),
            "recording": base.recording_meta(),
            "inputs_checksums": {name: base.checksum(used[name]) for name in sorted(used)},
            "cases": cases,
            "score_tables": tables.tables,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("tests/fixtures/reference/kvpress"))
    parser.add_argument("--only", default="", help="comma-separated recording names (default: all)")
    args = parser.parse_args(argv)
    if "kvbench" in sys.modules:
        raise SystemExit("record_kvpress_compositions.py must not run with kvbench imported")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    recorder = StepRecorder(args.out)
    wanted = [name for name in args.only.split(",") if name]
    all_specs = specs()
    unknown = sorted(set(wanted) - {spec.name for spec in all_specs})
    if unknown:
        raise SystemExit(f"unknown recording(s) {unknown}; valid: {[spec.name for spec in all_specs]}")
    for spec in all_specs:
        if wanted and spec.name not in wanted:
            continue
        payload = recorder.record(spec)
        base.write_json(args.out / f"{spec.name}.json", payload)
        print(f"{spec.name}: {len(payload['cases'])} cases", flush=True)
    base.save_inputs(args.out, recorder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
