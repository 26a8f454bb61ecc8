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
import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_SHA_CACHE: dict[tuple[str, int, int], str] = {}
#: Files checked against their folder's ``MANIFEST.json`` in this process (:func:`verify_prepared`): resolved path ->
#: the sha256 verified, so :func:`official` records ``verified`` only for the bytes that were checked.
_VERIFIED: dict[str, str] = {}


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
    """Record of an official input file read from disk, with ``verified``: whether its bytes were checked against
    the sha256 its preparer recorded (:func:`verify_prepared`); a hand-made folder, or a file its folder's
    ``MANIFEST.json`` does not list, is recorded as unverified (issue #55 item 3)."""
    sha = file_sha256(path)
    return {"source": "official", "path": str(path), "sha256": sha, "verified": _VERIFIED.get(_key(path)) == sha}


def _key(path: str | Path) -> str:
    return str(Path(path).resolve())


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


#: The file a data preparer (``scripts/prepare_data.py <benchmark>``) writes beside the files it prepared.
MANIFEST_FILE = "MANIFEST.json"


def write_manifest(folder: Path, origin: dict[str, Any], lines: dict[str, int]) -> None:
    """Write ``folder/MANIFEST.json``: ``origin`` (where the files came from) and, per prepared file name in
    ``lines``, its sha256 and line (or record) count; every later read checks it (:func:`verify_prepared`)."""
    files = {name: {"sha256": file_sha256(folder / name), "lines": count} for name, count in lines.items()}
    text = json.dumps({**origin, "files": files}, indent=2) + "\n"
    tmp = folder / f"{MANIFEST_FILE}.tmp"
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(folder / MANIFEST_FILE)


def verify_prepared(folder: Path, name: str, how_to_get: str) -> bool:
    """Check ``folder/name`` against the sha256 its preparer recorded in ``folder/MANIFEST.json``; whether it was
    checked (:func:`official` records it as ``verified``).

    No manifest: nothing to check (a hand-made folder; its provenance records the file's own sha256, unverified).
    A manifest that does not list the file with a sha256 (an older preparer's, or a file added by hand): a warning
    naming the file and ``how_to_get``, and the file is recorded as unverified.  A manifest that does not parse, or
    a file whose sha256 differs, raises ``ValueError`` naming the file and ``how_to_get``.  Manifests written before
    the ``files`` layout (one file, a top-level ``sha256``) are read too."""
    manifest_path = folder / MANIFEST_FILE
    if not manifest_path.is_file():
        return False
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{manifest_path}: damaged (not JSON: {err}); re-run {how_to_get}") from err
    if not isinstance(manifest, dict):
        raise ValueError(f"{manifest_path}: damaged (not a JSON object); re-run {how_to_get}")
    entry = manifest.get("files", {}).get(name) if isinstance(manifest.get("files"), dict) else None
    expected = entry.get("sha256") if isinstance(entry, dict) else manifest.get("sha256")
    if expected is None:
        log.warning(
            "%s is not listed with a sha256 in %s: it is read unverified (recorded as such in data_provenance). To "
            "verify it, prepare the folder again: %s",
            folder / name,
            manifest_path,
            how_to_get,
        )
        return False
    actual = file_sha256(folder / name)
    if actual != expected:
        raise ValueError(
            f"{folder / name}: sha256 {actual} differs from {manifest_path} ({expected}); the file changed after it "
            f"was prepared: re-run {how_to_get}"
        )
    _VERIFIED[_key(folder / name)] = actual
    return True


def hub_dataset_file(benchmark: str, repo: str, filename: str, revision: str, how_to_get: str) -> tuple[Path, str]:
    """``filename`` of hub dataset ``repo`` at ``revision`` (huggingface_hub's cache) and the commit it came from;
    offline or failing, a ``RuntimeError`` saying how to prepare the data elsewhere."""
    try:
        from huggingface_hub import hf_hub_download

        path = Path(hf_hub_download(repo_id=repo, filename=filename, repo_type="dataset", revision=revision))
    except Exception as err:
        raise RuntimeError(
            f"could not download {benchmark} {filename} ({repo}@{revision}): {type(err).__name__}. Offline: run "
            f"{how_to_get} on a machine with network access, or set task.data_dir"
        ) from err
    return path, path.parent.name


def hub(repo: str, revision: str, commit: str | None, paths: dict[str, Path]) -> dict[str, Any]:
    """Record of files downloaded from hub dataset ``repo`` (name -> local path)."""
    files = {name: file_sha256(path) for name, path in paths.items()}
    return {"source": "hub", "repo": repo, "revision": revision, "commit": commit, "files": files}
