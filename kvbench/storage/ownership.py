"""Which run folders this process holds, checked before every write into one of them.

:func:`kvbench.storage.folder.run_folder_lock` registers the folder it locked (:func:`hold`) with the identity
(device, inode) of what it locked: the folder itself (``flock`` on its directory), or, where the file system cannot
lock a directory (NFS), the lock file.  The writers (:mod:`kvbench.storage.writers`) call :func:`check_held` before
each write under a held folder: if the folder or lock file was removed or replaced meanwhile (``rm -r``, a copy over
it), the run stops with one message instead of writing into a folder another process may now hold.
"""

from __future__ import annotations

import os
from pathlib import Path

from kvbench.errors import KVBenchError

#: Held folder (absolute) -> (path whose identity is checked, its (st_dev, st_ino)).
_HELD: dict[Path, tuple[Path, tuple[int, int]]] = {}


def identity(fd: int) -> tuple[int, int]:
    """``(st_dev, st_ino)`` of an open descriptor."""
    stat = os.fstat(fd)
    return stat.st_dev, stat.st_ino


def identity_of(path: Path) -> tuple[int, int]:
    """``(st_dev, st_ino)`` of a path."""
    stat = os.stat(path)
    return stat.st_dev, stat.st_ino


def hold(folder: Path, anchor: Path, held: tuple[int, int]) -> None:
    """Record that this process holds ``folder``, locked through ``anchor`` (the folder or its lock file) whose
    identity is ``held``."""
    _HELD[Path(os.path.abspath(folder))] = (Path(os.path.abspath(anchor)), held)


def release(folder: Path) -> None:
    _HELD.pop(Path(os.path.abspath(folder)), None)


def still_held(folder: Path) -> bool:
    """Whether ``folder`` is still what this process locked (the anchor's device and inode unchanged); ``True`` for
    a folder this process does not hold (nothing to compare).  Cleanup runs only where this is true: a folder moved
    or replaced mid-run is another folder now, and nothing in it is this run's to delete."""
    entry = _HELD.get(Path(os.path.abspath(folder)))
    if entry is None:
        return True
    anchor, held = entry
    try:
        return identity_of(anchor) == held
    except OSError:
        return False


def check_held(path: Path) -> None:
    """Before writing ``path``: if it lies in a folder this process holds, that folder's lock must still be the one
    taken (same device and inode); else :class:`KVBenchError` (nothing is written)."""
    if not _HELD:
        return
    target = Path(os.path.abspath(path))
    for folder, (anchor, held) in _HELD.items():
        if folder != target and folder not in target.parents:
            continue
        try:
            stat = os.stat(anchor)
            now = (stat.st_dev, stat.st_ino)
        except OSError:
            now = None
        if now != held:
            raise KVBenchError(
                f"{anchor} was removed or replaced while this run held {folder}, so another process may be writing "
                f"there now; this run stopped before writing {target.name} (what it wrote before is kept). Fix: "
                "check that no other kvbench job uses that folder, then rerun the same command: it resumes."
            )
