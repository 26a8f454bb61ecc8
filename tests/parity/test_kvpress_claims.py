"""kvbench's support claims against kvpress 0.5.5 (issue #54): the generated page (``docs/methods/kvpress-support.md``,
``scripts/kvpress_support_table.py``) is current with the recordings, and the claims a test replays here keep
kvpress's tokens with the counts the page prints.

The page's every row comes from :func:`tests.parity.kvpress_claims.tally`; this test replays the claims of issue
#54's recordings (the compositions over SnapKVPress, the fractional ``<r>cr`` cases, the decoding presses over SnapKV
and Expected Attention) in the ``cr`` form and compares them with the page (the other rows' recordings are replayed by
their own tests in ``tests/methods/``; the script replays every row).
"""

from __future__ import annotations

import pytest

from tests.parity.kvpress_claims import CLAIMS, Claim, claims_of, recording_dtypes, tally
from tests.parity.kvpress_support_page import PAGE, all_row_keys, page_rows, static_part

#: The claims replayed here (cr form): issue #54's recordings, the cheap ones in both dtypes, the decoding ones in
#: float32 (``test_kvpress_decoding.py`` replays the window-64 one in both).
REPLAYED = [
    *(
        (claim, dtype)
        for claim in CLAIMS
        if not claim.decoding
        and claim.recording.endswith(("_window64", "_fractional", "BlockPress_SnapKVPress", "ChunkPress_SnapKVPress"))
        for dtype in recording_dtypes(claim.recording)
    ),
    (claims_of("DecodingPress_SnapKVPress_interval3")[0], "float32"),
    (claims_of("DecodingPress_ExpectedAttentionPress_interval6")[0], "float32"),
]


def test_the_page_is_current_with_the_recordings() -> None:
    """Every recording is on the page (as claimed rows, or among the unclaimed, with its digest): a recording added
    or changed since the page was written fails here until ``scripts/kvpress_support_table.py`` is rerun."""
    text = PAGE.read_text(encoding="utf-8")
    assert text.endswith(static_part()), "rerun scripts/kvpress_support_table.py"
    assert list(page_rows(text)) == all_row_keys(), "rerun scripts/kvpress_support_table.py"


def test_every_claim_names_a_recording_and_a_known_replay() -> None:
    from tests.parity.kvpress_claims import OBSERVATIONS, TIES
    from tests.reference_recordings import recorded_presses

    for claim in CLAIMS:
        assert claim.recording in recorded_presses(), claim.recording  # no claim without a recording
        assert claim.observation in OBSERVATIONS and claim.tie in TIES, claim
        claim.build()  # the spelling builds (a composition kvbench refuses would raise here)


@pytest.mark.parametrize(("claim", "dtype"), REPLAYED, ids=[f"{claim.recording}-{dtype}" for claim, dtype in REPLAYED])
def test_claim_keeps_kvpress_tokens_as_the_page_says(claim: Claim, dtype: str) -> None:
    measured = tally(claim, "cr", dtype)
    printed = page_rows(PAGE.read_text(encoding="utf-8"))[claim.recording, claim.spelling, "cr", dtype]
    assert measured == printed, "rerun scripts/kvpress_support_table.py"
    assert measured.differ == 0 and measured.same > 0 and measured.cases > 0, measured


def test_bfloat16_decoding_over_snapkv_differs_only_after_the_first_layer() -> None:
    """The page's bfloat16 rows of SnapKV's decoding presses that differ: only at layers after the first, whose inputs
    come from attention over kvbench's cache in position order (kvpress's is in top-k order: the sums round apart)."""
    measured = tally(claims_of("DecodingPress_SnapKVPress_interval5")[0], "cr", "bfloat16")
    assert measured.differ > 0 and 0 not in measured.differing_layers and measured.same > 10 * measured.differ
