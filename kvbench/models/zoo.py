"""The installed transformers' causal-LM architectures at tiny sizes: discovery, tiny builds, and the support table.

:func:`causal_lm_architectures` reads transformers' own model mapping (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``).
:func:`tiny_model` builds one architecture with random weights at a tiny size: its default config with every size
field it has overridden (vocabulary, hidden sizes, layers, heads, experts...), the parameter count checked on the
``meta`` device *before* anything is allocated (:data:`MAX_TINY_PARAMETERS`).  Multimodal wrappers (configs with a
vision/audio sub-config) are listed as such without building them.  :func:`probe` then checks that kvbench with
nothing evicted gives ``model.generate``'s tokens, and :func:`support_table` renders the results as the Markdown
table the README embeds (``tests/models/test_zoo.py`` writes it to ``docs/support_table.md``), with a column saying
whether eviction applies in the configuration checked: a model whose layers all slide (the tiny configs of Mistral,
Phi-3, Gemma-3... set ``sliding_window`` on every layer) runs, but every layer already holds at most its window and
no method evicts anything (:func:`eviction_in_check`).
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from kvbench.cache.sliding import UnsupportedLayers, layer_windows

#: Largest tiny model built (parameters), checked on the meta device before allocating.
MAX_TINY_PARAMETERS = 3_000_000
#: Tiny vocabulary (token ids of the probe prompt are below it).
TINY_VOCAB = 256
#: Tiny sliding window (smaller than the probe prompt, so the window really slides).
TINY_WINDOW = 8
#: Size fields overridden when the config has them (a config keeps the fields it does not have).
TINY_SIZES: dict[str, Any] = {
    "vocab_size": TINY_VOCAB,
    "hidden_size": 32,
    "d_model": 32,
    "n_embd": 32,
    "n_embed": 32,
    "intermediate_size": 64,
    "ffn_dim": 64,
    "ffn_hidden_size": 64,
    "n_inner": 64,
    "decoder_ffn_dim": 64,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "expert_ffn_hidden_size": 32,
    "num_hidden_layers": 4,
    "n_layer": 4,
    "n_layers": 4,
    "num_layers": 4,
    "decoder_layers": 4,
    "num_attention_heads": 4,
    "n_head": 4,
    "n_heads": 4,
    "decoder_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "num_local_experts": 4,
    "num_experts": 4,
    "n_routed_experts": 4,
    "moe_num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_topk": 2,
    "top_k": 2,
    "n_group": 1,
    "topk_group": 1,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 16,
    "q_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "qk_head_dim": 16,
    "v_head_dim": 8,
    "max_position_embeddings": 512,
    "n_positions": 512,
    "max_window_layers": 2,
    "sliding_window": TINY_WINDOW,
    "attention_chunk_size": TINY_WINDOW,
    "rotary_dim": 4,
    "is_decoder": True,
    "use_cache": True,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}
#: A sub-config whose name contains one of these makes a config multimodal (listed, not built).
MODALITY_WORDS = ("vision", "audio", "vq", "image", "speech", "video", "visual", "patcher")
#: Architectures whose sliding window is off by default but commonly on (tested with it on).
SLIDING_ON: dict[str, dict[str, Any]] = {"qwen2": {"use_sliding_window": True}}


@dataclass
class Probe:
    """What :func:`probe` found for one architecture."""

    model_type: str
    class_name: str
    status: str  # "supported" | "multimodal" | "unsupported" | "too large" | "not built"
    reason: str = ""
    layers: str = ""
    #: Full-attention (compressible) layers and all attention layers of the built tiny model (0, 0: not built).
    full_layers: int = 0
    total_layers: int = 0


def causal_lm_architectures() -> dict[str, str]:
    """``model_type -> class name`` of every causal LM the installed transformers maps (sorted)."""
    return dict(sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()))


#: Fields of a config that takes images itself, without a vision sub-config (Fuyu's patch embedding).
IMAGE_FIELDS = ("patch_size", "num_channels")


def modality_configs(config: Any) -> list[str]:
    """The sub-configs (or image fields) of a multimodal model (vision, audio, image tokenizer...); empty for text."""
    names = set(getattr(type(config), "sub_configs", {}) or {})
    found = sorted(name for name in names if any(word in name for word in MODALITY_WORDS))
    fields = config.to_dict()
    return found or [f"vision: {name}" for name in IMAGE_FIELDS if name in fields]


def _tiny_overrides(defaults: Any) -> dict[str, Any]:
    """The :data:`TINY_SIZES` fields ``defaults`` has, recursively into its (text) sub-configs."""
    fields = defaults.to_dict()
    overrides = {key: value for key, value in TINY_SIZES.items() if key in fields}
    if fields.get("num_key_value_heads") is not None and fields.get("num_key_value_heads") == fields.get(
        "num_attention_heads"
    ):
        overrides["num_key_value_heads"] = overrides["num_attention_heads"]  # multi-head by design (MLA...): kept
    if "layer_types" in fields:
        overrides["layer_types"] = None  # re-derived for the tiny layer count
    for name in getattr(type(defaults), "sub_configs", {}) or {}:
        sub = getattr(defaults, name, None)
        if sub is not None and hasattr(sub, "to_dict"):
            overrides[name] = {**sub.to_dict(), **_tiny_overrides(sub)}
    return overrides


def tiny_config(model_type: str) -> Any:
    """``model_type``'s default config with its size fields overridden by :data:`TINY_SIZES` (multimodal wrappers:
    the default config, never built)."""
    config_class = CONFIG_MAPPING[model_type]
    defaults = config_class()
    if modality_configs(defaults):
        return defaults
    overrides = _tiny_overrides(defaults)
    overrides.update(SLIDING_ON.get(model_type, {}))
    return config_class(**overrides)


def parameter_count(config: Any) -> int:
    """Parameters of the causal LM for ``config``, counted on the meta device (nothing allocated)."""
    with torch.device("meta"), _quiet():
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def tiny_model(model_type: str, seed: int = 0) -> PreTrainedModel:
    """``model_type`` at a tiny size with random weights (float32, eval mode).

    Raises
    ------
    ValueError
        When the tiny build would exceed :data:`MAX_TINY_PARAMETERS` (checked before allocating).
    """
    config = tiny_config(model_type)
    count = parameter_count(config)
    if count > MAX_TINY_PARAMETERS:
        raise ValueError(f"{count / 1e6:.1f}M parameters at the tiniest sizes tried (limit {MAX_TINY_PARAMETERS})")
    torch.manual_seed(seed)
    with _quiet():
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    return model.eval()


def eviction_in_check(p: Probe) -> str:
    """Whether eviction acts in the tiny configuration checked: on every layer, on the full-attention layers of a
    hybrid model, or nowhere (every layer slides: the model runs, nothing is evicted); ``-`` when not supported."""
    if p.status != "supported":
        return "-"
    if p.full_layers == 0:
        return "**no**: every layer slides in this check (window only, nothing evicted)"
    if p.full_layers == p.total_layers:
        return f"yes: all {p.total_layers} layers"
    sliding = p.total_layers - p.full_layers
    return f"yes: {p.full_layers} of {p.total_layers} layers ({sliding} sliding keep their window)"


def layer_summary(model: PreTrainedModel) -> str:
    """``"2 full + 2 sliding(8)"``: the attention layout kvbench holds."""
    windows = layer_windows(model.config)
    full = sum(w is None for w in windows)
    sliding = sorted({w for w in windows if w is not None})
    parts = [f"{full} full"] if full else []
    if sliding:
        parts.append(f"{len(windows) - full} sliding({','.join(map(str, sliding))})")
    return " + ".join(parts)


def probe(model_type: str, check: Callable[[PreTrainedModel], None]) -> Probe:
    """Classify one architecture: build it tiny and run ``check`` (which raises on a mismatch or failure)."""
    class_name = causal_lm_architectures()[model_type]
    try:
        config = tiny_config(model_type)
    except Exception as err:  # a config that cannot be built at all
        return Probe(model_type, class_name, "not built", f"config: {_short(err)}")
    if modality_configs(config):
        subs = ", ".join(modality_configs(config))
        return Probe(model_type, class_name, "multimodal", f"multimodal ({subs}); not built")
    try:
        layer_windows(config)
    except UnsupportedLayers as err:
        return Probe(model_type, class_name, "unsupported", str(err).split(", which")[0].split(" has ")[-1])
    except Exception as err:
        return Probe(model_type, class_name, "unsupported", f"layer layout: {_short(err)}")
    try:
        model = tiny_model(model_type)
    except ValueError as err:
        if "parameters at the tiniest" in str(err):
            return Probe(model_type, class_name, "too large", _short(err))
        return Probe(model_type, class_name, "not built", _short(err))
    except Exception as err:
        return Probe(model_type, class_name, "not built", _short(err))
    try:
        check(model)
    except Exception as err:
        return Probe(model_type, class_name, "unsupported", _short(err), layer_summary(model))
    windows = layer_windows(model.config)
    full = sum(w is None for w in windows)
    return Probe(model_type, class_name, "supported", "", layer_summary(model), full, len(windows))


def support_table(probes: list[Probe], transformers_version: str) -> str:
    """The Markdown support table (one row per architecture)."""
    supported = [p for p in probes if p.status == "supported"]
    all_sliding = sum(p.full_layers == 0 for p in supported)
    lines = [
        f"transformers {transformers_version}: {len(probes)} causal-LM architectures, {len(supported)} supported "
        "(tiny random configuration: full cache == `model.generate` token for token, SnapKV keeps its exact budget on "
        'the full-attention layers; ✗ with "not built" / "too large": no tiny configuration was found, untested). '
        f"Of the supported, {all_sliding} had every layer sliding in the tiny check (✓ no eviction): they run, "
        "but eviction does nothing there, since each layer already holds at most its window; whether a real "
        "checkpoint of that architecture evicts depends on its own config (Mistral-7B-v0.1 slides on every layer, "
        "v0.3 has no window).",
        "",
        "| model_type | class | kvbench | eviction in this check | layers / reason |",
        "|---|---|---|---|---|",
    ]
    for p in probes:
        mark = "✗" if p.status != "supported" else "✓ no eviction" if p.full_layers == 0 else "✓"
        detail = p.layers if p.status == "supported" else f"{p.status}: {p.reason}"
        lines.append(
            f"| {p.model_type} | {p.class_name} | {mark} | {eviction_in_check(p)} | {detail.replace('|', '/')} |"
        )
    return "\n".join(lines) + "\n"


def _short(err: BaseException, limit: int = 140) -> str:
    text = " ".join(f"{type(err).__name__}: {err}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@contextlib.contextmanager
def _quiet() -> Any:
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


__all__ = ["Probe", "causal_lm_architectures", "eviction_in_check", "probe", "support_table", "tiny_model"]
