"""Inputs shared by the synthetic generators (needle grid, RULER, NeedleBench): the model's tokenizer seen as text
(:class:`TextTokenizer`), ``task.options`` merged over defaults, the input-folder resolution (``source`` =
``auto`` / ``shipped`` / ``hub``), the English essay haystack with its provenance record, and file downloads for the
data preparers.
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from kvbench.checks import check_known_keys
from kvbench.resources import tasks_dir
from kvbench.tasks import provenance
from kvbench.tasks.base import data_preparers

#: Our own filler essays, the offline English haystack (``tasks/needle_grid/essays/*.txt``).
_SHIPPED_ESSAYS = tasks_dir() / "needle_grid" / "essays"


_FALLBACK_PIECE = re.compile(r"\s*(?:[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]|\w+|[^\w\s])|\s+$")


class TextTokenizer:
    """Token counting, encoding and decoding with a model's HF tokenizer, never adding special tokens.

    ``tokenizer=None`` falls back to a deterministic word/punctuation splitter (one token per word, punctuation
    mark or CJK character, leading whitespace attached) so that datasets can be built without a model; lengths are
    then approximate and tests should pass a real tokenizer.
    """

    def __init__(self, tokenizer: Any | None) -> None:
        self.tokenizer = tokenizer
        self._pieces: list[str] = []
        self._ids: dict[str, int] = {}

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no BOS/EOS)."""
        if self.tokenizer is not None:
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        ids = []
        for piece in _FALLBACK_PIECE.findall(text):
            if piece not in self._ids:
                self._ids[piece] = len(self._pieces)
                self._pieces.append(piece)
            ids.append(self._ids[piece])
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of token ids (special tokens kept, no clean-up of spaces)."""
        if self.tokenizer is not None:
            return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return "".join(self._pieces[i] for i in ids)

    def count(self, text: str) -> int:
        """Number of tokens of ``text`` without special tokens (RULER's ``len(tokenizer.tokenize(text))``)."""
        if self.tokenizer is not None and hasattr(self.tokenizer, "tokenize"):
            return len(self.tokenizer.tokenize(text))
        return len(self.encode(text))

    @cached_property
    def period_ids(self) -> frozenset[int]:
        """Ids whose token is a lone period (the NIAH insertion point snaps to just after one of them)."""
        ids = set(self.encode("."))
        ids.update(self.encode("Yes."))
        ids.update(self.encode("Yes ."))
        return frozenset(i for i in ids if self.decode([i]).strip() == ".")


def option_values(task_cfg: Any, defaults: dict[str, Any], task_name: str) -> dict[str, Any]:
    """``task.options`` merged over ``defaults``; unknown keys raise an error that lists the valid keys."""
    given = dict(getattr(task_cfg, "options", None) or {})
    check_known_keys(given, defaults, "task.options", f"task {task_name!r}")
    merged = dict(defaults)
    merged.update(given)
    return merged


def resolve_input_dir(task_cfg: Any, benchmark: str, source: str) -> Path | None:
    """Folder with the benchmark's downloaded inputs, or ``None`` to use the shipped fallback inputs.

    ``source``: ``auto`` = ``task.data_dir`` if set, else ``./data/<benchmark>`` if it exists, else shipped inputs;
    ``shipped`` = always the shipped inputs; ``hub`` = download with the registered data preparer into
    ``task.data_dir`` (or ``~/.cache/kvbench/<benchmark>``) first.
    """
    data_dir = getattr(task_cfg, "data_dir", None)
    if source == "shipped":
        return None
    if source == "hub":
        target = Path(data_dir) if data_dir else Path.home() / ".cache" / "kvbench" / benchmark
        data_preparers()[benchmark](target)
        return target
    if source != "auto":
        raise ValueError(f"task.options.source must be auto, shipped or hub, got {source!r}")
    if data_dir:
        path = Path(data_dir)
        if not path.is_dir():
            raise FileNotFoundError(f"task.data_dir {path} does not exist (use scripts/prepare_data.py)")
        return path
    default = Path("data") / benchmark
    return default if default.is_dir() else None


def shipped_essays() -> list[str]:
    """Our own filler essays (``tasks/needle_grid/essays/*.txt``, sorted), the offline English haystack."""
    files = sorted((_SHIPPED_ESSAYS).glob("*.txt"))
    if not files:
        raise FileNotFoundError(f"no shipped essays under {_SHIPPED_ESSAYS}")
    return [f.read_text(encoding="utf-8") for f in files]


def _essay_files(folder: Path) -> list[Path]:
    """Essay ``*.txt`` files of a folder, sorted (a URL list such as RULER's ``PaulGrahamEssays_URLs.txt`` is not an
    essay)."""
    return sorted(f for f in folder.glob("*.txt") if "url" not in f.stem.lower())


def load_essays(input_dir: Path | None, missing: str, how_to_get: str) -> tuple[list[str], dict[str, Any]]:
    """English essays and their provenance record (:mod:`kvbench.tasks.provenance`).

    Looks in ``input_dir`` for, in order: ``PaulGrahamEssays.json`` (RULER, ``{"text": ...}``; also under ``json/``,
    RULER's own layout), ``PaulGrahamEssays.jsonl`` (NeedleBench), ``PaulGrahamEssays/*.txt`` (the gkamradt layout),
    then ``*.txt`` in ``input_dir`` itself.  Without any, the shipped filler essays are a stand-in for ``missing``
    (``how_to_get`` says how to get it).
    """
    if input_dir is not None:
        for js in (input_dir / "PaulGrahamEssays.json", input_dir / "json" / "PaulGrahamEssays.json"):
            if js.is_file():
                data = json.loads(js.read_text(encoding="utf-8"))
                essays = [data["text"]] if isinstance(data, dict) else [d["text"] for d in data]
                return essays, provenance.official(js)
        jsonl = input_dir / "PaulGrahamEssays.jsonl"
        if jsonl.is_file():
            with jsonl.open(encoding="utf-8") as handle:
                return [json.loads(line)["text"] for line in handle if line.strip()], provenance.official(jsonl)
        for folder in (input_dir / "PaulGrahamEssays", input_dir):
            files = _essay_files(folder)
            if files:
                record = _folder_record(folder, files)
                return [f.read_text(encoding="utf-8") for f in files], record
    folder = _SHIPPED_ESSAYS
    record = _folder_record(folder, _essay_files(folder))
    record.update(source="stand-in", missing=missing, how_to_get=how_to_get)
    return shipped_essays(), record


def _folder_record(folder: Path, files: Sequence[Path]) -> dict[str, Any]:
    """Provenance of a folder of text files: one sha256 over the files' names and hashes."""
    hashes = {f.name: provenance.file_sha256(f) for f in files}
    return {"source": "official", "path": str(folder), "sha256": provenance.digest_of(hashes), "files": len(files)}


def download(url: str, target: Path) -> None:
    """Fetch ``url`` to ``target`` unless it is already there (used by the data preparers)."""
    if target.is_file() and target.stat().st_size > 0:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(target.suffix + ".part")
    with urllib.request.urlopen(url, timeout=120) as response, tmp.open("wb") as out:
        while chunk := response.read(1 << 20):
            out.write(chunk)
    os.replace(tmp, target)


def hub_download(repo_id: str, filename: str, target_dir: Path) -> Path:
    """Copy one file of a HF dataset repository into ``target_dir`` (uses ``huggingface_hub``)."""
    from huggingface_hub import hf_hub_download

    target_dir.mkdir(parents=True, exist_ok=True)
    return Path(hf_hub_download(repo_id=repo_id, filename=filename, repo_type="dataset", local_dir=target_dir))
