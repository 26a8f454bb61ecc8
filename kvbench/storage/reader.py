"""One reader for every file a run folder holds: nothing read back is trusted before it is checked.

* :func:`read_metrics` / :func:`read_run_meta` -- parse the JSON, check that it is an object with the fields every
  reader relies on (their types too), check its ``schema_version`` and bring an older version up to the current one
  (:func:`upgrade`), so reports, tables and resume read every version ever written.
* :func:`read_prediction_rows` -- ``predictions.jsonl``: complete lines only, each a JSON object with a string
  ``id`` and a ``prediction``, no id twice.  A torn last line (a process killed mid-write) is the one damage that is
  repaired in place: it is cut off, and the run regenerates that sample.
* :func:`read_config_yaml` -- a run's ``config.yaml``, ``None`` when it is absent or unreadable (it is rewritten by
  every run; nothing is decided from a damaged one).

Damage that cannot be repaired here raises :class:`DamagedFile`: a :class:`~kvbench.errors.KVBenchError` whose one
message names the file, what is wrong and the command that fixes it.  The runner repairs what it can recompute
(a damaged ``metrics.json`` or missing prediction rows: :mod:`kvbench.run.runner`) instead of raising.

Schema versions (``schema_version`` in ``metrics.json`` and ``run_meta.json``):

* 1 -- every file written before the field existed (no ``schema_version``);
* 2 -- the field is recorded; nothing else changed.

A file whose version is newer than this kvbench knows is refused (a newer kvbench wrote it): never half-read.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kvbench.checks import json_error_text
from kvbench.errors import KVBenchError

#: The ``schema_version`` this kvbench writes into ``metrics.json`` and ``run_meta.json``.
SCHEMA_VERSION = 2
#: The version of a file that records none (written before versions were recorded).
UNVERSIONED = 1


class DamagedFile(KVBenchError, ValueError):
    """A run-folder file that cannot be trusted: ``path``, what is wrong (``reason``) and the fix (a ``ValueError``
    too, as the readers it replaces raised)."""

    def __init__(self, path: Path, reason: str, fix: str) -> None:
        self.path, self.reason, self.fix = Path(path), reason, fix
        super().__init__(f"{path} is damaged: {reason}. Nothing was changed. Fix: {fix}")

    @property
    def reason_line(self) -> str:
        """``<path> is damaged: <reason>`` (for a warning where kvbench repairs the damage itself)."""
        return f"{self.path} is damaged: {self.reason}"


def rerun_fix(folder: Path, what: str) -> str:
    """``rerun <the command recorded in run_meta.json> (<what>)``: the run's own command, when it can be read."""
    command = None
    try:
        meta = json.loads((folder / "run_meta.json").read_text(encoding="utf-8"))
        argv = meta.get("command") if isinstance(meta, dict) else None
        if isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv):
            command = shlex.join(["kvbench", *argv[1:]])
    except (OSError, ValueError):
        pass
    return f"rerun `{command}`, which {what}" if command else f"rerun the command that wrote it, which {what}"


def load_json_object(path: Path, fix: str) -> dict[str, Any]:
    """``path`` parsed as a JSON object, else :class:`DamagedFile` (unreadable bytes, bad JSON, not an object)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DamagedFile(path, f"not UTF-8 text (byte {err.start})", fix) from None
    except IsADirectoryError:
        raise DamagedFile(path, "a folder stands where the file should be", fix) from None
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as err:
        what = "empty" if not text.strip() else f"not valid JSON ({json_error_text(err)}, line {err.lineno})"
        raise DamagedFile(path, what, fix) from None
    if not isinstance(payload, dict):
        raise DamagedFile(path, f"holds a JSON {type(payload).__name__}, not an object", fix)
    return payload


_Check = Callable[[Any], bool]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_number_or_null(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


#: Fields every reader of ``metrics.json`` relies on, with their check and what they must be.
METRICS_FIELDS: dict[str, tuple[_Check, str]] = {
    "metric": (lambda v: isinstance(v, str), "a string"),
    "score": (_is_number_or_null, "a number or null"),
    "n_samples": (_is_int, "an integer >= 0"),
    "config_hash": (lambda v: isinstance(v, str), "a string"),
}
#: Fields every reader of ``run_meta.json`` relies on.
RUN_META_FIELDS: dict[str, tuple[_Check, str]] = {
    "config_hash": (lambda v: isinstance(v, str), "a string"),
}


def schema_version(path: Path, payload: Mapping[str, Any], fix: str) -> int:
    """The file's ``schema_version`` (:data:`UNVERSIONED` when absent); refuses a bad or newer one."""
    version = payload.get("schema_version", UNVERSIONED)
    if not _is_int(version) or version < 1:
        raise DamagedFile(path, f"schema_version={version!r} is not a version (an integer >= 1)", fix)
    if version > SCHEMA_VERSION:
        raise KVBenchError(
            f"{path} has schema_version {version}, newer than this kvbench reads ({SCHEMA_VERSION}): a newer kvbench "
            "wrote it. Nothing was changed. Fix: upgrade kvbench (pip install -U kvbench, or git pull) to read it."
        )
    return int(version)


def upgrade(payload: dict[str, Any], version: int) -> dict[str, Any]:
    """An older ``metrics.json``/``run_meta.json`` payload as the current version (version 1 -> 2: the field only)."""
    if version < 2:
        payload = {"schema_version": SCHEMA_VERSION, **payload}
    return payload


def _checked(path: Path, fields: Mapping[str, tuple[_Check, str]], fix: str) -> dict[str, Any]:
    payload = load_json_object(path, fix)
    version = schema_version(path, payload, fix)
    for key, (check, meaning) in fields.items():
        if key not in payload:
            raise DamagedFile(path, f"it lacks {key!r}", fix)
        if not check(payload[key]):
            raise DamagedFile(path, f"{key}={payload[key]!r} is not {meaning}", fix)
    return upgrade(payload, version)


def read_metrics(path: Path) -> dict[str, Any]:
    """A dataset's ``metrics.json``, checked and upgraded to :data:`SCHEMA_VERSION` (see the module docstring)."""
    path = Path(path)
    fix = rerun_fix(path.parent.parent, "recomputes metrics.json from predictions.jsonl")
    return _checked(path, METRICS_FIELDS, fix)


def read_run_meta(path: Path) -> dict[str, Any]:
    """A run's ``run_meta.json``, checked and upgraded to :data:`SCHEMA_VERSION`."""
    path = Path(path)
    fix = (
        f"if {path.parent / 'config.yaml'} is intact, rerunning the same command rewrites it; otherwise remove the "
        f"folder (rm -r {shlex.quote(str(path.parent))}) and rerun"
    )
    return _checked(path, RUN_META_FIELDS, fix)


def read_config_yaml(path: Path) -> Any:
    """A run's ``config.yaml`` as an OmegaConf config, or ``None`` when absent or unreadable."""
    from omegaconf import DictConfig, OmegaConf

    try:
        loaded = OmegaConf.load(path)
    except FileNotFoundError:
        return None
    except Exception:  # a damaged YAML file: unreadable, decided from nothing
        return None
    return loaded if isinstance(loaded, DictConfig) else None


def _delete_line_fix(path: Path, line_no: int) -> str:
    return (
        f"delete that line (sed -i '{line_no}d' {shlex.quote(str(path))}) and rerun the same command: kvbench "
        "regenerates the sample it held"
    )


def read_prediction_rows(path: Path, repair_torn_line: bool = True) -> list[dict[str, Any]]:
    """The rows of a ``predictions.jsonl``, in order, verified (see the module docstring).

    ``repair_torn_line``: cut a torn last line off the file (what a kill mid-write leaves); else ignore it."""
    path = Path(path)
    if not path.exists():
        return []
    raw = path.read_bytes()
    complete_end = raw.rfind(b"\n") + 1
    if complete_end < len(raw) and repair_torn_line:
        with open(path, "r+b") as handle:
            handle.truncate(complete_end)
    rows: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for line_no, line in enumerate(raw[:complete_end].split(b"\n")[:-1], start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            raise DamagedFile(path, f"line {line_no} is not UTF-8 text", _delete_line_fix(path, line_no)) from None
        except json.JSONDecodeError as err:
            raise DamagedFile(
                path, f"line {line_no} is not a JSON row ({json_error_text(err)})", _delete_line_fix(path, line_no)
            ) from None
        if not isinstance(row, dict) or not isinstance(row.get("id"), str) or "prediction" not in row:
            raise DamagedFile(
                path,
                f"line {line_no} is not a prediction row (a JSON object with a string 'id' and a 'prediction')",
                _delete_line_fix(path, line_no),
            )
        if row["id"] in seen:
            raise DamagedFile(
                path,
                f"line {line_no} repeats sample id {row['id']!r} of line {seen[row['id']]} (two writers?)",
                _delete_line_fix(path, line_no),
            )
        seen[row["id"]] = line_no
        rows.append(row)
    return rows
