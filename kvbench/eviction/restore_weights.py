"""RestoreKV's learned weights without the Hub: the published format, where kvbench finds it, and the LoRA applied
during the one restore pass without touching the model's code (issue #58).

**Format** (what NVIDIA/kvpress 0.5.5 ``RestoreKVPress`` loads from ``higokri/RestoreKV-<model>[_plus]``): a folder
with a PEFT LoRA adapter -- ``adapter_config.json`` (``peft_type: LORA``, ``r``, ``lora_alpha``, ``use_rslora``,
``target_modules``) and ``adapter_model.safetensors`` (``base_model.model.<module>.lora_A.weight`` ``[r, in]`` and
``.lora_B.weight`` ``[out, r]`` per adapted ``Linear``) -- and ``restore_embeddings.safetensors``
(``restore_embeddings`` ``[n, hidden]``, the n restore tokens' input embeddings).  What kvbench does not implement
is refused by name (DoRA, biases, ``fan_in_fan_out``, per-module rank or alpha patterns, other adapter types).

**LoRA during the restore pass** (:func:`lora_applied`): a forward hook (a public torch API) on every adapted
``Linear`` adds ``scaling * B(A(x))`` to its output -- PEFT's ``lora.Linear`` forward: ``x`` cast to the adapter's
dtype, which is the base layer's (PEFT casts the adapter to it on load), the sum cast back to the output's dtype;
``scaling`` = ``lora_alpha / r`` (``/ sqrt(r)`` with ``use_rslora``).  The hooks are removed when the pass ends.

**Where** (``method.params.checkpoint``): a folder as above; a Hub id already in the local Hugging Face cache
(nothing is downloaded); or ``auto``: kvpress's rule -- ``higokri/RestoreKV-<basename of the model's
name_or_path>`` in the local Hub cache --, else kvbench's small CPU-trained weights for the model
(``models/restorekv/<model>/``, ``scripts/train_restorekv.py``, **not the authors'**).  Every prediction row records
the weights used (``cache.learned_weights``: source, path, sha256 of the three files, and how kvbench made its own).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from kvbench import resources
from kvbench.errors import KVBenchError
from kvbench.eviction.kept_sets import files_digest
from kvbench.eviction.surrogates import HUB_ID, hub_cache_folder

RESTORE_FILES = ("adapter_config.json", "adapter_model.safetensors", "restore_embeddings.safetensors")
RESTOREKV_REPO = "higokri/RestoreKV-{model}"
SHIPPED_RESTOREKV = Path("models") / "restorekv"
#: Beside kvbench's own weights: how they were made (a separate file, as PEFT reads adapter_config.json).
TRAINING_FILE = "kvbench_training.json"
RESTORE_HINT = (
    "give method.params.checkpoint=<folder with adapter_config.json, adapter_model.safetensors and "
    "restore_embeddings.safetensors> (higokri/RestoreKV-<model> downloaded on your machine, or its Hub id once in "
    "your local Hugging Face cache), or train a small one with `python scripts/train_restorekv.py --out <folder>`"
)
#: adapter_config.json settings kvbench refuses unless they hold these values (PEFT's defaults).
UNSUPPORTED = {"use_dora": False, "fan_in_fan_out": False, "bias": "none", "rank_pattern": {}, "alpha_pattern": {}}


@dataclass(frozen=True)
class RestoreWeights:
    """A loaded RestoreKV checkpoint."""

    #: ``[n, hidden]`` the restore tokens' input embeddings (as stored).
    embeddings: torch.Tensor
    #: Module name (as in ``model.named_modules()`` of the causal LM) -> ``(A [r, in], B [out, r])``.
    lora: dict[str, tuple[torch.Tensor, torch.Tensor]]
    #: ``lora_alpha / r`` (``/ sqrt(r)`` with ``use_rslora``).
    scaling: float
    #: ``{"source": "folder" | "hub-cache" | "shipped", "path", "sha256", "training"?}``.
    provenance: dict[str, Any]

    @property
    def num_tokens(self) -> int:
        return int(self.embeddings.shape[0])


def _bad(path: Path, what: str) -> ValueError:
    return ValueError(f"RestoreKV checkpoint {path}: {what}; {RESTORE_HINT}")


@cache
def load_restore(folder: str, source: str = "folder") -> RestoreWeights:
    """Read a checkpoint folder in the published format (module docstring), every shape checked."""
    from safetensors.torch import load_file

    path = Path(folder)
    missing = [name for name in RESTORE_FILES if not (path / name).is_file()]
    if missing:
        raise _bad(path, f"lacks {missing}")
    try:
        config = json.loads((path / "adapter_config.json").read_text())
        rank, alpha = int(config["r"]), float(config["lora_alpha"])
        tensors = load_file(str(path / "adapter_model.safetensors"))
        embeddings = load_file(str(path / "restore_embeddings.safetensors"))["restore_embeddings"]
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as err:
        raise _bad(path, f"unreadable ({type(err).__name__}: {err})") from None
    if config.get("peft_type", "LORA") != "LORA":
        raise _bad(path, f"adapter_config.json peft_type {config.get('peft_type')!r}, not 'LORA'")
    for key, default in UNSUPPORTED.items():
        if config.get(key) not in (None, default):
            raise _bad(path, f"adapter_config.json {key}={config[key]!r} is not supported (only {default!r})")
    if embeddings.dim() != 2 or rank < 1:
        raise _bad(path, f"restore_embeddings {tuple(embeddings.shape)} is not [n, hidden] (or r={rank})")
    lora: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        name = key.removeprefix("base_model.model.")
        for part in ("lora_A", "lora_B"):
            if name.endswith(f".{part}.weight"):
                lora.setdefault(name.removesuffix(f".{part}.weight"), {})[part] = tensor
                break
        else:
            raise _bad(path, f"adapter_model.safetensors holds {key!r}, not a lora_A/lora_B weight")
    pairs = {}
    for name, parts in sorted(lora.items()):
        a, b = parts.get("lora_A"), parts.get("lora_B")
        if a is None or b is None or a.dim() != 2 or b.dim() != 2 or a.shape[0] != rank or b.shape[1] != rank:
            shapes = {part: tuple(t.shape) for part, t in parts.items()}
            raise _bad(path, f"{name}: LoRA weights {shapes} are not A [r={rank}, in] and B [out, r={rank}]")
        pairs[name] = (a, b)
    if not pairs:
        raise _bad(path, "adapter_model.safetensors holds no LoRA weight")
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    digest = files_digest(*(path / name for name in RESTORE_FILES))
    provenance: dict[str, Any] = {"source": source, "path": str(path), "sha256": digest}
    training = path / TRAINING_FILE
    if training.is_file():  # kvbench's own weights say how they were made
        made = json.loads(training.read_text())
        provenance["training"] = {key: made.get(key) for key in ("by", "command")}
    return RestoreWeights(embeddings, pairs, scaling, provenance)


@cache
def resolve_restore(checkpoint: str, name_or_path: str, plus: bool = False) -> RestoreWeights:
    """The weights ``method.params.checkpoint`` names (module docstring); ``plus``: KVzip+'s ``_plus`` adapter."""
    if checkpoint != "auto":
        given = Path(checkpoint).expanduser()
        for candidate in (given, resources.shipped_root() / given):
            if candidate.is_dir():
                return load_restore(str(candidate), "folder")
        found = hub_cache_folder(checkpoint, RESTORE_FILES) if HUB_ID.fullmatch(checkpoint) else None
        if found is not None:
            return load_restore(str(found), "hub-cache")
        raise ValueError(
            f"method.params.checkpoint={checkpoint!r}: neither a folder nor a Hub id in the local Hugging Face "
            f"cache; {RESTORE_HINT}"
        )
    basename = str(name_or_path).rstrip("/").split("/")[-1]
    repo_id = RESTOREKV_REPO.format(model=basename) + ("_plus" if plus else "")
    found = hub_cache_folder(repo_id, RESTORE_FILES) if basename else None
    if found is not None:
        return load_restore(str(found), "hub-cache")
    root = resources.shipped_root() / SHIPPED_RESTOREKV
    for folder in sorted(root.iterdir()) if root.is_dir() and not plus else []:
        if basename.startswith(folder.name) and all((folder / name).is_file() for name in RESTORE_FILES):
            return load_restore(str(folder), "shipped")
    raise KVBenchError(  # found out once the model is loaded: a user error all the same, not a bug
        f"restorekv: no weights for model {name_or_path!r} ({repo_id} is not in the local Hugging Face cache and "
        f"kvbench ships none for it); {RESTORE_HINT}"
    )


@contextmanager
def lora_applied(model: torch.nn.Module, weights: RestoreWeights) -> Iterator[None]:
    """While the block runs, every adapted ``Linear`` of ``model`` (the causal LM) outputs ``y + scaling B(A(x))``
    as PEFT's LoRA layer does (module docstring); the hooks are removed afterwards, also on an error."""
    modules = dict(model.named_modules())
    handles = []
    try:
        for name, (a, b) in weights.lora.items():
            linear = modules.get(name)
            if not isinstance(linear, torch.nn.Linear) or tuple(linear.weight.shape) != (b.shape[0], a.shape[1]):
                raise ValueError(
                    f"RestoreKV checkpoint {weights.provenance['path']}: {name} is not a Linear "
                    f"[{b.shape[0]}, {a.shape[1]}] of this model ({type(linear).__name__})"
                )
            weight = linear.weight
            pair = (a.to(weight.device, weight.dtype), b.to(weight.device, weight.dtype))
            handles.append(linear.register_forward_hook(_lora_hook(pair, weights.scaling)))
        yield
    finally:
        for handle in handles:
            handle.remove()


def _lora_hook(pair: tuple[torch.Tensor, torch.Tensor], scaling: float) -> Any:
    a, b = pair

    def hook(module: torch.nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
        update = F.linear(F.linear(args[0].to(a.dtype), a), b) * scaling
        return (output + update).to(output.dtype)

    return hook
