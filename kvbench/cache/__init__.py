"""The KV cache: the layer contract (:mod:`.base`), :class:`KVBenchCache` and its torch layers
(:mod:`.kv_cache`), the paged layout (:mod:`.paged`) and the sliding window (:mod:`.sliding`).

``from kvbench.cache import KVBenchCache`` keeps working: the public names of :mod:`kvbench.cache.kv_cache`
(the former ``kvbench.cache`` module) are re-exported here, imported on first use so that importing one submodule
of this package does not load the others.
"""

from __future__ import annotations

from kvbench.lazy_exports import lazy_reexport

#: The public names of :mod:`kvbench.cache.kv_cache`, re-exported lazily (read from it: no list kept here).
__getattr__, __dir__ = lazy_reexport(__name__, "kvbench.cache.kv_cache")
