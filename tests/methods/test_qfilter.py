"""Q-Filters against NVIDIA/kvpress's ``QFilterPress`` (0.5.5, recorded with seeded stand-in filters since the Hub's
are unreachable), and the paper's filter computation (SVD of the queries) that ``filters: null`` and
``scripts/compute_qfilters.py`` use."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from kvbench.eviction.base import WindowObservation, build_method
from kvbench.methods.qfilter import FILTERS_KEY, filters_from_queries
from tests.methods.kvpress_replay import keep_one_layer, replay
from tests.methods.wrapper_replay import KeptTally
from tests.parity.kvpress_claims import Claim, claim_of
from tests.reference_recordings import stored_input


def replay_qfilter(claim: Claim, form: str, dtype: str) -> KeptTally:
    """Every case of the claim's recording (``QFilterPress_seeded_filters``) in ``dtype`` at
    ``budget=<max(1, int(S (1 - r)))>/layer`` (``form``: only ``per_layer``), the recording's seeded filters written to
    a file as ``method.params.filters``: scores bit for bit (asserted); per layer and head kvpress's tokens, another
    valid top-k of its scores tied at the cut, or different."""
    assert form == "per_layer", form
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "filters.safetensors"
        save_file({FILTERS_KEY: stored_input("qfilters")}, str(path))
        replayed = replay(claim.build(filters=str(path)), claim.recording, dtypes=(dtype,), strict=False)
    differ = replayed.selections - replayed.same - replayed.tied_valid
    return KeptTally(replayed.cases, replayed.same, replayed.tied_valid, differ)


def test_qfilter_scores_and_selections_match_kvpress() -> None:
    """The recorded tiny-Llama cases with kvpress's seeded filters: scores bit for bit, kept tokens per head."""
    claim = claim_of("QFilterPress_seeded_filters")
    tallies = [replay_qfilter(claim, "per_layer", dtype) for dtype in ("float32", "bfloat16")]
    assert sum(t.cases for t in tallies) == 16 and sum(t.selections for t in tallies) == 64
    assert all(t.differ == 0 for t in tallies), tallies


def test_filters_point_away_from_the_mean_query_direction_and_keep_the_keys_queries_favour() -> None:
    """The principal query direction ``u`` (oriented with the queries) gives filters ``-u``; kept keys are those the
    queries attend to most (largest ``u . k``), also when the filters come from the prompt (``filters: null``)."""
    generator = torch.Generator().manual_seed(0)
    direction = torch.nn.functional.normalize(torch.randn(16, generator=generator), dim=0)
    queries = torch.randn(4, 64, 16, generator=generator) * 0.1 + 3 * direction  # 2 KV heads, groups of 2
    filters = filters_from_queries(queries, num_kv_heads=2)
    assert filters.shape == (2, 16)
    torch.testing.assert_close(filters, -direction.expand(2, 16), atol=0.02, rtol=0)
    keys = torch.randn(2, 64, 16, generator=generator)
    observation = WindowObservation(0, 1, queries[:, -1:], keys, keys, 0.25, prompt_queries=queries)
    method = build_method({"name": "qfilter", "family": "qfilter"})
    assert method.scorer.prompt_rows(torch.float32).queries
    kept = keep_one_layer(method, observation, 8)
    for head in range(2):
        assert kept[head] == sorted((keys[head] @ -filters[head]).topk(8).indices.tolist())
        assert (keys[head, kept[head]] @ direction).mean() > (keys[head] @ direction).mean() + 0.5


def test_a_filter_file_of_the_wrong_shape_is_refused(tmp_path: Path) -> None:
    """Filters for another model (wrong layer count) are an error naming the shape this model needs."""
    path = tmp_path / "filters.safetensors"
    save_file({FILTERS_KEY: torch.zeros(3, 2, 16)}, str(path))
    method = build_method({"name": "qfilter", "family": "qfilter", "params": {"filters": str(path)}})
    keys = torch.randn(2, 10, 16)
    with pytest.raises(ValueError, match=r"\(1, 2, 16\)"):
        method.scorer.score(WindowObservation(0, 1, keys[:, -1:], keys, keys, 0.25))
