"""kvpress's BlockPress and ChunkPress over any scorer (``method.params.selection=block`` / ``chunk``) against
NVIDIA/kvpress 0.5.5's recordings: the same kept tokens per head."""

from __future__ import annotations

import torch

from kvbench.eviction.base import WindowObservation, build_method
from tests.methods.kvpress_replay import keep_one_layer
from tests.methods.wrapper_replay import replay_kept


def scorer_method(family: str, selection: str, length: int):
    return build_method(
        {"name": family, "family": family, "params": {"selection": selection, "selection_length": length}}
    )


def test_block_over_knorm_and_keydiff_keeps_kvpress_tokens() -> None:
    """Block size 32, tiny-Llama S 48 / 128, float32 and bfloat16: the scorer scores the kept tokens plus each block."""
    for family, press in (("knorm", "BlockPress_KnormPress"), ("keydiff", "BlockPress_KeyDiffPress")):
        tally = replay_kept(scorer_method(family, "block", 32), press)
        assert tally.cases == 16 and tally.same == tally.selections == 16 * 2 * 2, (press, tally)


def test_chunk_over_knorm_keeps_kvpress_tokens() -> None:
    """Chunk length 20: each chunk keeps its own ``max(1, int(len (1 - r)))`` (S 128 at 0.875: 13 tokens, not 16)."""
    tally = replay_kept(scorer_method("knorm", "chunk", 20), "ChunkPress_KnormPress")
    assert tally.cases == 16 and tally.same == tally.selections == 16 * 2 * 2, tally


def test_block_scores_candidates_only_and_chunk_splits_the_budget() -> None:
    """KeyDiff under ``block`` sees only the candidates' keys (its mean key changes with them); ``chunk`` keeps each
    chunk's share of the budget."""
    keys = torch.randn(1, 12, 4, generator=torch.Generator().manual_seed(0))
    observation = WindowObservation(0, 1, torch.zeros(1, 1, 4), keys, keys, 0.5)
    kept = keep_one_layer(scorer_method("knorm", "chunk", 6), observation, 6)[0]
    assert sum(p < 6 for p in kept) == 3 and len(kept) == 6
    norms = keys[0].norm(dim=-1)
    assert kept == sorted(
        [int(i) for i in (-norms[:6]).topk(3).indices] + [6 + int(i) for i in (-norms[6:]).topk(3).indices]
    )
    block = keep_one_layer(scorer_method("knorm", "block", 4), observation, 4)[0]
    assert block == sorted(int(i) for i in (-norms).topk(4).indices)  # knorm: blockwise = global top-k
