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
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from kvbench import resources
from kvbench.methods.kept_sets import files_digest

#: Files of a KVzap checkpoint folder (``KVzapModel.save_pretrained``).
KVZAP_FILES = ("config.json", "model.safetensors")
MODEL_TYPES = ("linear", "mlp")
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


def hub_cache_folder(repo_id: str) -> Path | None:
    """The snapshot folder of ``repo_id`` in the local Hugging Face cache holding both checkpoint files, or
    ``None`` (nothing is downloaded)."""
    from huggingface_hub import try_to_load_from_cache

    found = [try_to_load_from_cache(repo_id, name) for name in KVZAP_FILES]
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
        if checkpoint.count("/") == 1 and not given.exists():
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
    raise ValueError(
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
