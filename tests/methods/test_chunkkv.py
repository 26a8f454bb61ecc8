"""ChunkKV over any scorer (``method.params.selection=chunkkv``) against NVIDIA/kvpress's ``ChunkKVPress`` (0.5.5):
the same whole chunks kept on every head, or another valid top-k of kvpress's chunk scores where they tie."""

from __future__ import annotations

import pytest
import torch

from kvbench.eviction.base import WindowObservation, build_method
from kvbench.eviction.selection import wrap_selection
from tests.methods.helpers import method_from_yaml
from tests.methods.kvpress_replay import keep_one_layer
from tests.methods.wrapper_replay import replay_kept, window_observation
from tests.reference_recordings import DTYPES, RecordedCase, boundary_tie, is_valid_topk, kvpress_n_kept

CHUNK = 8  # the recordings' chunk_length


def chunk_scores(case: RecordedCase, layer: int) -> torch.Tensor:
    """``[n_chunks]`` kvpress's chunk scores from its recorded wrapped scores, in the case's dtype: the sum over the KV
    heads, then the mean over each chunk (the last one shorter)."""
    summed = case.layer_scores(layer).to(DTYPES[case.dtype]).sum(dim=0)
    return torch.stack([part.mean() for part in summed.split(CHUNK)])


def valid_chunk_choice(case: RecordedCase, layer: int, kept: list[list[int]]) -> bool:
    """Whether every head keeps the same whole chunks, another top-k of kvpress's chunk scores that tie at the cut."""
    scores = chunk_scores(case, layer)
    chunks = sorted({position // CHUNK for position in kept[0]})
    whole = sum(min(CHUNK, case.length - c * CHUNK) for c in chunks) == len(kept[0])
    same_heads = all(positions == kept[0] for positions in kept)
    return whole and same_heads and boundary_tie(scores, len(chunks)) and is_valid_topk(scores, chunks)


def test_chunkkv_over_knorm_keeps_kvpress_chunks() -> None:
    """Tensor (S 16 / 37 / 64 / 128) and tiny-Llama cases, float32 and bfloat16."""
    params = {"selection": "chunkkv", "selection_length": 8}
    method = build_method({"name": "knorm", "family": "knorm", "params": params})
    tally = replay_kept(method, "ChunkKVPress_KnormPress", valid=valid_chunk_choice)
    assert tally.cases == 48 and tally.differ == 0 and tally.same > 0
    assert tally.selections == 32 * 2 + 16 * 2 * 2


def test_chunkkv_over_snapkv_keeps_kvpress_chunks() -> None:
    """kvpress's SnapKV (window 16) under ChunkKV; the window scored ``max + 1`` before chunking, as kvpress pads it."""
    method = wrap_selection(method_from_yaml("snapkv_kvpress", window=16), "chunkkv", CHUNK)
    tally = replay_kept(method, "ChunkKVPress_SnapKVPress", window_observation(16), valid=valid_chunk_choice)
    assert tally.cases == 16 and tally.differ == 0 and tally.same > 0


def test_chunkkv_keeps_whole_chunks_of_the_chunk_scores() -> None:
    """Behaviour, on scores we choose: the best whole chunks, the same on every head, a short context falls back to
    each head's own top-k, the count follows the budget's share of the context."""
    method = build_method({"name": "k", "family": "knorm", "params": {"selection": "chunkkv", "selection_length": 4}})
    keys = torch.ones(2, 12, 4)
    keys[:, 4:8] = 0.1  # chunk 1 has the smallest norms on both heads

    observation = WindowObservation(0, 1, torch.zeros(2, 1, 4), keys, keys, 0.5)
    assert keep_one_layer(method, observation, 4) == [[4, 5, 6, 7]] * 2
    assert len(keep_one_layer(method, observation, 8)[0]) == 8  # 3 chunks x 8 / 12 = 2 chunks
    short = WindowObservation(0, 1, torch.zeros(2, 1, 4), keys[:, :3], keys[:, :3], 0.5)
    assert [len(p) for p in keep_one_layer(method, short, 2)] == [2, 2]


def test_selection_refuses_ada_and_bad_values() -> None:
    with pytest.raises(ValueError, match="allocation=uniform"):
        build_method({"name": "k", "family": "knorm", "params": {"selection": "chunkkv", "allocation": "ada"}})
    with pytest.raises(ValueError, match="chunkkv"):
        build_method({"name": "k", "family": "knorm", "params": {"selection": "chunks"}})


def test_kvpress_budget_helper_matches_chunk_count() -> None:
    """kvbench keeps ``max(1, floor(n_chunks k / S))`` chunks: kvpress's ``int(n_chunks (1 - r))`` at every recorded
    length and ratio (``k = max(1, int(S (1 - r)))``)."""
    for length in (16, 37, 48, 64, 128):
        chunks = -(-length // CHUNK)
        for ratio in (0.25, 0.5, 0.75, 0.875):
            ours = max(1, chunks * kvpress_n_kept(length, ratio) // length)
            assert ours == max(1, int(chunks * (1 - ratio))), (length, ratio)


def test_wrappers_name_the_results_folder_and_compose() -> None:
    """``method=knorm method.params.selection=chunkkv`` runs in ``knorm+chunkkv``; CriticalAdaKV in
    ``knorm+ada_kvpress+critical``; each its own config hash."""
    import kvbench
    from kvbench.app.validation import validate
    from kvbench.eviction.critical import CriticalScorer
    from kvbench.eviction.selection import SelectionScorer
    from kvbench.storage.writers import config_hash

    chunkkv = kvbench.compose_config(method="knorm", budget="64L", overrides=["method.params.selection=chunkkv"])
    critical = ["method.params.rescale=critical", "method.params.allocation=ada_kvpress"]
    critical_ada = kvbench.compose_config(method="knorm", budget="64L", overrides=critical)
    assert [cfg.method.name for cfg in (chunkkv, critical_ada)] == ["knorm+chunkkv", "knorm+ada_kvpress+critical"]
    assert config_hash(chunkkv) != config_hash(critical_ada)
    assert isinstance(validate(chunkkv)[0].scorer, SelectionScorer)
    assert isinstance(validate(critical_ada)[0].scorer, CriticalScorer)
