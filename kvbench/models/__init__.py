"""Models and tokenizers: loading (:mod:`.loading`), the GGUF cache (:mod:`.gguf_cache`), where a model
comes from (:mod:`.source`), the tiny built-in model (:mod:`.tiny`), the zoo presets (:mod:`.zoo`) and
the real-vocabulary tokenizers (:mod:`.tokenizers`).

``from kvbench.models import load_model`` keeps working: the public names of :mod:`kvbench.models.loading`
(the former ``kvbench.models`` module) are re-exported here, imported on first use so that importing one submodule
of this package does not load the others.
"""

from __future__ import annotations

from kvbench.lazy_exports import lazy_reexport

#: The public names of :mod:`kvbench.models.loading`, re-exported lazily.
__getattr__, __dir__ = lazy_reexport(
    __name__,
    "kvbench.models.loading",
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
    },
)
