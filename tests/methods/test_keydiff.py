"""KeyDiff against NVIDIA/kvpress's ``KeyDiffPress`` (0.5.5): the same scores and the same kept tokens."""

from __future__ import annotations

from kvbench.eviction.base import build_method
from tests.methods.kvpress_replay import replay


def test_keydiff_scores_and_selections_match_kvpress() -> None:
    """Every recorded case (tensor and tiny-Llama, float32 and bfloat16): scores bit for bit, kept tokens per head."""
    method = build_method({"name": "keydiff", "family": "keydiff"})
    assert method.keep_window is False
    tally = replay(method, "KeyDiffPress")
    assert tally.cases == 48 and tally.selections == 32 * 2 + 16 * 2 * 2  # tensor: 1 layer x 2 heads, model: 2 x 2
    assert tally.same + tally.tied_valid == tally.selections
