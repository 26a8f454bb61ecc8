"""Models and tokenizers: loading (:mod:`.loading`), the GGUF cache (:mod:`.gguf_cache`), where a model
comes from (:mod:`.source`), the tiny built-in model (:mod:`.tiny`), the zoo presets (:mod:`.zoo`) and
the real-vocabulary tokenizers (:mod:`.tokenizers`).

``from kvbench.models import load_model`` keeps working: the public names of :mod:`kvbench.models.loading`
(the former ``kvbench.models`` module) are re-exported here, imported on first use so that importing one submodule
of this package does not load the others.
"""

from __future__ import annotations

from kvbench.lazy_exports import lazy_reexport

#: The public names of :mod:`kvbench.models.loading`, re-exported lazily (read from it: no list kept here).
__getattr__, __dir__ = lazy_reexport(__name__, "kvbench.models.loading")
