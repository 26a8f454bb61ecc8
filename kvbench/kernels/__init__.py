"""Hot-path kernels of kvbench, each with a pure-torch reference (:mod:`kvbench.kernels.reference`).

* :func:`window_stats` -- fused observation-window scoring: column sum / centred sum of squares / max / entropy and
  row log-sum-exp / entropy of the window's softmax attention, without a ``W x S`` float32 matrix per head.
* :func:`causal_column_sums` -- H2O's prefill score: the attention each key receives from every causal query row
  (or from one prefill chunk's rows), never an ``R x S`` matrix.
* :func:`paged_append` -- append decoded (or prefilled) tokens to a paged per-head cache, O(heads) per token.
* :func:`copy_rows` -- the gather/scatter behind compaction after eviction.
* :func:`paged_decode_attention` -- split-K decode attention over per-head paged KV (any page size).

Triton runs automatically on CUDA tensors when ``triton`` is installed; otherwise the torch implementations run.
The two scoring ops also take ``impl="dense"``: the materialising reference, for comparisons.
"""

from kvbench.kernels.fused_scores import SCORING_IMPLS, causal_column_sums, window_stats
from kvbench.kernels.ops import copy_rows, paged_append, paged_decode_attention, triton_available, use_triton
from kvbench.kernels.stats import WindowStats

__all__ = [
    "SCORING_IMPLS",
    "WindowStats",
    "causal_column_sums",
    "copy_rows",
    "paged_append",
    "paged_decode_attention",
    "triton_available",
    "use_triton",
    "window_stats",
]
