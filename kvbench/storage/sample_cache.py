"""Generated samples stored once and reused by every method x budget run (RULER, NeedleBench).

A synthetic dataset's samples depend only on its task settings, the model's tokenizer (and chat template, since
RULER counts it), the length, the seed, the input corpora and the generator code -- not on the method or the budget.
They are generated once per such key and written to ``<root>/<benchmark>/<dataset>-<digest>.jsonl``; any later run
with the same key reads them back (a 128K RULER sample takes seconds to generate, a file read milliseconds).

The key holds a fingerprint of the generator's source files, of the tokenizer (its full serialisation) and chat
template, and the sha256 of every input file, so a changed generator, tokenizer or corpus gets new samples.  Samples
are generated sequentially from one seeded stream, so the first ``n`` of a longer generation equal a generation of
``n``: a stored file serves any request for at most as many samples as it holds.

File format: the first line is a header ``{"kvbench_sample_cache": 1, "key": {...}, "count": n, "requested": r}``,
then one :meth:`Sample.to_json` object per line.  Writes are atomic (temporary file + rename).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from kvbench.sample import Sample
from kvbench.storage.paths import output_root

FORMAT_VERSION = 1
LOG = logging.getLogger(__name__)

_TOKENIZER_FINGERPRINTS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def digest(payload: Any) -> str:
    """sha256 hex of a JSON-serialisable value (keys sorted)."""
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def source_fingerprint(files: Iterable[str | Path]) -> str:
    """sha256 over the bytes of source files (a changed generator invalidates its stored samples)."""
    sha = hashlib.sha256()
    for path in files:
        sha.update(Path(path).read_bytes())
    return sha.hexdigest()


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """sha256 of a tokenizer's full serialisation (vocabulary, merges, normalisation, special tokens) and its chat
    template; ``"none"`` without a tokenizer."""
    if tokenizer is None:
        return "none"
    try:
        cached = _TOKENIZER_FINGERPRINTS.get(tokenizer)
    except TypeError:  # not weak-referenceable
        cached = None
    template = getattr(tokenizer, "chat_template", None)
    if cached is None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        body = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
        cached = hashlib.sha256(f"{type(tokenizer).__name__}\n{body}".encode()).hexdigest()
        with contextlib.suppress(TypeError):
            _TOKENIZER_FINGERPRINTS[tokenizer] = cached
    return digest([cached, template])


class SampleCache:
    """A folder of generated sample files keyed by :func:`digest` of their generation settings."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path(self, benchmark: str, dataset: str, key: dict[str, Any]) -> Path:
        return self.root / benchmark / f"{dataset}-{digest(key)[:20]}.jsonl"

    def load(self, benchmark: str, dataset: str, key: dict[str, Any], count: int) -> list[Sample] | None:
        """The first ``count`` stored samples, or ``None`` when there are fewer (or none, or another key)."""
        path = self.path(benchmark, dataset, key)
        if not path.is_file():
            return None
        try:
            lines = path.read_bytes().split(b"\n")
        except OSError:
            return None
        try:
            header = json.loads(lines[0])
        except ValueError:  # JSONDecodeError, UnicodeDecodeError
            return _damaged(path, "its header line is not JSON")
        if not isinstance(header, dict):
            return _damaged(path, "its header line is not a JSON object")
        if header.get("kvbench_sample_cache") != FORMAT_VERSION or header.get("key") != json.loads(
            json.dumps(key, default=str)
        ):
            return None
        try:
            stored, requested = int(header["count"]), int(header["requested"])
        except (KeyError, TypeError, ValueError):
            return _damaged(path, "its header lacks a valid count")
        if stored < count and requested < count:
            return None
        # Every line the header counts must be complete (ends in a newline) and parse: a partial last line, a
        # truncated or corrupted file is regenerated, never half-read.
        body = lines[1 : stored + 1]
        if len(body) < stored or len(lines) < stored + 2:
            return _damaged(path, f"it holds fewer complete lines than the {stored} samples its header counts")
        try:
            return [Sample.from_json(json.loads(line)) for line in body[:count]]
        except (ValueError, KeyError, TypeError) as err:
            return _damaged(path, f"a sample line does not parse ({type(err).__name__}: {err})")

    def store(
        self, benchmark: str, dataset: str, key: dict[str, Any], samples: list[Sample], requested: int
    ) -> Path | None:
        """Write ``samples`` (generated for a request of ``requested``) atomically; returns the file, or ``None``
        when it was not written, with a warning naming the file and the fix: a file there of a newer format (a newer
        kvbench's: never replaced by this one's), or a cache folder that cannot be written (read-only, full; no
        temporary file is left behind).  The run goes on with the samples it generated."""
        path = self.path(benchmark, dataset, key)
        newer = _newer_format(path)
        if newer is not None:
            LOG.warning(
                "%s was written by a newer kvbench (sample-cache format %s; this one reads %d): left as it is, and "
                "these samples are not stored. Upgrade kvbench to reuse it, or set run.sample_cache=<another folder>",
                path,
                newer,
                FORMAT_VERSION,
            )
            return None
        tmp = path.with_name(f".{path.name}.{id(samples)}.tmp")
        header = {"kvbench_sample_cache": FORMAT_VERSION, "key": key, "count": len(samples), "requested": requested}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tmp.open("w", encoding="utf-8") as handle:
                handle.write(json.dumps(header, ensure_ascii=False, default=str) + "\n")
                for sample in samples:
                    handle.write(json.dumps(sample.to_json(), ensure_ascii=False) + "\n")
            tmp.replace(path)
        except OSError as err:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            LOG.warning(
                "cannot store generated samples in the sample cache %s (%s): this run goes on without storing them, so "
                "the next run generates them again. Fix: make that folder writable (or free space), or set "
                "run.sample_cache=<a writable folder> (null: never store)",
                self.root,
                err.strerror or err,
            )
            return None
        return path


def _newer_format(path: Path) -> Any:
    """The format version of the file at ``path`` when a newer kvbench wrote it (an integer above
    :data:`FORMAT_VERSION`), else ``None``."""
    try:
        with path.open("rb") as handle:
            header = json.loads(handle.readline())
    except (OSError, ValueError):
        return None
    version = header.get("kvbench_sample_cache") if isinstance(header, dict) else None
    newer = isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION
    return version if newer else None


def _damaged(path: Path, why: str) -> None:
    """Warn that a stored sample file is damaged (it is regenerated and replaced atomically); returns ``None``."""
    LOG.warning("%s is damaged (%s): regenerating its samples", path, why)
    return None


def cached_samples(
    cache: SampleCache | None,
    benchmark: str,
    dataset: str,
    key: Callable[[], dict[str, Any]],
    count: int,
    generate: Callable[[int], list[Sample]],
) -> list[Sample]:
    """``count`` samples of ``dataset``: read from ``cache`` when stored under ``key()``, else generated with
    ``generate(count)`` and stored.  Without a cache, generated every time."""
    if cache is None:
        return generate(count)
    resolved = key()
    hit = cache.load(benchmark, dataset, resolved, count)
    if hit is not None:
        return hit
    samples = generate(count)
    cache.store(benchmark, dataset, resolved, samples, requested=count)
    return samples


def run_sample_cache(cfg: Any) -> SampleCache | None:
    """The folder generated samples are stored in (``run.sample_cache``: ``auto`` = ``<run.output_root>/../samples``,
    a path, or null to regenerate in every run)."""
    setting = cfg.run.get("sample_cache", "auto")
    if setting is None:
        return None
    root = output_root(cfg).parent / "samples" if setting == "auto" else Path(str(setting)).expanduser()
    return SampleCache(root)
