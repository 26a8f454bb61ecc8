"""A local model folder checked before anything loads (no torch): every file the loaders will read is there and whole.

:func:`check_model_folder` refuses, naming the file and the fix: a ``config.json`` that is not a JSON object, a
folder without weights (``model.safetensors``, its sharded index, or ``pytorch_model.bin``), a ``.safetensors`` file
shorter or longer than its own header says (a truncated download or copy), a sharded index naming a missing shard,
a folder without any tokenizer file, and a ``tokenizer.json``/``tokenizer_config.json`` that is not JSON.  Reading a
safetensors header costs one small read per file, so checking is instant even for large models.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from kvbench.errors import KVBenchError

#: Weight files a Hugging Face folder may hold (one is enough).
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
#: Tokenizer files (one is enough): fast, sentencepiece, BPE vocabulary.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "tokenizer_config.json")
FIX = "Download the model again (e.g. `hf download <id> --local-dir <folder>`) or point model.path at a complete copy."


def _damaged(path: Path, what: str) -> KVBenchError:
    return KVBenchError(f"model.path: {path} {what}. {FIX}")


def _json_object(path: Path) -> dict:
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _damaged(path, f"cannot be read as JSON ({type(err).__name__}: {str(err).splitlines()[0]})") from None
    if not isinstance(payload, dict):
        raise _damaged(path, "is not a JSON object")
    return payload


def check_safetensors(path: Path) -> None:
    """``path``'s size is exactly what its header describes (8-byte length, JSON header, tensor data)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            head = handle.read(8)
            (length,) = struct.unpack("<Q", head) if len(head) == 8 else (None,)
            header = json.loads(handle.read(length)) if length is not None and length <= size else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, struct.error):
        header = None
    if not isinstance(header, dict) or length is None:
        raise _damaged(path, "has no readable safetensors header (truncated or not a safetensors file)")
    ends = [
        entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__" and "data_offsets" in entry
    ]
    expected = 8 + length + max(ends, default=0)
    if size != expected:
        raise _damaged(path, f"is {size:,} bytes but its header describes {expected:,} (truncated or damaged)")


def check_model_folder(folder: Path) -> None:
    """Refuse a local model folder that cannot load (see the module docstring)."""
    _json_object(folder / "config.json")
    present = [name for name in WEIGHT_FILES if (folder / name).is_file()]
    shards = sorted(folder.glob("*.safetensors"))
    if not present and not shards:
        raise KVBenchError(
            f"model.path: {folder} holds config.json but no weights (none of {', '.join(WEIGHT_FILES)}). {FIX}"
        )
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (folder / index_name).is_file():
            weight_map = _json_object(folder / index_name).get("weight_map") or {}
            for shard in sorted(set(map(str, weight_map.values()))):
                if not (folder / shard).is_file():
                    raise _damaged(folder / index_name, f"names the shard {shard}, which is missing")
    for shard in shards:
        check_safetensors(shard)
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise KVBenchError(f"model.path: {folder} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}). {FIX}")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (folder / name).is_file():
            _json_object(folder / name)
