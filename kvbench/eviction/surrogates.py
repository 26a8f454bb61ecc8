"""Learned scorers' weights without the Hub: KVzap's surrogate models, their published checkpoint format and where
kvbench finds one (issue #58).

**Architecture** (NVIDIA/kvpress ``kvpress/presses/kvzap_press.py``, ``KVzapModel``, kvpress 0.5.5): one module per
decoder layer mapping that layer's attention input (the hidden states after ``input_layernorm``, ``[n, hidden]``) to
one score per KV head ``[n, H_kv]``: a ``Linear(hidden, H_kv)`` (``linear``), or ``Linear(hidden, d) -> GELU (erf)
-> Linear(d, H_kv)`` (``mlp``).  The weights are cast to the hidden states' dtype and applied in it, as kvpress does.

**Format** (what ``KVzapModel.save_pretrained`` writes, the files of ``nvidia/KVzap-{linear,mlp}-<model>`` on the
Hub): a folder with ``config.json`` (``model_type: kvzap``, ``input_dim``, ``output_dim``, ``hidden_dim`` -- null for
the linear model --, ``n_modules``) and ``model.safetensors`` holding ``layers.<i>.weight`` / ``layers.<i>.bias``
(linear) or ``layers.<i>.0.{weight,bias}`` and ``layers.<i>.2.{weight,bias}`` (mlp) for ``i < n_modules``.  Every
tensor's shape is checked against the config when read, and the folder's two files are hashed into the run's record.

**Where** (``method.params.checkpoint``): a folder as above; a Hub id (``owner/name``) already in the local Hugging
Face cache (nothing is downloaded); or ``auto``: kvpress's own rule -- ``nvidia/KVzap-<type>-<basename of the
model's name_or_path>`` in the local Hub cache --, else the small checkpoint kvbench ships for the model under
``models/kvzap/<model>/<type>/`` (trained on CPU by ``scripts/train_kvzap.py``; ``models/kvzap/README.md``), matched
when the model's ``name_or_path`` basename starts with ``<model>``.  A shipped checkpoint is *not* NVIDIA's: its
``config.json`` says so (``kvbench_training``) and every prediction row records which checkpoint scored it
(``cache.learned_weights``: source, path, sha256).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from kvbench import resources
from kvbench.errors import KVBenchError
from kvbench.eviction.kept_sets import files_digest

#: Files of a KVzap checkpoint folder (``KVzapModel.save_pretrained``).
KVZAP_FILES = ("config.json", "model.safetensors")
MODEL_TYPES = ("linear", "mlp")
#: A Hugging Face Hub id (``owner/name``), as opposed to a path.
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]*[A-Za-z0-9]")
#: Where kvbench's own small checkpoints live (under the shipped root): ``<model>/<type>/``.
SHIPPED_KVZAP = Path("models") / "kvzap"
TRAIN_HINT = (
    "give method.params.checkpoint=<folder with config.json and model.safetensors> (nvidia/KVzap-<type>-<model> "
    "downloaded on your machine, or its Hub id once in your local Hugging Face cache), or train a small one with "
    "`python scripts/train_kvzap.py --model <preset> --out <folder>`"
)


@dataclass(frozen=True)
class KVzapWeights:
    """A loaded KVzap checkpoint: per layer the tensors of its module, and where they came from."""

    #: Per decoder layer: ``(w1 [d_or_H, hidden], b1, w2 [H, d], b2)`` (mlp) or ``(w, b)`` (linear).
    layers: tuple[tuple[torch.Tensor, ...], ...]
    input_dim: int
    output_dim: int
    hidden_dim: int | None
    #: ``{"source": "folder" | "hub-cache" | "shipped", "path": ..., "sha256": <16 hex of the two files>, ...}``.
    provenance: dict[str, Any]

    @property
    def model_type(self) -> str:
        return "linear" if self.hidden_dim is None else "mlp"

    def scores(self, layer_idx: int, hidden_states: torch.Tensor) -> torch.Tensor:
        """``[H_kv, n]`` scores of one layer from its attention input ``hidden_states`` ``[n, hidden]``, computed in
        the hidden states' dtype on their device (kvpress's ``kvzap_module(hidden_states).transpose(1, 2)``)."""
        if not 0 <= layer_idx < len(self.layers):
            raise ValueError(
                f"KVzap checkpoint {self.provenance['path']} has {len(self.layers)} layer modules; the model's layer "
                f"{layer_idx} has none (a checkpoint of another model?)"
            )
        if hidden_states.shape[-1] != self.input_dim:
            raise ValueError(
                f"KVzap checkpoint {self.provenance['path']} reads hidden states of size {self.input_dim}, this "
                f"model's are {hidden_states.shape[-1]} (a checkpoint of another model?); {TRAIN_HINT}"
            )
        dtype, device = hidden_states.dtype, hidden_states.device
        params = [t.to(device=device, dtype=dtype) for t in self.layers[layer_idx]]
        out = F.linear(hidden_states[None], params[0], params[1])  # [1, n, .]: kvpress's batch of one
        if len(params) == 4:
            out = F.linear(F.gelu(out), params[2], params[3])
        return out[0].transpose(0, 1)


def _tensor(tensors: dict[str, torch.Tensor], name: str, shape: tuple[int, ...], path: Path) -> torch.Tensor:
    if name not in tensors:
        raise ValueError(f"KVzap checkpoint {path}: model.safetensors lacks {name!r}; {TRAIN_HINT}")
    if tuple(tensors[name].shape) != shape:
        raise ValueError(
            f"KVzap checkpoint {path}: {name} has shape {tuple(tensors[name].shape)}, its config.json says {shape}"
        )
    return tensors[name]


@cache
def load_kvzap(folder: str, source: str = "folder") -> KVzapWeights:
    """Read a checkpoint folder in the published format (module docstring), every shape checked."""
    from safetensors.torch import load_file

    path = Path(folder)
    missing = [name for name in KVZAP_FILES if not (path / name).is_file()]
    if missing:
        raise ValueError(f"KVzap checkpoint {path}: lacks {missing}; {TRAIN_HINT}")
    try:
        config = json.loads((path / "config.json").read_text())
        input_dim, output_dim, modules = int(config["input_dim"]), int(config["output_dim"]), int(config["n_modules"])
        hidden = config.get("hidden_dim")
        hidden = None if hidden is None else int(hidden)
        tensors = load_file(str(path / "model.safetensors"))
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as err:
        raise ValueError(f"KVzap checkpoint {path}: unreadable ({err}); {TRAIN_HINT}") from None
    if config.get("model_type", "kvzap") != "kvzap":
        raise ValueError(f"KVzap checkpoint {path}: config.json model_type {config.get('model_type')!r}, not 'kvzap'")
    layers = []
    for i in range(modules):
        if hidden is None:
            names = [(f"layers.{i}.weight", (output_dim, input_dim)), (f"layers.{i}.bias", (output_dim,))]
        else:
            names = [
                (f"layers.{i}.0.weight", (hidden, input_dim)),
                (f"layers.{i}.0.bias", (hidden,)),
                (f"layers.{i}.2.weight", (output_dim, hidden)),
                (f"layers.{i}.2.bias", (output_dim,)),
            ]
        layers.append(tuple(_tensor(tensors, name, shape, path) for name, shape in names))
    provenance = {"source": source, "path": str(path), "sha256": files_digest(*(path / n for n in KVZAP_FILES))}
    if "kvbench_training" in config:  # kvbench's own small checkpoints say how they were made
        training = config["kvbench_training"]
        provenance["training"] = {key: training.get(key) for key in ("by", "command")}
    return KVzapWeights(tuple(layers), input_dim, output_dim, hidden, provenance)


def hub_cache_folder(repo_id: str, files: tuple[str, ...] = KVZAP_FILES) -> Path | None:
    """The snapshot folder of ``repo_id`` in the local Hugging Face cache holding every file of ``files`` (KVzap's
    two checkpoint files by default), or ``None`` (nothing is downloaded)."""
    from huggingface_hub import try_to_load_from_cache

    found = [try_to_load_from_cache(repo_id, name) for name in files]
    if all(isinstance(f, str) for f in found):
        folders = {Path(f).parent for f in found}  # type: ignore[arg-type]
        if len(folders) == 1:
            return folders.pop()
    return None


def shipped_kvzap(model_name: str, model_type: str) -> Path | None:
    """kvbench's shipped checkpoint for a model whose ``name_or_path`` basename is ``model_name``, or ``None``."""
    try:
        root = resources.shipped_root() / SHIPPED_KVZAP
    except FileNotFoundError:
        return None
    if not root.is_dir():
        return None
    for folder in sorted(root.iterdir()):
        if folder.is_dir() and model_name.startswith(folder.name) and (folder / model_type).is_dir():
            return folder / model_type
    return None


@cache
def resolve_kvzap(checkpoint: str, model_type: str, name_or_path: str) -> KVzapWeights:
    """The checkpoint ``method.params.checkpoint`` names for a model called ``name_or_path`` (module docstring)."""
    if checkpoint != "auto":
        given = Path(checkpoint).expanduser()
        for candidate in (given, resources.shipped_root() / given):
            if candidate.is_dir():
                return load_kvzap(str(candidate), "folder")
        if HUB_ID.fullmatch(checkpoint) and not given.exists():
            found = hub_cache_folder(checkpoint)
            if found is not None:
                return load_kvzap(str(found), "hub-cache")
        raise ValueError(
            f"method.params.checkpoint={checkpoint!r}: neither a folder nor a Hub id in the local Hugging Face cache; "
            f"{TRAIN_HINT}"
        )
    basename = str(name_or_path).rstrip("/").split("/")[-1]
    repo_id = f"nvidia/KVzap-{model_type}-{basename}"  # kvpress's rule
    found = hub_cache_folder(repo_id) if basename else None
    if found is not None:
        return load_kvzap(str(found), "hub-cache")
    shipped = shipped_kvzap(basename, model_type)
    if shipped is not None:
        return load_kvzap(str(shipped), "shipped")
    raise KVBenchError(  # found out once the model is loaded: a user error all the same, not a bug
        f"kvzap: no {model_type} checkpoint for model {name_or_path!r} (kvpress's {repo_id} is not in the local "
        f"Hugging Face cache and kvbench ships none for it); {TRAIN_HINT}"
    )


def save_kvzap(
    folder: str | Path, layers: list[tuple[torch.Tensor, ...]], input_dim: int, output_dim: int,
    hidden_dim: int | None, training: dict[str, Any] | None = None,
) -> Path:  # fmt: skip
    """Write a checkpoint in the published format (module docstring; what ``KVzapModel.save_pretrained`` writes,
    float32 ``model.safetensors``), ``training`` saved as ``config.json``'s ``kvbench_training``."""
    from safetensors.torch import save_file

    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    for i, params in enumerate(layers):
        names = ["weight", "bias"] if hidden_dim is None else ["0.weight", "0.bias", "2.weight", "2.bias"]
        if len(params) != len(names):
            kind = "linear" if hidden_dim is None else "mlp"
            raise ValueError(f"layer {i}: {len(params)} tensors, a {kind} module has {len(names)}")
        tensors.update(
            {f"layers.{i}.{name}": t.detach().float().contiguous() for name, t in zip(names, params, strict=True)}
        )
    config: dict[str, Any] = {
        "architectures": ["KVzapModel"],
        "model_type": "kvzap",
        "input_dim": input_dim,
        "output_dim": output_dim,
        "hidden_dim": hidden_dim,
        "n_modules": len(layers),
        "dtype": "float32",
    }
    if training is not None:
        config["kvbench_training"] = training
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


# ---------------------------------------------------------------------------------------------------- Fast KVzip
#: Where Fast KVzip's authors publish gates (``<model name, lower case>/q<G>_dim16_sink16.pt``).
FASTKVZIP_REPO = "Jang-Hyun/Fast-KVzip"
SHIPPED_FASTKVZIP = Path("models") / "fastkvzip"
GATE_KEYS = ("q_proj.weight", "q_proj.bias", "k_proj.weight", "q_norm.weight", "k_norm.weight", "k_base", "b")
GATE_HINT = (
    "give method.params.checkpoint=<gate file> (Jang-Hyun/Fast-KVzip's <model>/q<G>_dim16_sink16.pt downloaded on "
    "your machine), or train one with `python scripts/train_fastkvzip.py --model <preset> --out <folder>`"
)


def gate_file_name(num_heads: int, num_kv_heads: int) -> str:
    """The published gates' file name: ``q<G>_dim16_sink16.pt`` for GQA groups of ``G`` query heads."""
    return f"q{num_heads // num_kv_heads}_dim16_sink16.pt"


def _rms(states: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Qwen3's RMSNorm as Fast KVzip's gates use it: float32 statistics, the normalised states cast back to their
    dtype, then times the (float32) weight."""
    normed = states.float()
    normed = normed * torch.rsqrt(normed.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(states.dtype)


@dataclass(frozen=True)
class FastKVzipGates:
    """Loaded Fast KVzip gates: per layer the tensors of ``GATE_KEYS`` (Fast KVzip's ``FastKVzipGate``, arXiv
    2601.17668), and where they came from."""

    layers: tuple[dict[str, torch.Tensor], ...]
    provenance: dict[str, Any]

    def scores(self, layer_idx: int, hidden_states: torch.Tensor) -> torch.Tensor:
        """``[H_kv, n]`` float32 gate scores of one layer from its attention input ``[n, hidden]``.

        Per KV head: queries ``[n, G, d]`` and a key ``[n, 1, d]`` projected from the hidden states (linear maps in
        the hidden states' dtype, each followed by the float32 RMSNorm), the token's logit ``k . q / sqrt(d) + b`` per
        group member against ``sink`` learned base keys ``k_base . q / sqrt(d)``; the score is ``1 / (1 + sum_sink
        exp(base - logit))`` averaged over the group.  kvpress applies the linear maps in the gates' dtype (it fails
        when that is not the model's); kvbench casts them to the hidden states' dtype, the same numbers when equal.
        """
        if not 0 <= layer_idx < len(self.layers):
            raise ValueError(f"Fast KVzip gates {self.provenance['path']}: no gate for the model's layer {layer_idx}")
        p = self.layers[layer_idx]
        dtype, device = hidden_states.dtype, hidden_states.device
        d = p["q_norm.weight"].shape[-1]
        heads = p["k_proj.weight"].shape[0] // d
        if hidden_states.shape[-1] != p["q_proj.weight"].shape[1]:
            size = p["q_proj.weight"].shape[1]
            raise ValueError(
                f"Fast KVzip gates {self.provenance['path']} read hidden states of size {size}, this model's are "
                f"{hidden_states.shape[-1]}; {GATE_HINT}"
            )
        w = {name: t.to(device=device) for name, t in p.items()}
        n = hidden_states.shape[0]
        queries = F.linear(hidden_states, w["q_proj.weight"].to(dtype), w["q_proj.bias"].to(dtype))
        keys = F.linear(hidden_states, w["k_proj.weight"].to(dtype))
        queries = _rms(queries.view(n, heads, -1, d), w["q_norm.weight"].float())
        keys = _rms(keys.view(n, heads, -1, d), w["k_norm.weight"].float())
        queries = queries.transpose(0, 1).transpose(-1, -2)  # [H, n, d, G]
        keys = keys.transpose(0, 1)  # [H, n, 1, d]
        logit = torch.matmul(keys, queries) / math.sqrt(d) + w["b"].to(dtype).unsqueeze(2)  # [H, n, 1, G]
        base = torch.matmul(w["k_base"].float(), queries) / math.sqrt(d)  # [H, n, sink, G]
        score = 1 / (1 + torch.exp(base - logit).sum(2, keepdim=True))
        return score.mean(-1).squeeze(-1)


@cache
def load_gates(path: str, source: str = "file") -> FastKVzipGates:
    """Read a gate file in the published format: ``torch.load(weights_only=True)["module"]``, one state dict of
    ``GATE_KEYS`` per layer (shapes checked against each other)."""
    import numpy as np

    file = Path(path)
    if not file.is_file():
        raise ValueError(f"Fast KVzip gates {file}: no such file; {GATE_HINT}")
    reconstruct = (np._core.multiarray._reconstruct, "numpy.core.multiarray._reconstruct")  # older pickles' name
    safe = [reconstruct, np.ndarray, np.dtype, np.dtypes.Float64DType, np.dtypes.Float32DType]
    try:
        with torch.serialization.safe_globals(safe):  # the published files also hold numpy loss curves
            raw = torch.load(str(file), weights_only=True, map_location="cpu")
        modules = raw["module"]
    except Exception as err:  # any unreadable file is the same user error
        raise ValueError(f"Fast KVzip gates {file}: unreadable ({type(err).__name__}: {err}); {GATE_HINT}") from None
    layers = []
    for index, state in enumerate(modules):
        missing = [key for key in GATE_KEYS if key not in state]
        if missing:
            raise ValueError(f"Fast KVzip gates {file}: layer {index} lacks {missing}; {GATE_HINT}")
        d = state["q_norm.weight"].shape[-1]
        heads = state["k_proj.weight"].shape[0] // d
        groups = state["q_proj.weight"].shape[0] // (heads * d)
        expected = {"k_base": (heads, 1, state["k_base"].shape[2], d), "b": (heads, 1, groups)}
        for key, shape in expected.items():
            if tuple(state[key].shape) != shape:
                raise ValueError(f"Fast KVzip gates {file}: layer {index} {key} {tuple(state[key].shape)}, not {shape}")
        layers.append({key: state[key] for key in GATE_KEYS})
    provenance = {"source": source, "path": str(file), "sha256": files_digest(file)}
    if "kvbench_training" in raw:  # kvbench's own gates say how they were made
        provenance["training"] = {key: raw["kvbench_training"].get(key) for key in ("by", "command")}
    return FastKVzipGates(tuple(layers), provenance)


@cache
def resolve_gates(checkpoint: str, name_or_path: str, gate_name: str) -> FastKVzipGates:
    """The gates ``method.params.checkpoint`` names: a file; ``auto``: the authors' ``<model>/<gate_name>`` in the
    local Hub cache (kvpress's rule), else kvbench's shipped ``models/fastkvzip/<model>/<gate_name>``."""
    from huggingface_hub import try_to_load_from_cache

    if checkpoint != "auto":
        given = Path(checkpoint).expanduser()
        for candidate in (given, resources.shipped_root() / given):
            if candidate.is_file():
                return load_gates(str(candidate), "file")
        raise ValueError(f"method.params.checkpoint={checkpoint!r}: no such gate file; {GATE_HINT}")
    basename = str(name_or_path).rstrip("/").split("/")[-1]
    cached = try_to_load_from_cache(FASTKVZIP_REPO, f"{basename.lower()}/{gate_name}") if basename else None
    if isinstance(cached, str):
        return load_gates(cached, "hub-cache")
    root = resources.shipped_root() / SHIPPED_FASTKVZIP
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        if basename.startswith(folder.name) and (folder / gate_name).is_file():
            return load_gates(str(folder / gate_name), "shipped")
    raise KVBenchError(  # found out once the model is loaded: a user error all the same, not a bug
        f"fastkvzip: no gates for model {name_or_path!r} ({FASTKVZIP_REPO} {basename.lower()}/{gate_name} is not in "
        f"the local Hugging Face cache and kvbench ships none for it); {GATE_HINT}"
    )
