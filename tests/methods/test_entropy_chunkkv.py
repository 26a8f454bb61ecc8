"""EntropyGatedChunkKV (kvpress's ``EntropyGatedChunkKVPress``, issue #58) against NVIDIA/kvpress 0.5.5's recordings:
every recorded case (KNorm on tensors and the tiny Llama, SnapKV on the tiny Llama), float32 and bfloat16, keeps
kvpress's tokens (the same on every head), exactly the budget."""

from __future__ import annotations

import pytest
import torch

from kvbench.methods.entropy_chunkkv import entropy_gated_chunks
from tests.methods.kvpress_replay import keep_one_layer
from tests.methods.wrapper_replay import KeptTally, cases_in, recent_queries_observation, tally_exact
from tests.parity.kvpress_claims import Claim, claim_of
from tests.reference_recordings import case_inputs, kvpress_n_kept, load_recording

SNAPKV_KVPRESS = {"kernel_size": 5, "pooling": "avg", "pool_padding": "include", "gqa_reduce": "after_pool"}
SNAPKV_KVPRESS |= {"score_dtype": "model"}


RECORDINGS = ["EntropyGatedChunkKVPress_KnormPress", "EntropyGatedChunkKVPress_SnapKVPress"]


def replay_entropy_chunkkv(claim: Claim, form: str, dtype: str) -> KeptTally:
    """Every case of the claim's recording in ``dtype`` under kvpress's budget spelled as ``form`` (``per_layer``:
    ``<max(1, int(S (1 - r)))>/layer``, ``cr``: ``<r>cr``): per layer and head kvpress's tokens exactly, or
    different."""
    window = dict(claim.knobs)["window"]  # the observation window of the wrapped press's queries
    tally = KeptTally()
    for case in cases_in(claim.recording, dtype, tally):
        chunks = {key: case.settings[key] for key in ("chunk_length", "low_entropy_chunk_length")}
        method = claim.build(**chunks)
        n_kept = kvpress_n_kept(case.length, case.compression_ratio)
        budget = f"{case.compression_ratio}cr" if form == "cr" else None
        for layer, inputs in enumerate(case_inputs(case)):
            kept = keep_one_layer(method, recent_queries_observation(case, layer, inputs, window), n_kept, budget)
            tally_exact(tally, kept, case.kept[layer])
    return tally


@pytest.mark.parametrize("press", RECORDINGS)
@pytest.mark.parametrize("form", ["per_layer", "cr"])
def test_entropy_gated_chunkkv_keeps_kvpress_tokens(press: str, form: str) -> None:
    tallies = [replay_entropy_chunkkv(claim_of(press), form, dtype) for dtype in ("float32", "bfloat16")]
    assert all(t.differ == 0 for t in tallies), tallies
    assert sum(t.same for t in tallies) == sum(len(case.kept) * 2 for case in load_recording(press).cases)


def test_a_spiky_important_chunk_keeps_its_top_tokens_and_the_budget_moves_on() -> None:
    """Chunks of 4: the best chunk has one high token (spiky) and keeps only its top 2; the freed budget takes the
    next chunk whole."""
    scores = torch.tensor([0.5, 9.0, 0.0, 0.0, 2.0, 2.1, 2.0, 2.1, 1.0, 1.1, 1.0, 1.1, 0.1, 0.2, 0.1, 0.2])
    keep = entropy_gated_chunks(scores, budget=6, chunk=4, spiky_keep=2)
    assert keep.nonzero().flatten().tolist() == [0, 1, 4, 5, 6, 7]
    assert entropy_gated_chunks(scores, budget=3, chunk=4, spiky_keep=2).nonzero().flatten().tolist() == [0, 1, 5]
