"""The KV cache: the layer contract (:mod:`.base`), :class:`KVBenchCache` and its torch layers
(:mod:`.kv_cache`), the paged layout (:mod:`.paged`) and the sliding window (:mod:`.sliding`).

``from kvbench.cache import KVBenchCache`` keeps working: the public names of :mod:`kvbench.cache.kv_cache`
(the former ``kvbench.cache`` module) are re-exported here, imported on first use so that importing one submodule
of this package does not load the others.
"""

from __future__ import annotations

import importlib
from typing import Any

#: The public names of :mod:`kvbench.cache.kv_cache`, re-exported lazily by :func:`__getattr__`.
_REEXPORTED = frozenset(
    {
        "BACKENDS",
        "BACKEND_ENV",
        "DEFAULT_PAGE_SIZE",
        "GROWTH_FRACTION",
        "HeadwiseLayer",
        "KVBenchCache",
        "LogicalLengthLayer",
        "PagedLayer",
        "RaggedKV",
        "SlidingWindowLayer",
        "StorageStats",
        "check_choice",
        "on_device",
        "resolve_backend",
        "sorted_keep_indices",
    }
)


def __getattr__(name: str) -> Any:
    if name in _REEXPORTED:
        value = getattr(importlib.import_module("kvbench.cache.kv_cache"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_REEXPORTED})
