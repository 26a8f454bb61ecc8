"""The registered attention function (:mod:`.function`) and what it calls: the score extras
(:mod:`.extras`), the ops on cache layers (:mod:`.ops`) and the attention paths (:mod:`.paths`).

``from kvbench.attention import ATTENTION_NAME`` keeps working: the public names of :mod:`kvbench.attention.function`
(the former ``kvbench.attention`` module) are re-exported here, imported on first use so that importing one submodule
of this package does not load the others.
"""

from __future__ import annotations

from kvbench.lazy_exports import lazy_reexport

#: The public names of :mod:`kvbench.attention.function`, re-exported lazily.
__getattr__, __dir__ = lazy_reexport(
    __name__,
    "kvbench.attention.function",
    {
        "ATTENTION_NAME",
        "AttentionDetails",
        "AttentionObserver",
        "LayerKV",
        "RaggedKV",
        "attend_within_window_by_position",
        "bottom_right_causal_mask",
        "dense_attention",
        "detailed_attention",
        "kvbench_attention_forward",
        "on_device",
        "paged_attention",
        "ragged_attention",
        "ragged_detailed_attention",
        "sliding_causal_mask",
    },
)
