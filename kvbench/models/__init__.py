"""Models and tokenizers: loading (:mod:`.loading`), the GGUF cache (:mod:`.gguf_cache`), where a model
comes from (:mod:`.source`), the tiny built-in model (:mod:`.tiny`), the zoo presets (:mod:`.zoo`) and
the real-vocabulary tokenizers (:mod:`.tokenizers`).

``from kvbench.models import load_model`` keeps working: the public names of :mod:`kvbench.models.loading`
(the former ``kvbench.models`` module) are re-exported here, imported on first use so that importing one submodule
of this package does not load the others.
"""

from __future__ import annotations

import importlib
from typing import Any

#: The public names of :mod:`kvbench.models.loading`, re-exported lazily by :func:`__getattr__`.
_REEXPORTED = frozenset(
    {
        "ATTENTION_NAME",
        "BUILTIN_MODELS",
        "DEVICE_MAP_STRATEGIES",
        "DTYPES",
        "DTYPE_NAMES",
        "KVBenchError",
        "LoadedModel",
        "ModelSource",
        "REAL_VOCAB_MODELS",
        "RealVocabModel",
        "build_builtin",
        "builtin_config",
        "builtin_tokenizer",
        "byte_level_tokenizer",
        "check_device_map",
        "download_hint",
        "ensure_converted",
        "input_device",
        "load_model",
        "load_tokenizer",
        "model_devices",
        "resolve_device",
        "resolve_model_source",
        "stop_token_ids",
        "validate_model_config",
    }
)


def __getattr__(name: str) -> Any:
    if name in _REEXPORTED:
        value = getattr(importlib.import_module("kvbench.models.loading"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_REEXPORTED})
