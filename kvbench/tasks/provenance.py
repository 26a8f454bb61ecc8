"""Where a benchmark input came from, as recorded in every ``metrics.json`` (``data_provenance``).

One record per input (an essay corpus, a QA set, a LongBench file, a needle file, ...):

* ``{"source": "official", "path": ..., "sha256": ...}`` -- the benchmark's own file, read from disk;
* ``{"source": "hub", "repo": ..., "revision": ..., "commit": ..., "files": {name: sha256}}`` -- downloaded;
* ``{"source": "stand-in", "path": ..., "sha256": ..., "missing": <official file>, "how_to_get": <command>}`` --
  our shipped substitute, used because the official file was not found (a warning says so when the run starts:
  scores on stand-ins are not comparable with published numbers);
* ``{"source": "generated", "by": ...}`` -- made by code (word lists aside, RULER's noise/needle/VT/FWE tasks).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_SHA_CACHE: dict[tuple[str, int, int], str] = {}


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes (memoised per path, size and mtime)."""
    path = Path(path)
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _SHA_CACHE:
        sha = hashlib.sha256()
        with path.open("rb") as handle:
            while chunk := handle.read(1 << 20):
                sha.update(chunk)
        _SHA_CACHE[key] = sha.hexdigest()
    return _SHA_CACHE[key]


def official(path: str | Path) -> dict[str, Any]:
    """Record of an official input file read from disk."""
    return {"source": "official", "path": str(path), "sha256": file_sha256(path)}


def stand_in(path: str | Path, missing: str, how_to_get: str) -> dict[str, Any]:
    """Record of a shipped substitute used because ``missing`` was not found; ``how_to_get`` says how to fix it."""
    return {"source": "stand-in", "path": str(path), "sha256": file_sha256(path), "missing": missing,
            "how_to_get": how_to_get}  # fmt: skip


def generated(by: str) -> dict[str, Any]:
    """Record of an input made by code."""
    return {"source": "generated", "by": by}


def stand_in_warnings(dataset: str, records: dict[str, dict[str, Any]]) -> list[str]:
    """One message per stand-in input of ``dataset`` (empty when every input is official, downloaded or made)."""
    return [
        f"{dataset}: input {name!r} is a shipped stand-in ({record['path']}), not the official "
        f"{record['missing']}: scores are not comparable with published numbers. To use the real data: "
        f"{record['how_to_get']}"
        for name, record in records.items()
        if record.get("source") == "stand-in"
    ]


def digest_of(hashes: dict[str, str]) -> str:
    """One sha256 for several files, from their names and sha256s."""
    blob = "\n".join(f"{name}\t{sha}" for name, sha in sorted(hashes.items()))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()
