"""Random-weight models of real architectures for the bench (no download), and method presets composed by Hydra.

:func:`load_method` composes ``conf/`` with Hydra's compose API exactly as ``run.py`` does (``method=<name>`` and
the architecture's ``model=<preset>``), so interpolations such as CAKE's ``params.model: ${oc.select:model.name}``
resolve to the model the bench times (the official tau table of that model applies).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch
from omegaconf import DictConfig

from kvbench.eviction.base import EvictionMethod, build_method
from kvbench.resources import conf_dir

_LLAMA31_8B = {
    "family": "llama",
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "tie_word_embeddings": False,
}
_MISTRAL_7B = {
    "family": "mistral",
    "vocab_size": 32768,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
}

#: Architectures by name: transformers config kwargs (``family`` picks the config class).  ``-2l`` are 2-layer
#: slices with a 32K vocabulary, for CPU; the rest are the real sizes (random weights, built on the device).
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "tiny": {
        "family": "llama",
        "vocab_size": 259,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
    },
    "llama3.1-8b": _LLAMA31_8B,
    "llama3.1-8b-2l": {**_LLAMA31_8B, "num_hidden_layers": 2, "vocab_size": 32000},
    "mistral-7b": _MISTRAL_7B,
    "mistral-7b-2l": {**_MISTRAL_7B, "num_hidden_layers": 2},
}


def build_random_model(arch: str, device: torch.device, dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
    """A random-weight model of ``arch`` built directly on ``device`` (no init pass, then N(0, 0.02) weights).

    Returns the model in eval mode with kvbench attention.
    """
    from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig
    from transformers.initialization import no_init_weights

    import kvbench.attention.function  # noqa: F401  (registers "kvbench")

    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; valid: {', '.join(ARCHITECTURES)}")
    kwargs = dict(ARCHITECTURES[arch])
    family = kwargs.pop("family")
    config = (LlamaConfig if family == "llama" else MistralConfig)(**kwargs)
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.device(device), no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02, generator=generator)
    model.set_attn_implementation("kvbench")
    return model.eval()


#: The ``conf/model`` preset whose name each architecture stands for (what ``${oc.select:model.name}`` resolves to).
ARCH_MODELS: dict[str, str] = {
    "tiny": "tiny",
    "llama3.1-8b-2l": "llama3.1-8b-instruct",
    "llama3.1-8b": "llama3.1-8b-instruct",
    "mistral-7b-2l": "mistral-7b-instruct-v0.3",
    "mistral-7b": "mistral-7b-instruct-v0.3",
}


def load_method(name: str, arch: str = "tiny") -> EvictionMethod:
    """The method preset ``conf/method/<name>.yaml`` as Hydra composes it for ``run.py`` with the model preset that
    ``arch`` stands for (:data:`ARCH_MODELS`).  A fresh method each call (decode policies keep per-sample state)."""
    return build_method(_composed_method(name, ARCH_MODELS.get(arch, "tiny")))


@lru_cache(maxsize=64)
def _composed_method(name: str, model: str) -> DictConfig:
    """``cfg.method`` of ``python run.py method=<name> model=<model>`` (resolved; composed once per pair)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import MissingConfigException
    from omegaconf import OmegaConf

    from kvbench.config import register_configs

    valid = sorted(path.stem for path in (conf_dir() / "method").glob("*.yaml"))
    if name not in valid:
        raise ValueError(f"unknown method {name!r}; valid: {', '.join(valid)}")
    register_configs()
    overrides = [f"method={name}", f"model={model}"]
    if GlobalHydra.instance().is_initialized():  # inside a Hydra app (or a sweep's composer): use its config tree
        cfg = compose(config_name="config", overrides=overrides)
    else:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            try:
                cfg = compose(config_name="config", overrides=overrides)
            except MissingConfigException as err:
                raise ValueError(f"cannot compose method={name} model={model}: {err}") from None
    method = cfg.method
    OmegaConf.resolve(method)
    return method
