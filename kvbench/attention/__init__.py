"""The registered attention function (:mod:`.function`) and what it calls: the score extras
(:mod:`.extras`), the dense and per-head ops (:mod:`.ops`) and attention over paged layers (:mod:`.paged`).

``from kvbench.attention import ATTENTION_NAME`` keeps working: the public names of :mod:`kvbench.attention.function`
(the former ``kvbench.attention`` module) are re-exported here, imported on first use so that importing one submodule
of this package does not load the others.
"""

from __future__ import annotations

from kvbench.lazy_exports import lazy_reexport

#: The public names of :mod:`kvbench.attention.function`, re-exported lazily (read from it: no list kept here).
__getattr__, __dir__ = lazy_reexport(__name__, "kvbench.attention.function")
