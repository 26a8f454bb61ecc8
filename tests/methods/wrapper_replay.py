"""Replay kvpress's recorded wrapper presses (ChunkKV, Chunk, Block, AdaKV, ...) through a kvbench method: per case,
layer and KV head, the kept positions of kvbench's session at kvpress's budget against the recorded ones.

Unlike :func:`tests.methods.kvpress_replay.replay`, the scores are not compared (a wrapper's selection is not one
score call); the heads of a layer whose kept sets differ count as ``tied_valid`` when ``valid(case, layer, kept)``
says the layer's selection is another valid choice among tied recorded scores, else as ``differ``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from kvbench.eviction.base import EvictionMethod, WindowObservation
from tests.methods.kvpress_replay import ObservationOf, keep_one_layer, keys_values_observation, model_queries
from tests.reference_recordings import RecordedCase, case_inputs, kvpress_n_kept, load_recording

#: ``(case, layer, kvbench's kept positions per head) -> whether the layer's selection is a valid choice among
#: kvpress's ties`` (asked when some head differs from kvpress's).
TieCheck = Callable[[RecordedCase, int, list[list[int]]], bool]


@dataclass
class KeptTally:
    """Cases replayed and per-(case, layer, head) selections: the same as kvpress's, a valid tie, or different."""

    cases: int = 0
    same: int = 0
    tied_valid: int = 0
    differ: int = 0
    #: The layers where a selection differed (not compared: the page prints the counts only).
    differing_layers: set[int] = field(default_factory=set, compare=False)

    @property
    def selections(self) -> int:
        return self.same + self.tied_valid + self.differ


def replay_kept(
    method: EvictionMethod,
    press: str,
    observation_of: ObservationOf = keys_values_observation,
    valid: TieCheck | None = None,
    form: str = "per_layer",
    dtypes: tuple[str, ...] = ("float32", "bfloat16"),
    before_case: Callable[[RecordedCase], None] | None = None,
) -> KeptTally:
    """Every recorded case of ``press`` in ``dtypes`` through ``method`` under kvpress's budget spelled as ``form``:
    ``per_layer`` (``<max(1, int(S (1 - r)))>/layer``) or ``cr`` (``<r>cr``, kvbench reading r itself)."""
    tally = KeptTally()
    for case in load_recording(press).cases:
        if case.dtype not in dtypes:
            continue
        tally.cases += 1
        n_kept = kvpress_n_kept(case.length, case.compression_ratio)
        budget = f"{case.compression_ratio}cr" if form == "cr" else None
        if before_case is not None:
            before_case(case)  # e.g. the recorder's torch.manual_seed(1234): layer 0 then layer 1 draw from it
        for layer, inputs in enumerate(case_inputs(case)):
            kept = keep_one_layer(method, observation_of(case, layer, inputs), n_kept, budget)
            same = sum(positions == sorted(case.kept[layer][head]) for head, positions in enumerate(kept))
            tally.same += same
            if same < len(kept):
                tied = valid is not None and valid(case, layer, kept)
                tally.tied_valid += (len(kept) - same) if tied else 0
                tally.differ += 0 if tied else len(kept) - same
    return tally


def recent_queries_observation(
    case: RecordedCase, layer: int, inputs: dict[str, torch.Tensor], window: int
) -> WindowObservation:
    """The recorded layer's keys and values with the tiny Llama's last ``window`` queries (a tensor case: its last
    key as the one query)."""
    keys, values = inputs["keys"][0], inputs["values"][0]
    queries = model_queries(case, layer, inputs)[:, -window:] if case.kind == "model" else keys[:, -1:]
    return WindowObservation(layer, 2, queries, keys, values, keys.shape[-1] ** -0.5)


def cases_in(recording: str, dtype: str, tally: KeptTally) -> Iterator[RecordedCase]:
    """The cases of ``recording`` in ``dtype``, each counted in ``tally.cases``."""
    for case in load_recording(recording).cases:
        if case.dtype == dtype:
            tally.cases += 1
            yield case


def tally_exact(tally: KeptTally, kept: list, recorded: list[list[int]]) -> None:
    """Add one layer's heads to ``tally``: kvbench's kept positions per head (lists or tensors) equal to kvpress's
    recorded ones (``same``) or not (``differ``; no tie rule)."""
    same = sum(sorted(map(int, ours)) == sorted(theirs) for ours, theirs in zip(kept, recorded, strict=True))
    tally.same, tally.differ = tally.same + same, tally.differ + len(recorded) - same


def window_observation(window: int) -> ObservationOf:
    """The observation of a window scorer (SnapKV): the tiny Llama's last ``window`` queries, keys and values."""

    def observation(case: RecordedCase, layer: int, inputs: dict[str, torch.Tensor]) -> WindowObservation:
        keys, values = inputs["keys"][0], inputs["values"][0]
        queries = model_queries(case, layer, inputs)[:, -window:]
        return WindowObservation(layer, 2, queries, keys, values, keys.shape[-1] ** -0.5)

    return observation
