"""Where a model's weights come from, decided without importing torch: built in code, a local folder, or the hub.

``model.path`` is read, in this order, as:

* ``builtin:<name>`` -- a tiny random-weight model built in code (:data:`BUILTIN_MODELS`);
* ``package:<module>/<file>.gguf`` -- a GGUF file shipped inside an installed Python package, converted once into
  kvbench's model cache (:mod:`kvbench.models.gguf_cache`); here only its presence is checked;
* an existing folder (absolute, relative to the working directory, or to the repository root) -- it must hold a
  Hugging Face ``config.json``;
* a string that looks like a path but names no folder -- an error ("no such folder"), never a hub lookup.  It
  looks like a path when it is absolute, starts with ``.`` or ``~``, has more than one ``/`` or a ``\\``, is not a
  valid hub id, or its first component is a local folder (``models/missing``);
* otherwise a Hugging Face hub id (``org/name``).  In offline mode (``HF_HUB_OFFLINE=1``) the local hub cache is
  checked here, so a model that is not there fails at once instead of after torch has loaded.

Errors say how to provide the weights: ``hf download <id>`` on a machine with network access, or
``model.path=<folder>``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kvbench import resources
from kvbench.errors import KVBenchError
from kvbench.models.gguf_cache import PACKAGE_PREFIX, locate_package_file
from kvbench.models.model_files import check_model_folder

BUILTIN_PREFIX = "builtin:"
BUILTIN_MODELS = ("tiny-random-llama", "tiny-random-mistral", "tiny-random-qwen2", "tiny-random-gemma")
#: 2-layer real-architecture models with a paper model's real tokenizer (kvbench.models.loading.REAL_VOCAB_MODELS).
REAL_VOCAB_BUILTINS = ("random-llama3", "random-llama3.1", "random-mistral-v0.2", "random-mistral-v0.3", "random-qwen2")
#: Hub ids: ``name`` or ``owner/name``, letters, digits, ``-``, ``_``, ``.``; not starting or ending with ``-``/``.``.
_HUB_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?"
_HUB_ID = re.compile(rf"^(?:{_HUB_PART}/)?{_HUB_PART}$")


@dataclass(frozen=True)
class ModelSource:
    """A resolved ``model.path``: ``kind`` and what to load (builtin name, local folder, or hub id)."""

    kind: Literal["builtin", "package", "local", "hub"]
    location: str


def resolve_local_path(path: str) -> Path | None:
    """The folder ``path`` names (absolute, relative to the working dir, or to the shipped files, where
    ``models/tiny-niah`` lives: :func:`kvbench.resources.shipped_root`), else None."""
    expanded = Path(path).expanduser()
    for candidate in (expanded, resources.shipped_root() / expanded):
        if candidate.is_dir():
            return candidate
    return None


def is_hub_id(text: str) -> bool:
    """Whether ``text`` is a syntactically valid Hugging Face repo id."""
    return len(text) <= 96 and "--" not in text and ".." not in text and bool(_HUB_ID.match(text))


def looks_like_path(text: str) -> bool:
    """Whether ``text`` can only mean a local path (see the module docstring)."""
    if text.startswith(("/", ".", "~")) or "\\" in text or text.count("/") > 1 or not is_hub_id(text):
        return True
    first = text.split("/", 1)[0]
    return "/" in text and resolve_local_path(first) is not None


def download_hint(model_name: str, path: str) -> str:
    """How to provide a hub model's weights."""
    return (
        f"Provide the weights of model {model_name!r} either by downloading them on a machine with network access "
        f"(`hf download {path}`, into the HF_HOME cache this machine reads), or by pointing model.path at a local "
        f"folder in Hugging Face format (model.path=/path/to/{path.rsplit('/', 1)[-1]})."
    )


def resolve_model_source(model_cfg: Any) -> ModelSource:
    """Classify ``model_cfg.path`` and check what can be checked without loading anything.

    Raises :class:`KVBenchError` for an unknown builtin, a missing or non-model folder, and, in offline mode, a hub
    id that is not in the local cache.
    """
    path = str(model_cfg.path)
    if path.startswith(BUILTIN_PREFIX):
        name = path.removeprefix(BUILTIN_PREFIX)
        if name not in BUILTIN_MODELS + REAL_VOCAB_BUILTINS:
            valid = ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_MODELS + REAL_VOCAB_BUILTINS)
            raise KVBenchError(f"model.path={path!r}: unknown builtin model {name!r}; valid: {valid}.")
        return ModelSource("builtin", name)
    if path.startswith(PACKAGE_PREFIX):
        return ModelSource("package", str(locate_package_file(path)))
    local = resolve_local_path(path)
    if local is not None:
        if not (local / "config.json").is_file():
            raise KVBenchError(
                f"model.path={path!r}: the folder {local} holds no config.json, so it is not a model in Hugging Face "
                "format. Point model.path at the folder that save_pretrained (or `hf download --local-dir`) wrote."
            )
        check_model_folder(local)  # every file the loaders read is there and whole
        return ModelSource("local", str(local))
    if looks_like_path(path):
        roots = dict.fromkeys([str(Path.cwd()), str(resources.shipped_root())])
        where = "" if Path(path).is_absolute() else f" (looked in {' and '.join(roots)})"
        kind = "is a file, not a folder" if Path(path).expanduser().exists() else "no such folder"
        raise KVBenchError(
            f"model.path={path!r}: {kind}{where}. model.path takes a local folder in Hugging Face format, a hub id "
            f"such as meta-llama/Llama-3.1-8B-Instruct, or builtin:<name> ({', '.join(BUILTIN_MODELS)})."
        )
    _check_hub_cache(model_cfg, path)
    return ModelSource("hub", path)


def _check_hub_cache(model_cfg: Any, repo_id: str) -> None:
    """In offline mode, the model's ``config.json`` must be in the local hub cache (no network, no retries)."""
    from huggingface_hub import constants, try_to_load_from_cache

    if not constants.is_offline_mode():
        return
    revision = getattr(model_cfg, "revision", None)
    cached = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    if not isinstance(cached, str):
        at = f" at revision {revision}" if revision else ""
        raise KVBenchError(
            f"model {model_cfg.name!r} (hub id {repo_id}{at}) is not in the local Hugging Face cache "
            f"({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE is set, so it cannot be downloaded here. "
            + download_hint(str(model_cfg.name), repo_id)
        )
