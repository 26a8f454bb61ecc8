"""What a run's rows were computed from, beyond its config (issue #55 item 1): the config hash covers the settings
and the paths they name, never the bytes behind them, so a run records these fingerprints beside it.

Per dataset (:func:`dataset_inputs`, an :class:`Inputs`):

* ``data``: each input's sha256 (or a downloaded input's file hashes, or what generated it), from the dataset's
  ``data_provenance``: a data set re-prepared in place changes it;
* ``method_files``: the sha256 of every file or folder a ``method.params`` knob names (a DuoAttention pattern,
  HeadKV scores, Expected Attention statistics, Q-Filters): a file replaced in place changes it;
* ``method_source``: the sha256 of the method's own source: the modules of its family's class and of the pieces it
  built (scorer, allocators, decode policy); for another package's method, every module file of that package
  (an editable install keeps its version while its code changes).

Their digest (:attr:`Inputs.digest`) is written on every prediction row (``inputs``) with the config hash
(``config_hash``) and the digest of kvbench's own source (``code``, :func:`kvbench_source_digest`), and in
``metrics.json``; the details go to ``run_meta.json`` (``inputs``) and ``metrics.json``.  A resume whose inputs
changed is refused (:func:`kvbench.run.resume.check_inputs_unchanged`); a change elsewhere in kvbench's code is only
recorded (each row's ``code``), and the views flag a dataset whose rows were computed by several versions of it.

Cost: kvbench's sources are hashed once per process; a file's sha256 is memoised per path, size and modification
time (:func:`kvbench.tasks.provenance.file_sha256`), and each is read in full once per process, before it is trusted.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from kvbench import resources
from kvbench.eviction.base import EvictionMethod
from kvbench.eviction.family import family_class
from kvbench.eviction.plugins import PLUGIN_PACKAGES
from kvbench.storage import integrity
from kvbench.storage.integrity import digest
from kvbench.storage.provenance import git_commit
from kvbench.tasks.provenance import file_sha256

#: The kvbench package folder whose ``.py`` files :func:`kvbench_source_digest` covers.
KVBENCH_DIR = Path(str(importlib.util.find_spec("kvbench").origin)).resolve().parent  # type: ignore[union-attr]


def _files_digest(files: Iterable[Path], root: Path) -> str:
    """One digest of ``files``' relative paths (to ``root``) and bytes."""
    return digest({str(path.relative_to(root)): file_sha256(path) for path in sorted(files)})


@cache
def kvbench_source_digest() -> str:
    """The digest of every ``.py`` file of the kvbench package (once per process)."""
    return _files_digest(KVBENCH_DIR.rglob("*.py"), KVBENCH_DIR)


@dataclass(frozen=True)
class Inputs:
    """What one dataset's rows are computed from (module docstring)."""

    data: dict[str, Any]
    method_files: dict[str, Any]
    method_source: dict[str, str]

    @property
    def details(self) -> dict[str, Any]:
        return {"data": self.data, "method_files": self.method_files, "method_source": self.method_source}

    @property
    def digest(self) -> str:
        return digest(self.details)


def data_fingerprint(provenance: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Per input of a dataset's ``data_provenance``: its sha256, a download's file hashes, or what generated it
    (never its path: the same bytes read from another folder are the same data)."""
    keys = ("sha256", "files", "by")
    return {name: {k: record[k] for k in keys if k in record} or dict(record) for name, record in provenance.items()}


def _named_path(value: str) -> Path | None:
    """The file or folder a knob's string names (as given, or under kvbench's shipped files), if it exists: a value
    that looks like a path (a folder separator, a file suffix or a leading ``~``), never a bare word (``max``) or
    ``.``."""
    looks_like_path = "/" in value or value.startswith("~") or bool(Path(value).suffix)
    if not looks_like_path or "\n" in value or value.strip("./") == "":
        return None
    given = Path(value).expanduser()
    for candidate in (given, resources.shipped_root() / given):
        try:
            if candidate.exists():
                return candidate
        except OSError:
            return None
    return None


def method_files(params: Mapping[str, Any], prefix: str = "method.params") -> dict[str, Any]:
    """``{knob: {"path": ..., "sha256": ...}}`` for every ``method.params`` value (nested ones too) that names an
    existing file or folder (a folder: one digest of its files)."""
    found: dict[str, Any] = {}
    for key, value in params.items():
        if isinstance(value, Mapping):
            found.update(method_files(value, f"{prefix}.{key}"))
        elif isinstance(value, str) and (path := _named_path(value)) is not None:
            if path.is_dir():
                sha = _files_digest((p for p in path.rglob("*") if p.is_file()), path)
            else:
                sha = file_sha256(path)
            found[f"{prefix}.{key}"] = {"path": value, "sha256": sha}
    return found


def _module_files(cls: type) -> list[Path]:
    """The source file of ``cls``'s module; for another package's class, every ``.py`` file of its top-level package
    (the whole plug-in: its score may call any of them)."""
    module = sys.modules.get(cls.__module__)
    top = cls.__module__.split(".")[0]
    if top != "kvbench" and top in sys.modules and getattr(sys.modules[top], "__path__", None):
        return [path for folder in sys.modules[top].__path__ for path in Path(folder).rglob("*.py")]
    try:
        source = inspect.getsourcefile(module) if module is not None else None
    except TypeError:  # a built-in module
        source = None
    return [Path(source)] if source else []


def method_source(family: str, method: EvictionMethod) -> dict[str, str]:
    """The sha256 of the method's own source (module docstring): ``{file: sha256}`` of its family's module (for
    another package's method, every module of that package), and ``{"<Class> (class)": sha256}`` of the source of
    each piece it built whose class lives elsewhere (a shared scorer, allocator, decode policy, wrapper): that class
    alone, so moving or editing shared machinery around it refuses no resume (kvbench's own source is recorded per
    row instead, ``code``)."""
    own = family_class(family)
    pieces = (method.scorer, method.layer_allocator, method.head_allocator, method.decode_policy)
    record: dict[str, str] = {}
    if own is not None:
        record.update({_label(path, own): file_sha256(path) for path in _module_files(own)})
    for piece in (*pieces, method.key_channel_pruner):
        cls = type(piece)
        if piece is None or cls.__module__ in ("builtins", "functools") or (own and cls.__module__ == own.__module__):
            continue
        try:
            source = inspect.getsource(cls)
        except (OSError, TypeError):  # defined where no source is kept (an interactive session)
            source = repr(cls)
        record[f"{cls.__qualname__} (class)"] = hashlib.sha256(source.encode()).hexdigest()
    return dict(sorted(record.items()))


def _label(path: Path, cls: type) -> str:
    """A file's name in the record: relative to kvbench's folder (``kvbench/methods/knorm.py``), or the plug-in's
    package and the file's path in it."""
    resolved = path.resolve()
    if resolved.is_relative_to(KVBENCH_DIR):
        return str(Path("kvbench") / resolved.relative_to(KVBENCH_DIR))
    top = cls.__module__.split(".")[0]
    package = PLUGIN_PACKAGES.get(str(getattr(cls, "family", "")), {}).get("package", top)
    return f"{package}:{resolved.name}" if top not in resolved.parts else f"{package}:{_after(resolved, top)}"


def _after(path: Path, part: str) -> str:
    parts = path.parts
    return str(Path(*parts[len(parts) - parts[::-1].index(part) - 1 :]))


def dataset_inputs(cfg: DictConfig, method: EvictionMethod, provenance: Mapping[str, Any]) -> Inputs:
    """A dataset's :class:`Inputs` (``provenance``: its ``data_provenance``)."""
    params = OmegaConf.to_container(cfg.method.params, resolve=True) if cfg.method.get("params") else {}
    return Inputs(
        data=data_fingerprint(provenance),
        method_files=method_files(params if isinstance(params, dict) else {}),
        method_source=method_source(str(cfg.method.family), method),
    )


def changes(old: Mapping[str, Any] | None, new: Inputs) -> list[str]:
    """What differs between recorded inputs ``old`` (:attr:`Inputs.details`) and ``new``, in words (``data input
    'essays': sha256 1a2b... -> 3c4d...``); one line saying the details are unknown when ``old`` is not recorded."""
    if not isinstance(old, Mapping):
        return ["the inputs the rows were computed from (recorded only as a digest) differ from today's"]
    words = {"data": "data input", "method_files": "method file", "method_source": "method source"}
    found = []
    for part, noun in words.items():
        before, after = dict(old.get(part) or {}), new.details[part]
        for key in sorted(set(before) | set(after)):
            if before.get(key) != after.get(key):
                found.append(f"{noun} {key}: {_short(before.get(key))} -> {_short(after.get(key))}")
    return found or ["the inputs the rows were computed from differ from today's"]


def _short(value: Any) -> str:
    if value is None:
        return "(absent)"
    if isinstance(value, Mapping) and "sha256" in value:
        value = value["sha256"]
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text[:12] + "..." if len(text) > 15 else text


def row_stamp(cfg_hash: str, inputs: Inputs) -> dict[str, str]:
    """What every new prediction row records of its computation: the config hash, the inputs' digest and the
    digest of kvbench's source (``code``: a run whose rows differ in it mixed code versions)."""
    return {"config_hash": cfg_hash, "inputs": inputs.digest, "code": kvbench_source_digest()}


def rows_record(inputs: Inputs, rows: list[dict[str, Any]], score: Any) -> dict[str, Any]:
    """``metrics.json``'s records of what its score was computed from: ``inputs`` (digest and details), ``code``
    (the kvbench commit now, and the source digests its rows were computed by: more than one is a mixed-code
    dataset) and ``rows`` (:func:`kvbench.storage.integrity.rows_record`)."""
    return {
        "inputs": {"digest": inputs.digest, "details": inputs.details},
        "code": {"commit": git_commit(), "sources": sorted({str(row["code"]) for row in rows if row.get("code")})},
        "rows": integrity.rows_record(rows, score),
    }
