"""Hot-path kernels of kvbench, each with a pure-torch reference (:mod:`kernels.reference`).

* :func:`causal_column_sums` -- H2O's prefill score: the attention each key receives from every causal query,
  computed in row blocks (peak ``H_q x block x S``, never ``S x S``).
* :func:`window_stats` -- fused observation-window scoring: column sum / sum of squares / max / entropy and row
  log-sum-exp / entropy of the window's softmax attention, without a ``W x S`` float32 matrix per head.
* :func:`paged_append` -- append decoded (or prefilled) tokens to a paged per-head cache, O(heads) per token.
* :func:`copy_rows` -- the gather/scatter behind compaction after eviction.
* :func:`paged_decode_attention` -- split-K decode attention over per-head paged KV (any page size).

Triton runs automatically on CUDA tensors when ``triton`` is installed; otherwise the torch implementations run.
"""

from kernels.ops import (
    causal_column_sums,
    copy_rows,
    paged_append,
    paged_decode_attention,
    triton_available,
    use_triton,
    window_stats,
)
from kernels.stats import WindowStats

__all__ = [
    "WindowStats",
    "causal_column_sums",
    "copy_rows",
    "paged_append",
    "paged_decode_attention",
    "triton_available",
    "use_triton",
    "window_stats",
]
