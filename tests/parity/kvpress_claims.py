"""kvbench's support claims against NVIDIA/kvpress 0.5.5 (issue #54 item 6): which kvbench spelling reproduces which
recording of ``tests/fixtures/reference/kvpress/``, and how a replay of it is judged.

One :class:`Claim` per (recording, kvbench spelling).  :func:`tally` replays a claim's cases in one dtype and budget
form and counts per (case, layer, KV head) selection: the same positions as kvpress, another valid choice among
kvpress's tied scores (``tied``), or different.  The parity test (``tests/parity/test_kvpress_claims.py``) asserts 0
different and that the methods page prints these counts; ``scripts/kvpress_support_table.py`` writes that page's
table (``docs/methods/kvpress_support.md``) from the same tallies, so a number on the page is a number a test checks.

Adding a recording (same fixture format, ``record_kvpress*.py``): it appears on the page at once, listed among the
recordings without a claim; one :class:`Claim` line here (its kvbench spelling, observation and tie rule) turns it
into counted rows, and the test then holds it to 0 different.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kvbench.eviction.base import EvictionMethod, WindowObservation, build_method
from kvbench.eviction.kvpress_ada import KVPRESS_ALPHA_SAFEGUARD
from tests.methods.helpers import CONF, method_from_yaml
from tests.methods.kvpress_replay import (
    hidden_states_observation,
    keys_values_observation,
    model_queries,
    prompt_queries_observation,
)
from tests.methods.wrapper_replay import KeptTally, ObservationOf, replay_kept
from tests.reference_recordings import (
    DTYPES,
    RECORDINGS,
    RecordedCase,
    boundary_tie,
    inputs_meta,
    is_valid_topk,
    kvpress_n_kept,
    load_recording,
    recorded_presses,
    tiny_llama_weights,
)

#: Budget forms: kvpress's compression ratio r spelled ``<max(1, int(S (1 - r)))>/layer`` or ``<r>cr``.
FORMS = ("per_layer", "cr")


#: Where a claim's recording lies, by its name's folder prefix (none: ``tests/fixtures/reference/kvpress/``).
RECORDING_FOLDERS = ("learned/", "kvzip/")


@dataclass(frozen=True)
class Claim:
    """A kvbench spelling of a kvpress recording: the preset and knobs (``method=<method> method.params.<k>=<v>``,
    ``window`` a session knob), the label of its wrapper column, how a recorded layer is observed and how a tie is
    judged (names in :data:`OBSERVATIONS` and :data:`TIES`), the budget forms it is claimed under, and whether the
    recording is a decoding one (replayed by ``tests/methods/decoding_replay.py``).

    A press whose parity test replays it otherwise (merged values, thresholds, whole-model prefills, learned weights,
    replays of the context) names that test's replay in ``replay`` (:data:`REPLAYS`: ``(claim, form, dtype) ->
    KeptTally``), which builds the method with :meth:`build`; ``case_knobs`` are the knobs each case sets from its
    recorded settings (printed ``<recorded>``), ``note`` what the page says of its budget and comparison."""

    recording: str
    method: str
    knobs: tuple[tuple[str, Any], ...] = ()
    wrapper: str = "-"
    observation: str = "keys_values"
    tie: str = "topk"
    forms: tuple[str, ...] = FORMS
    decoding: bool = False
    replay: str = ""
    case_knobs: tuple[str, ...] = ()
    note: str = ""

    def build(self, **recorded: Any) -> EvictionMethod:
        """The method as ``python run.py`` would build this spelling (a YAML preset, or a class-only method), with a
        case's ``recorded`` settings: every one of :attr:`case_knobs`, and any fixed knob (which must agree)."""
        knobs = dict(self.knobs)
        for key, value in recorded.items():
            if key not in self.case_knobs and knobs.get(key, value) != value:
                raise ValueError(f"{self.recording}: the case has {key}={value!r}, the claim {knobs.get(key)!r}")
        if set(self.case_knobs) - set(recorded):
            raise ValueError(f"{self.recording}: the case sets {sorted(self.case_knobs)}, given {sorted(recorded)}")
        knobs = {key: list(v) if isinstance(v, tuple) else v for key, v in (knobs | recorded).items()}
        removed = tuple(key for key, v in knobs.items() if v is REMOVED)
        knobs = {key: v for key, v in knobs.items() if v is not REMOVED}
        if (CONF / "method" / f"{self.method}.yaml").is_file():
            return method_from_yaml(self.method, removed, **knobs)
        session = {key: knobs.pop(key) for key in list(knobs) if key in SESSION_KNOBS}
        return build_method({"name": self.method, "family": self.method, **session, "params": knobs})

    @property
    def spelling(self) -> str:
        def value(v: Any) -> str:
            if isinstance(v, tuple):
                return f"[{','.join(map(str, v))}]"
            if v is REMOVED:
                return v
            return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)

        knobs = [(k, value(v)) for k, v in self.knobs] + [(k, "<recorded>") for k in self.case_knobs]
        spelled = " ".join(
            f"~method.params.{k}" if v is REMOVED else f"{'method' if k == 'window' else 'method.params'}.{k}={v}"
            for k, v in knobs
        )
        return f"method={self.method}" + (f" {spelled}" if spelled else "")


#: A knob's value that removes the preset's own (``~method.params.<k>``: a param of the preset's default wrapped
#: press that another press does not take).
REMOVED = "~"
#: The knobs of ``method.<k>`` rather than ``method.params.<k>`` (build_method's MethodConfig fields).
SESSION_KNOBS = frozenset({"window"})


# ------------------------------------------------------------------------------------------------ observations
def window_observation(window: int, hidden: bool = False) -> ObservationOf:
    """A window scorer's observation (SnapKV): the tiny Llama's last ``window`` queries, keys and values; ``hidden``:
    plus the layer's hidden states and rotary tables (what BlockPress's candidates' queries are recomputed from)."""

    def observation(case: RecordedCase, layer: int, inputs: dict[str, torch.Tensor]) -> WindowObservation:
        keys, values = inputs["keys"][0], inputs["values"][0]
        queries = model_queries(case, layer, inputs)[:, -window:]
        seen = WindowObservation(layer, 2, queries, keys, values, keys.shape[-1] ** -0.5)
        if hidden:
            full = hidden_states_observation(case, layer, inputs)
            seen.prerope, seen.rotary = full.prerope, full.rotary
        return seen

    return observation


def with_output_projection(observation_of: ObservationOf) -> ObservationOf:
    """The recorded layer's observation plus the tiny Llama's ``o_proj`` weight in the case's dtype (CriticalKV)."""

    def observation(case: RecordedCase, layer: int, inputs: dict[str, torch.Tensor]) -> WindowObservation:
        seen = observation_of(case, layer, inputs)
        weight = tiny_llama_weights(DTYPES[case.dtype])[f"model.layers.{layer}.self_attn.o_proj.weight"]
        return dataclasses.replace(seen, output_projection=weight)

    return observation


def query_heads_observation(case: RecordedCase, layer: int, inputs: dict[str, torch.Tensor]) -> WindowObservation:
    """Keys and values, and one dummy query per query head of the tiny Llama (CriticalKV reads their count)."""
    seen = keys_values_observation(case, layer, inputs)
    heads = inputs_meta()["model_config"]["num_attention_heads"]
    return dataclasses.replace(seen, queries=seen.queries.new_zeros(heads, 1, seen.queries.shape[-1]))


OBSERVATIONS: dict[str, ObservationOf] = {
    "keys_values": keys_values_observation,
    "keys_values_o_proj": with_output_projection(query_heads_observation),
    "hidden_states": hidden_states_observation,
    "prompt_queries": prompt_queries_observation,
    **{f"window{w}": window_observation(w) for w in (1, 8, 16, 64)},
    **{f"window{w}_o_proj": with_output_projection(window_observation(w)) for w in (16, 64)},
    "window8_hidden": window_observation(8, hidden=True),
}


# ------------------------------------------------------------------------------------------------ tie rules
def _last_call(case: RecordedCase, layer: int, press: str | None = None) -> torch.Tensor:
    """``[H, S]`` the last ``score()`` output on ``layer`` (of ``press`` when given): the one the selection used."""
    calls = [c for c in case.score_calls if c.layer == layer and (press is None or c.press == press)]
    return calls[-1].scores


def topk_of(press: str | None = None) -> Callable[[RecordedCase, int, list[list[int]]], bool]:
    """Every head keeps kvpress's count and a top-k of kvpress's recorded scores (of ``press``): where the kept set
    differs, another choice among scores tied at the cut."""

    def valid(case: RecordedCase, layer: int, kept: list[list[int]]) -> bool:
        scores = _last_call(case, layer, press)
        return all(len(p) == len(case.kept[layer][h]) and is_valid_topk(scores[h], p) for h, p in enumerate(kept))

    return valid


def chunk_choice(case: RecordedCase, layer: int, kept: list[list[int]]) -> bool:
    """ChunkKV: every head keeps the same whole chunks, a top-k of kvpress's chunk scores (the wrapped scores summed
    over KV heads, averaged per chunk, in the case's dtype) tied at the cut."""
    chunk = case.settings["chunk_length"]
    summed = _last_call(case, layer).to(DTYPES[case.dtype]).sum(dim=0)
    scores = torch.stack([part.mean() for part in summed.split(chunk)])
    chunks = sorted({position // chunk for position in kept[0]})
    whole = sum(min(chunk, case.length - c * chunk) for c in chunks) == len(kept[0])
    same_heads = all(positions == kept[0] for positions in kept)
    return whole and same_heads and boundary_tie(scores, len(chunks)) and is_valid_topk(scores, chunks)


def layer_topk(case: RecordedCase, layer: int, kept: list[list[int]]) -> bool:
    """AdaKV: the layer keeps kvpress's total, every head its safeguard and a top-k of its own recorded scores, and
    beyond the safeguards no evicted score of any head exceeds a kept one (one top-k over the layer)."""
    scores = _last_call(case, layer)
    n_safe = max(1, int(kvpress_n_kept(case.length, case.compression_ratio) * KVPRESS_ALPHA_SAFEGUARD))
    if sum(map(len, kept)) != sum(map(len, case.kept[layer])) or min(map(len, kept)) < n_safe:
        return False
    beyond_safe, evicted = [], []
    for head, positions in enumerate(kept):
        if not is_valid_topk(scores[head], positions):
            return False
        beyond_safe.append(scores[head][positions].sort(descending=True).values[n_safe:])
        dropped = torch.ones(scores.shape[1], dtype=torch.bool)
        dropped[positions] = False
        evicted.append(scores[head][dropped])
    lowest, highest = torch.cat(beyond_safe), torch.cat(evicted)
    return lowest.numel() == 0 or highest.numel() == 0 or bool(lowest.min() >= highest.max())


def critical_ada_choice(case: RecordedCase, layer: int, kept: list[list[int]]) -> bool:
    """CriticalAdaKV (kvpress records no CriticalAdaKVPress scores): stage 2 scores a token ``(s + epsilon) vnorm`` as
    CriticalKV does, so where a head's set differs, the swapped tokens tie in kvpress's recorded CriticalKV scores of
    the same inputs (``CriticalKVPress_SnapKVPress``), and the head keeps kvpress's count."""
    critical = {(c.inputs, c.compression_ratio): c for c in load_recording("CriticalKVPress_SnapKVPress").cases}
    scores = critical[case.inputs, case.compression_ratio].layer_scores(layer, "CriticalKVPress")
    for head, positions in enumerate(kept):
        swapped = sorted(set(positions) ^ set(case.kept[layer][head]))
        if len(positions) != len(case.kept[layer][head]) or len(set(scores[head][swapped].tolist())) > 1:
            return False
    return True


TIES: dict[str, Callable[[RecordedCase, int, list[list[int]]], bool] | None] = {
    "critical_ada": critical_ada_choice,
    "none": None,
    "topk": topk_of(),
    "topk_critical": topk_of("CriticalKVPress"),
    "topk_compactor": topk_of("CompactorPress"),
    "chunks": chunk_choice,
    "layer_topk": layer_topk,
}


def reseed(_case: RecordedCase) -> None:
    torch.manual_seed(1234)  # what the recorder did before every case (leverage's sketch draws from it)


#: Before each case, per recording (the global generator's draws).
BEFORE_CASE: dict[str, Callable[[RecordedCase], None]] = {
    name: reseed
    for name in ("CompactorPress_fractional", "CompactorPress", "LeverageScorePress", "RandomPress_seed_None")
}


# ------------------------------------------------------------------------------------------------ the claims
def _snapkv(window: int, **knobs: Any) -> tuple[tuple[str, Any], ...]:
    return (("window", window), *knobs.items())


CLAIMS: tuple[Claim, ...] = (
    # kvpress's scorers, each a kvbench preset or one-class method at kvpress's settings.
    Claim("KnormPress", "knorm"),
    Claim("KeyDiffPress", "keydiff"),
    Claim("LagKVPress", "lagkv"),
    Claim("LagKVPress_lag16", "lagkv", (("lag_size", 16),)),
    Claim("CURPress", "cur"),
    Claim("StreamingLLMPress", "streamingllm_kvpress"),
    Claim("TOVAPress", "tova_kvpress", observation="window1"),
    Claim("SnapKVPress", "snapkv_kvpress", observation="window64"),
    Claim("SnapKVPress_window16", "snapkv_kvpress", _snapkv(16), observation="window16"),
    Claim("ExpectedAttentionPress", "expected_attention", observation="hidden_states"),
    Claim("LeverageScorePress", "leverage", observation="hidden_states"),
    Claim("CompactorPress", "compactor", (("chunk_size", 32),), observation="hidden_states", tie="topk_compactor"),
    Claim("NonCausalAttnPress", "noncausal", (("chunk_size", 32),), observation="hidden_states"),
    Claim("ObservedAttentionPress", "observed_attention", observation="prompt_queries"),
    Claim("RandomPress", "random", (("seed", 0),)),
    Claim("RandomPress_seed_None", "random", (("seed", None),)),
    # kvpress's wrappers over KNorm / KeyDiff / Expected Attention.
    Claim("ChunkKVPress_KnormPress", "knorm", (("selection", "chunkkv"), ("selection_length", 8)), "chunkkv",
          tie="chunks"),
    Claim("ChunkPress_KnormPress", "knorm", (("selection", "chunk"), ("selection_length", 20)), "chunk"),
    Claim("BlockPress_KnormPress", "knorm", (("selection", "block"), ("selection_length", 32)), "block"),
    Claim("BlockPress_KeyDiffPress", "keydiff", (("selection", "block"), ("selection_length", 32)), "block"),
    Claim("AdaKVPress_KnormPress", "knorm", (("allocation", "ada_kvpress"),), "ada_kvpress", tie="layer_topk"),
    Claim("AdaKVPress_ExpectedAttentionPress", "expected_attention_kvpress", (), "ada_kvpress", "hidden_states",
          "layer_topk"),
    Claim("CriticalKVPress_KnormPress", "knorm", (("rescale", "critical"),), "critical", "keys_values_o_proj",
          "topk_critical"),
    # kvpress's composed presses over SnapKVPress: the snapkv_kvpress preset plus a wrapper knob (issue #54 item 2).
    Claim("ChunkKVPress_SnapKVPress", "snapkv_kvpress", _snapkv(16, selection="chunkkv", selection_length=8),
          "chunkkv", "window16", "chunks"),
    Claim("ChunkKVPress_SnapKVPress_window64", "snapkv_kvpress", _snapkv(64, selection="chunkkv"), "chunkkv",
          "window64", "chunks"),
    Claim("BlockPress_SnapKVPress", "snapkv_kvpress", _snapkv(8, selection="block", selection_length=32), "block",
          "window8_hidden", "topk"),
    Claim("ChunkPress_SnapKVPress", "snapkv_kvpress", _snapkv(8, selection="chunk", selection_length=32), "chunk",
          "window8_hidden", "topk"),
    Claim("CriticalKVPress_SnapKVPress", "snapkv_kvpress", _snapkv(16, rescale="critical"), "critical",
          "window16_o_proj", "topk_critical"),
    Claim("CriticalKVPress_SnapKVPress_window64", "snapkv_kvpress", _snapkv(64, rescale="critical"), "critical",
          "window64_o_proj", "topk_critical"),
    Claim("CriticalAdaKVPress_SnapKVPress", "snapkv_kvpress", _snapkv(16, allocation="ada_kvpress",
          rescale="critical"), "ada_kvpress+critical", "window16_o_proj", "critical_ada"),
    Claim("AdaKVPress_SnapKVPress", "snapkv_kvpress", _snapkv(16, allocation="ada_kvpress"), "ada_kvpress",
          "window16", "layer_topk"),
    Claim("AdaKVPress_SnapKVPress_window64", "snapkv_kvpress", _snapkv(64, allocation="ada_kvpress"), "ada_kvpress",
          "window64", "layer_topk"),
    # kvpress's arithmetic where S (1 - r) is fractional (item 3): the counts of <r>cr are kvpress's own.
    Claim("ChunkKVPress_KnormPress_fractional", "knorm", (("selection", "chunkkv"), ("selection_length", 8)),
          "chunkkv", "keys_values", "chunks", forms=("cr",)),
    Claim("ChunkPress_KnormPress_fractional", "knorm", (("selection", "chunk"), ("selection_length", 20)), "chunk",
          "keys_values", "topk", forms=("cr",)),
    Claim("CriticalKVPress_KnormPress_fractional", "knorm", (("rescale", "critical"),), "critical",
          "keys_values_o_proj", "topk_critical", forms=("cr",)),
    Claim("CompactorPress_fractional", "compactor", (("chunk_size", 32),), "-", "hidden_states",
          "topk_compactor", forms=("cr",)),
    # kvpress's decoding presses (item 1): method.params.decode_interval (decode_target / decode_ratio), every
    # compression step of the recorded tiny Llama's decoding compared.
    *(Claim(recording, method, (), "decode_interval", decoding=True) for recording, method in (
        ("DecodingPress_KnormPress_interval5", "knorm"),
        ("DecodingPress_SnapKVPress_interval3", "snapkv_kvpress"),
        ("DecodingPress_SnapKVPress_interval5", "snapkv_kvpress"),
        ("DecodingPress_ExpectedAttentionPress_interval6", "expected_attention"),
        ("CompressionRatioDecodingPress_KnormPress_interval3", "knorm"),
        ("CompressionRatioDecodingPress_SnapKVPress_interval3", "snapkv_kvpress"),
        ("CompressionRatioDecodingPress_ExpectedAttentionPress_interval8", "expected_attention"),
        ("PrefillDecodingPress_KnormPress_interval5", "knorm"),
        ("PrefillDecodingPress_SnapKVPress", "snapkv_kvpress"),
        ("PrefillDecodingPress_ExpectedAttentionPress", "expected_attention"),
        ("PrefillDecodingPress_SnapKVPress_window64", "snapkv_kvpress"),
    )),
)  # fmt: skip


# Presses replayed by their own parity tests (:data:`REPLAYS`): issue #58's, and KVzip.
_SNAPKV_KNOBS = (
    ("kernel_size", 5),
    ("pooling", "avg"),
    ("pool_padding", "include"),
    ("gqa_reduce", "after_pool"),
    ("score_dtype", "model"),
)
_MEAN_ROWS = (("row_reduce", "mean"),)  # kvpress averages SnapKV's window rows
_COMPOSED = "budget `<max(1, int(n_1 / 2))>/layer`, n_1 = max(1, int(S (1 - r))) what the first press keeps"
_GLOBAL = (
    "one top-k over every layer and head (per layer when `layerwise`): `tied` = kvbench's whole selection keeps "
    "kvpress's total and is a valid top-k of kvpress's scores"
)
_SINKS = "scores equal bit for bit past the sinks"
_LEARNED = "the recorded weights (CPU-trained for the model, not NVIDIA's), scores equal bit for bit"
REPLAYED_CLAIMS: tuple[Claim, ...] = (
    Claim("ComposedPress_SnapKVPress_KnormPress", "composed", (("stages", ("snapkv_kvpress", "knorm")),),
          replay="composed", case_knobs=("ratios",), forms=("per_layer",), note=f"ratios `[r]`; {_COMPOSED}"),
    Claim("ComposedPress_KeyDiffPress_KnormPress", "composed", (("stages", ("keydiff", "knorm")),),
          replay="composed", case_knobs=("ratios",), forms=("per_layer",), note=f"ratios `[r]`; {_COMPOSED}"),
    Claim("PerLayerCompressionPress_KnormPress", "per_layer", (("press", "knorm"),), replay="per_layer",
          case_knobs=("compression_ratios",), forms=("cr",),
          note="budget `<mean of the layer ratios>cr`: layer l keeps kvpress's max(1, int(S (1 - r_l)))"),
    Claim("PerLayerCompressionPress_SnapKVPress", "per_layer", (("window", 64), ("press", "snapkv"), *_SNAPKV_KNOBS),
          replay="per_layer", case_knobs=("compression_ratios",), forms=("cr",),
          note="budget `<mean of the layer ratios>cr`: layer l keeps kvpress's max(1, int(S (1 - r_l)))"),
    Claim("DMSPress_KnormPress", "dms", (("window", 1), ("press", "knorm"), ("sliding_window_size", 16)),
          replay="dms", forms=("thr",), tie="none"),
    Claim("DMSPress_SnapKVPress", "dms", (("window", 16), ("press", "snapkv"), *_SNAPKV_KNOBS, *_MEAN_ROWS,
          ("sliding_window_size", 32)), replay="dms", forms=("thr",), tie="none"),
    Claim("DMSPress_KnormPress_decoding", "dms", (("window", 1), ("press", "knorm"), ("sliding_window_size", 8),
          ("decoding", True)), replay="dms_decoding", forms=("thr",), tie="none",
          note="prompt, question and 10 single steps of the recorded tiny Llama; the final cache compared"),
    Claim("MergingPress_KnormPress", "merging", (("window", 1), ("press", "knorm"), ("similarity_threshold", 0.0),
          ("merge_fraction", 1.0)), replay="merging",
          forms=("per_layer",), note="`same`: positions, keys and merged values all equal bit for bit"),
    Claim("MergingPress_KnormPress_gated", "merging", (("window", 1), ("press", "knorm"),
          ("similarity_threshold", 0.1), ("merge_fraction", 0.75)), replay="merging", forms=("per_layer",),
          note="`same`: positions, keys and merged values all equal bit for bit"),
    Claim("MergingPress_SnapKVPress", "merging", (("window", 16), ("press", "snapkv"), *_SNAPKV_KNOBS, *_MEAN_ROWS,
          ("similarity_threshold", 0.0), ("merge_fraction", 1.0)), replay="merging", forms=("per_layer",),
          note="`same`: positions, keys and merged values all equal bit for bit (a `tied` head's values differ)"),
    Claim("CAMPress_KnormPress", "cam", (("compression_interval", 4), ("target_size", 40), ("merge_budget", 4)),
          replay="cam", forms=("per_layer",), tie="none",
          note="budget `<S>/layer` (the prompt kept whole, as CAMPress), question and 10 single steps of the recorded "
               "tiny Llama; `same`: the final cache's positions and merged values equal bit for bit"),
    Claim("EntropyGatedChunkKVPress_KnormPress", "entropy_chunkkv", (("window", 1), ("press", "knorm"),
          ("chunk_length", 8), ("low_entropy_chunk_length", 4)), replay="entropy_chunkkv", tie="none"),
    Claim("EntropyGatedChunkKVPress_SnapKVPress", "entropy_chunkkv", (("window", 16), ("press", "snapkv"),
          *_SNAPKV_KNOBS, ("chunk_length", 10), ("low_entropy_chunk_length", 4)), replay="entropy_chunkkv",
          tie="none"),
    Claim("LUKVPress_KnormPress_seeded_curve", "lukv", (("press", "knorm"), ("epsilon", REMOVED)), replay="lukv",
          case_knobs=("curve",),
          forms=("cr",), tie="none", note="the recording's seeded stand-in curve (not LU-KV's download) as a file"),
    Claim("LUKVPress_ExpectedAttentionPress_seeded_curve", "lukv", (("press", "expected_attention"),
          ("epsilon", 0.02)), replay="lukv", case_knobs=("curve",), forms=("cr",), tie="none",
          note="the recording's seeded stand-in curve (not LU-KV's download) as a file"),
    Claim("CapPress", "cap", replay="cap", forms=("per_layer",), note="scores equal bit for bit"),
    Claim("QFilterPress_seeded_filters", "qfilter", replay="qfilter", case_knobs=("filters",), forms=("per_layer",),
          note="the recording's seeded stand-in filters (not the Hub's) as a file; scores equal bit for bit"),
    Claim("KVComposePress", "kvcompose", (("structured", True),), replay="kvcompose", forms=("cr",),
          note="the recorded tiny Llama prefilled and its context replayed, both in eager attention as kvpress's "
               "forwards (kvbench's session: eager_attention); scores equal bit for bit"),
    Claim("KVComposePress_unstructured", "kvcompose", (("structured", False),), replay="kvcompose", forms=("cr",),
          note="as KVComposePress; one top-k over every layer and head"),
    Claim("learned/KVzapPress_tiny-niah", "kvzap", replay="kvzap", case_knobs=("model_type", "checkpoint"),
          note=f"the embedded tiny model's prefill; {_LEARNED}"),
    Claim("learned/KVzapPress_SmolLM2-135M-Instruct", "kvzap", replay="kvzap",
          case_knobs=("model_type", "checkpoint"), note=f"SmolLM2-135M-Instruct's prefill; {_LEARNED}"),
    Claim("learned/FastKVzipPress_tiny-niah", "fastkvzip", replay="fastkvzip",
          case_knobs=("checkpoint", "n_sink", "layerwise", "window_size", "window_ratio"), forms=("cr",),
          note=f"the embedded tiny model's prefill; {_LEARNED}; {_GLOBAL}"),
    Claim("learned/RestoreKVPress_tiny-niah", "restorekv", replay="restorekv",
          case_knobs=("checkpoint", "n_sink", "chunk_size", "layerwise"), forms=("cr",),
          note=f"the embedded tiny model, context replayed, restore tokens from a LoRA pass (kvpress loads the adapter "
               f"with PEFT); {_LEARNED}; {_GLOBAL}; restore tokens' keys and values checked too"),
    Claim("kvzip/KVgradPress", "kvgrad", replay="kvgrad", case_knobs=("n_sink", "chunk_size", "layerwise"),
          forms=("cr",), note=f"the recorded tiny Llama, context replayed with backward passes; {_GLOBAL}; {_SINKS}"),
    Claim("kvzip/KVgradPress_SmolLM2-135M-Instruct", "kvgrad", replay="kvgrad",
          case_knobs=("n_sink", "chunk_size", "layerwise"), forms=("cr",),
          note=f"SmolLM2-135M-Instruct, context replayed with backward passes; {_GLOBAL}; {_SINKS}"),
    Claim("kvzip/KVzipPress", "kvzip", replay="kvzip", case_knobs=("n_sink", "chunk_size", "layerwise"),
          forms=("cr",), note=f"the recorded tiny Llama, context replayed; {_GLOBAL}"),
)  # fmt: skip

#: A claim's replay (:attr:`Claim.replay`): ``module:function`` of its parity test, ``(claim, form, dtype) ->
#: KeptTally`` (imported when replayed).
REPLAYS = {
    name: f"tests.methods.test_{module}:replay_{name}"
    for name, module in {
        "composed": "composed", "per_layer": "per_layer", "dms": "dms", "dms_decoding": "dms", "merging": "merging",
        "cam": "cam", "entropy_chunkkv": "entropy_chunkkv", "lukv": "lukv", "cap": "cap", "kvcompose": "kvcompose",
        "kvzap": "kvzap", "fastkvzip": "fastkvzip", "kvgrad": "kvgrad", "kvzip": "kvzip", "qfilter": "qfilter",
        "restorekv": "restorekv",
    }.items()
}  # fmt: skip
CLAIMS = (*CLAIMS, *REPLAYED_CLAIMS)


def claims_of(recording: str) -> list[Claim]:
    return [claim for claim in CLAIMS if claim.recording == recording]


def tally(claim: Claim, form: str, dtype: str) -> KeptTally:
    """The claim's cases in ``dtype`` replayed under budget ``form`` (a prefill claim: each recorded layer through
    kvbench's session; a decoding claim: the recorded tiny Llama's decoding, every compression step)."""
    if claim.decoding:
        from tests.methods.decoding_replay import replay_decoding

        return replay_decoding(claim, form, dtype)
    if claim.replay:
        module, function = REPLAYS[claim.replay].split(":")
        return getattr(importlib.import_module(module), function)(claim, form, dtype)
    return replay_kept(
        claim.build(),
        claim.recording,
        OBSERVATIONS[claim.observation],
        TIES[claim.tie],
        form=form,
        dtypes=(dtype,),
        before_case=BEFORE_CASE.get(claim.recording),
    )


def recording_path(recording: str) -> Path:
    """The file of a recording: ``<name>`` in ``tests/fixtures/reference/kvpress/``, ``learned/<name>`` and
    ``kvzip/<name>`` in those folders of ``tests/fixtures/reference/``."""
    if recording.startswith(RECORDING_FOLDERS):
        return RECORDINGS.parent / f"{recording}.json"
    return RECORDINGS / f"{recording}.json"


def page_recordings() -> list[str]:
    """Every recording the page accounts for: those of ``tests/fixtures/reference/kvpress/``, then ``learned/<name>``
    and ``kvzip/<name>`` (the learned scorers', KVzip's and KVgrad's recordings, in their own formats)."""
    others = [
        f"{folder}{path.stem}" for folder in RECORDING_FOLDERS for path in (RECORDINGS.parent / folder).glob("*.json")
    ]
    return recorded_presses() + sorted(others)


#: kvpress 0.5.5 presses kvbench has not built (no recording, no claim; the page names them).
NOT_BUILT: tuple[str, ...] = ()
#: Why a recording has no claim (the page prints it beside the name).
UNCLAIMED_BECAUSE = {
    **dict.fromkeys(
        (
            "CompressionRatioDecodingPress_KnormPress",
            "DecodingPress_KnormPress",
            "DecodingPress_KnormPress_buffer0",
            "PrefillDecodingPress_KnormPress",
        ),
        "the first decoding recordings hold the final cache only (no per-step record to count compressions by): "
        "`tests/methods/test_kvpress_decoding.py` compares it; the step-by-step `_interval` recordings are claimed",
    ),
    **dict.fromkeys(
        ("PyramidKVPress", "PyramidKVPress_window16"),
        "reproduced at `budget=<n>L` (kvpress's layer budgets from their mean), a budget form this table does not "
        "have: `tests/methods/test_kvpress_pyramid.py` checks the layer budgets and tokens, 0 differ",
    ),
    "kvzip/KVzipPress_select": "KVzipPress's selection alone on seeded scores (no model, no kvbench spelling runs it): "
    "`tests/methods/test_kvzip.py` checks `select`, 0 differ",
}


def claim_of(recording: str) -> Claim:
    """The one claim of ``recording``."""
    (claim,) = claims_of(recording)
    return claim


def recording_dtypes(recording: str) -> list[str]:
    """The dtypes a recording has cases in, in :data:`DTYPES` order (every recording format has ``cases[*].dtype``)."""
    present = {case["dtype"] for case in json.loads(recording_path(recording).read_text())["cases"]}
    return [dtype for dtype in DTYPES if dtype in present]
