"""Model and tokenizer loading: hub ids, local folders, GGUF files shipped in a package (``package:...``, converted
once by :mod:`kvbench.models.gguf_cache`), and tiny models built in code (``builtin:<name>``).

Every model is loaded with ``attn_implementation="kvbench"`` (kvbench's registered attention function), the same
way for a 70B checkpoint and for the tiny test models.

Placement: ``model.device_map: null`` puts the whole model on ``model.device``; otherwise accelerate places it
(``auto``, ``balanced``, ``balanced_low_0``, ``sequential``, or an explicit ``{module name: device}`` map, a device
being a GPU index, ``cuda:N``, ``cpu`` or ``disk``): ``from_pretrained(device_map=...)`` for checkpoints,
``accelerate.dispatch_model`` for the builtin models.  Each cache layer is created from its layer's keys, so it
lives on that layer's device (:mod:`kvbench.cache.kv_cache`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from safetensors import SafetensorError
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GemmaConfig,
    LlamaConfig,
    MistralConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from kvbench.attention.function import ATTENTION_NAME
from kvbench.config import DEVICE_MAP_STRATEGIES, DTYPE_NAMES
from kvbench.errors import KVBenchError
from kvbench.models.gguf_cache import ensure_converted
from kvbench.models.source import BUILTIN_MODELS, ModelSource, download_hint, resolve_model_source

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}


@dataclass
class LoadedModel:
    """A model ready for kvbench: eval mode, kvbench attention, on its device (``device``: where its inputs go, the
    embedding's device, when a device map spreads it)."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    device: torch.device

    @property
    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)


# ---------------------------------------------------------------------------------------------------- builtins
def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer (256 byte tokens + <s>, </s>, <unk>) that encodes any text; built offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for symbol in sorted(alphabet):
        vocab[symbol] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    from tokenizers.processors import TemplateProcessing

    backend.post_processor = TemplateProcessing(single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def _tiny_kwargs(vocab_size: int) -> dict[str, Any]:
    return {
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 16384,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
        "tie_word_embeddings": False,
    }


def builtin_config(name: str, vocab_size: int = 259) -> PretrainedConfig:
    """Config of a tiny random model built in code (GQA: 4 query heads, 2 KV heads, 4 layers)."""
    kwargs = _tiny_kwargs(vocab_size)
    if name == "tiny-random-llama":
        return LlamaConfig(**kwargs)
    if name == "tiny-random-mistral":
        return MistralConfig(**kwargs, sliding_window=None)
    if name == "tiny-random-qwen2":
        return Qwen2Config(**kwargs, use_sliding_window=False)
    if name == "tiny-random-gemma":
        return GemmaConfig(**kwargs, head_dim=16)
    raise KVBenchError(f"unknown builtin model {name!r}; valid: {', '.join('builtin:' + n for n in BUILTIN_MODELS)}")


@dataclass(frozen=True)
class RealVocabModel:
    """A 2-layer random-weight model of a real architecture with a paper model's real tokenizer and chat template
    (kvbench.models.tokenizers): prompts, lengths and stops are the real ones, the weights are noise."""

    config_class: type[PretrainedConfig]
    vocab_size: int
    tokenizer: str
    chat_template: str
    rope_theta: float
    extra: tuple[tuple[str, Any], ...] = ()

    def config(self) -> PretrainedConfig:
        """2 layers, hidden size 32, 2 query heads sharing 1 KV head (GQA), so 128K-token prefills run on a CPU."""
        kwargs: dict[str, Any] = {
            "vocab_size": self.vocab_size,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "max_position_embeddings": 262144,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "tie_word_embeddings": False,
        }
        return self.config_class(**kwargs, **dict(self.extra))


#: ``builtin:<name>`` real-vocabulary models (the papers' tokenizer families, see conf/model/random-*.yaml).
REAL_VOCAB_MODELS: dict[str, RealVocabModel] = {
    "random-llama3": RealVocabModel(LlamaConfig, 128256, "llama3", "llama3", 500000.0),
    "random-llama3.1": RealVocabModel(LlamaConfig, 128256, "llama3", "llama3.1", 500000.0),
    "random-mistral-v0.2": RealVocabModel(
        MistralConfig, 32000, "mistral-v1", "mistral-v0.2", 1e6, (("sliding_window", None),)
    ),
    "random-mistral-v0.3": RealVocabModel(
        MistralConfig, 32768, "mistral-v3", "mistral-v0.3", 1e6, (("sliding_window", None),)
    ),
    "random-qwen2": RealVocabModel(Qwen2Config, 151936, "qwen2", "qwen2", 1e6, (("use_sliding_window", False),)),
}


def builtin_tokenizer(name: str) -> PreTrainedTokenizerBase:
    """The tokenizer of builtin model ``name``: the family's real tokenizer and chat template for the ``random-*``
    models, else the byte-level tokenizer."""
    if name in REAL_VOCAB_MODELS:
        from kvbench.models.tokenizers import build_tokenizer

        spec = REAL_VOCAB_MODELS[name]
        return build_tokenizer(spec.tokenizer, spec.chat_template)
    return byte_level_tokenizer()


def build_builtin(
    name: str, seed: int = 0, tokenizer: PreTrainedTokenizerBase | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A random-weight model (seeded) and its tokenizer (built unless given): the tiny ones with the byte-level
    tokenizer, the ``random-*`` ones with their family's real tokenizer and chat template."""
    tokenizer = tokenizer if tokenizer is not None else builtin_tokenizer(name)
    if name in REAL_VOCAB_MODELS:
        config = REAL_VOCAB_MODELS[name].config()
        config.bos_token_id = tokenizer.bos_token_id
        config.eos_token_id = tokenizer.eos_token_id
    else:
        config = builtin_config(name, vocab_size=len(tokenizer))
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    torch.random.set_rng_state(generator_state)
    return model, tokenizer


# ---------------------------------------------------------------------------------------------------- loading
def resolve_device(spec: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu; anything else is passed to torch.device."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except RuntimeError as err:
        raise KVBenchError(f"invalid model.device {spec!r}; use auto, cpu, cuda or cuda:N") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise KVBenchError(f"model.device={spec!r} but CUDA is not available on this machine; use model.device=cpu")
    return device


def check_device_map(value: Any) -> str | dict[str, int | str] | None:
    """``model.device_map`` as plain Python after checking it (raises :class:`KVBenchError` naming the bad value).

    ``None``: one device (``model.device``); a strategy name (:data:`~kvbench.config.DEVICE_MAP_STRATEGIES`); or a
    ``{module name: device}`` map whose devices are GPU indices, ``cuda:N``, ``cpu`` or ``disk``.
    """
    if value is None:
        return None
    if isinstance(value, str) and value in DEVICE_MAP_STRATEGIES:
        return value
    if not hasattr(value, "items") or not value:
        raise KVBenchError(
            f"model.device_map={value!r}; valid: null, {', '.join(DEVICE_MAP_STRATEGIES)}, or a map "
            "{module name: device} (device: a GPU index, cuda:N, cpu or disk)."
        )
    return {str(module): _map_device(str(module), device) for module, device in value.items()}


def _map_device(module: str, device: Any) -> int | str:
    """One entry of an explicit device map, checked."""
    bad = KVBenchError(f"model.device_map[{module!r}]={device!r}; valid devices: a GPU index, cuda:N, cpu, disk.")
    if isinstance(device, bool) or not isinstance(device, (int, str)):
        raise bad
    if device in ("cpu", "disk"):
        return device
    try:
        parsed = torch.device(device) if isinstance(device, str) else torch.device("cuda", device)
    except RuntimeError as err:
        raise bad from err
    if parsed.type != "cuda":
        raise bad
    if (parsed.index or 0) >= torch.cuda.device_count():
        raise KVBenchError(
            f"model.device_map[{module!r}]={device!r} but this machine has {torch.cuda.device_count()} CUDA "
            "device(s); use cpu or disk there."
        )
    return device


def input_device(model: PreTrainedModel) -> torch.device:
    """Where a model's input ids go: its input embedding's device (its execution device when accelerate offloads
    the embedding's weights to the meta device)."""
    embedding = model.get_input_embeddings()
    hook = getattr(embedding, "_hf_hook", None)
    if getattr(hook, "execution_device", None) is not None:
        return torch.device(hook.execution_device)
    device = embedding.weight.device
    return torch.device("cpu") if device.type == "meta" else device


def model_devices(model: PreTrainedModel) -> set[torch.device]:
    """The devices a model computes on (one unless a device map spreads it; ``disk`` and ``cpu`` count as cpu)."""
    placement = getattr(model, "hf_device_map", None)
    if not placement:
        return {next(model.parameters()).device}
    devices = set()
    for device in placement.values():
        if isinstance(device, int):
            devices.add(torch.device("cuda", device))
        elif device in ("cpu", "disk"):
            devices.add(torch.device("cpu"))
        else:
            devices.add(torch.device(device))
    return devices


def _offload_folder(model_cfg: Any) -> str:
    """``model.offload_folder``, or a temporary folder removed when the process exits."""
    folder = getattr(model_cfg, "offload_folder", None)
    if folder:
        return str(folder)
    import atexit
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="kvbench-offload-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def _dispatch_builtin(model: PreTrainedModel, device_map: str | dict[str, int | str], offload_dir: str) -> None:
    """Place a model built in memory across devices with accelerate (``from_pretrained`` does this for checkpoints)."""
    from accelerate import dispatch_model, infer_auto_device_map
    from accelerate.utils import get_balanced_memory

    if isinstance(device_map, str):
        no_split = list(getattr(model, "_no_split_modules", None) or [])
        max_memory = None
        if device_map != "sequential":
            max_memory = get_balanced_memory(
                model, no_split_module_classes=no_split, low_zero=device_map == "balanced_low_0"
            )
        device_map = infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=no_split)
    dispatch_model(model, device_map=device_map, offload_dir=offload_dir)
    model.hf_device_map = dict(device_map)


def validate_model_config(model_cfg: Any) -> ModelSource:
    """The checks done before any work (dtype name, builtin name, local folder or hub cache); the resolved source."""
    if model_cfg.dtype not in DTYPES:
        raise KVBenchError(f"model.dtype={model_cfg.dtype!r} is not supported; valid: {', '.join(DTYPES)}.")
    return resolve_model_source(model_cfg)


def _load_error(model_cfg: Any, source: ModelSource, err: Exception) -> KVBenchError:
    first_line = str(err).splitlines()[0] if str(err) else ""
    hint = download_hint(str(model_cfg.name), source.location) if source.kind == "hub" else ""
    return KVBenchError(
        f"cannot load model {model_cfg.name!r} from {model_cfg.path!r}: {err.__class__.__name__}: {first_line}. {hint}"
    )


def load_tokenizer(model_cfg: Any) -> PreTrainedTokenizerBase:
    """The tokenizer of ``model_cfg`` alone (cheap), so task data can be built and checked before the weights load."""
    source = validate_model_config(model_cfg)
    if source.kind == "builtin":
        return builtin_tokenizer(source.location)
    if source.kind == "package":
        source = ModelSource("local", str(ensure_converted(str(model_cfg.path))))
    revision = model_cfg.revision if source.kind == "hub" else None
    try:
        return AutoTokenizer.from_pretrained(source.location, revision=revision)
    except (OSError, ValueError) as err:
        raise _load_error(model_cfg, source, err) from err


def load_model(model_cfg: Any, seed: int = 0, tokenizer: PreTrainedTokenizerBase | None = None) -> LoadedModel:
    """Load the model of ``model_cfg`` (a :class:`kvbench.config.ModelConfig`) with kvbench attention.

    ``tokenizer`` (from :func:`load_tokenizer`) is reused when given.  Raises :class:`KVBenchError` naming the model
    and how to provide its weights when they cannot be found.
    """
    source = validate_model_config(model_cfg)
    if source.kind == "package":  # converted by load_tokenizer when it ran first; a cache hit then
        source = ModelSource("local", str(ensure_converted(str(model_cfg.path))))
    dtype = DTYPES[model_cfg.dtype]
    device_map = check_device_map(getattr(model_cfg, "device_map", None))
    device = resolve_device(model_cfg.device) if device_map is None else None
    placement: dict[str, Any] = {}
    if device_map is not None:
        try:
            import accelerate  # noqa: F401
        except ImportError as err:
            raise KVBenchError("model.device_map needs the Python package accelerate: pip install accelerate") from err
        placement = {"device_map": device_map, "offload_folder": _offload_folder(model_cfg)}
    if tokenizer is None:
        tokenizer = load_tokenizer(model_cfg)
    if source.kind == "builtin":
        model, tokenizer = build_builtin(source.location, seed=seed, tokenizer=tokenizer)
        model = model.to(dtype=dtype)
        if device_map is not None:
            _dispatch_builtin(model, device_map, placement["offload_folder"])
    else:
        revision = model_cfg.revision if source.kind == "hub" else None
        try:
            model = AutoModelForCausalLM.from_pretrained(source.location, revision=revision, dtype=dtype, **placement)
        except (OSError, ValueError, SafetensorError) as err:  # a damaged weight file (hub cache): named, no traceback
            raise _load_error(model_cfg, source, err) from err
    model.set_attn_implementation(ATTENTION_NAME)
    if device is not None:
        model = model.to(device)
    model = model.eval()
    return LoadedModel(model=model, tokenizer=tokenizer, device=input_device(model))


def stop_token_ids(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel, stop_tokens: list[str]) -> set[int]:
    """Token ids that end generation: the tokenizer's and generation config's eos, plus ``stop_tokens``."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    generation_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(generation_eos, int):
        ids.add(generation_eos)
    elif isinstance(generation_eos, list):
        ids.update(int(i) for i in generation_eos)
    for token in stop_tokens:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if token_id is None or token_id == tokenizer.unk_token_id:
            raise KVBenchError(f"stop token {token!r} is not in the tokenizer's vocabulary")
        ids.add(int(token_id))
    return ids
