"""A run folder's lifecycle: one writer at a time, and no trace of a run that wrote no results.

* :func:`run_folder_lock` -- an exclusive ``flock`` on the run folder's own directory, which cannot be stolen: removing
  or replacing any file inside the folder leaves it held, and a second process can never take it while the first
  lives.  ``<folder>/.kvbench.lock`` is locked too and names the holder (pid, host, SLURM job).  The kernel releases
  both when the process ends, even on SIGKILL.  Where directories cannot be locked (NFS, where ``flock`` is emulated
  with byte-range locks that need a file open for writing) the lock file alone is the lock; where ``flock`` fails
  altogether (some NFS/Lustre mounts) it falls back to an ``O_EXCL`` lock file, ``<folder>/.kvbench.lock.excl``,
  holding the owner; an owner that is provably gone (same host and dead pid, or an earlier attempt of this SLURM
  job) is replaced.  In every mode the folder is registered with :mod:`kvbench.storage.ownership`, and every write
  into it first checks that what was locked (the folder, else the lock file) is still there, the same inode: a run
  whose lock was removed or replaced stops before its next write (docs/results.md, "Locks").  A second process
  fails with a :class:`KVBenchError` naming the holder, after waiting up to ``$KVBENCH_LOCK_WAIT`` seconds.  Every
  retry loop is bounded: a folder that vanishes after each ``mkdir`` (``/proc``) ends in an error, not a spin.
* :func:`check_not_locked` -- the same "in use" error before any heavy work (data, model), without creating anything,
  when the run would not wait (``$KVBENCH_LOCK_WAIT`` is 0); :func:`lock_wait_seconds` checks that variable.
* :func:`claim_run_folder` -- creates the folder, takes the lock, and if the run fails before the folder holds any
  prediction or metrics, removes everything kvbench wrote there (and the parent folders it created), so that a
  failed run never blocks the next command (``results/`` is as it was) -- only while the folder is still the one it
  locked: a folder moved or replaced mid-run is left alone, and the run ends with one message saying so.
"""

from __future__ import annotations

import errno
import fcntl
import math
import os
import platform
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from kvbench.errors import Interrupted, KVBenchError
from kvbench.storage import ownership
from kvbench.storage.writers import CONFIG_FILE, PREDICTIONS_FILE, RUN_META_FILE, TIMINGS_FILE, holds_results

LOCK_FILE = ".kvbench.lock"
EXCL_LOCK_FILE = ".kvbench.lock.excl"
#: ``flock`` errors that mean "this file system cannot lock", not "someone holds the lock".
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS}
_BUSY = {errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK}
_HOLDER = re.compile(r"^pid (\d+) on (\S+?)(?:, SLURM job (\S+?))?, since")
_HOLDER_CONFIG = re.compile(r", config ([0-9a-f]+)\s*$")
#: How many times the lock loop re-creates a folder that vanished between ``mkdir`` and ``open`` (a run that wrote
#: nothing removing it concurrently) before giving up: a vanishing that repeats is not a race but a place where
#: folders cannot be made (``/proc``), and the loop must not spin forever.
MAX_VANISHED_RETRIES = 20
LOCK_WAIT_ENV = "KVBENCH_LOCK_WAIT"


def holder_line(config: str | None = None) -> str:
    """Who holds a lock: ``pid <pid> on <host>[, SLURM job <id>], since <UTC time>[, config <hash>]`` (``config``:
    the config hash of the run that holds the folder, so that a run of another config takes a folder of its own,
    :func:`holder_config`)."""
    job = os.environ.get("SLURM_JOB_ID")
    since = datetime.now(timezone.utc).isoformat(timespec="seconds")
    line = f"pid {os.getpid()} on {platform.node()}" + (f", SLURM job {job}" if job else "") + f", since {since}"
    return line + (f", config {config}" if config else "")


def holder_config(folder: Path) -> str | None:
    """The config hash of the live process that holds ``folder``'s lock (its holder line), ``None`` when nobody
    holds it, or the holder names no config (a kvbench of before the field)."""
    try:
        _probe_directory_lock(folder)
        check_not_locked_now(folder)
    except KVBenchError:
        for name in (LOCK_FILE, EXCL_LOCK_FILE):
            match = _HOLDER_CONFIG.search(_read_holder(folder / name, patience_s=0.2))
            if match:
                return match.group(1)
    return None


def _busy_error(folder: Path, holder: str, lock_path: Path | None = None) -> KVBenchError:
    stale = f" If that process is gone, remove {lock_path}." if lock_path is not None else ""
    return KVBenchError(
        f"{folder} is in use by another kvbench process ({holder}); nothing was changed. Two jobs with the same "
        "model/task/method/budget/tag cannot run at once: wait for it, set KVBENCH_LOCK_WAIT=<seconds> to wait, or "
        f"use run.tag=<name>.{stale}"
    )


def _read_holder(path: Path, patience_s: float = 1.0) -> str:
    """The holder line of a lock file; the holder writes it just after locking, so wait briefly for it."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            text = path.read_text(encoding="utf-8", errors="replace").strip()
        except FileNotFoundError:
            text = ""
        if text or time.monotonic() >= deadline:
            return text or "a kvbench process that has just started and not yet recorded its pid"
        time.sleep(0.05)


def lock_wait_seconds(wait_s: float | None = None) -> float:
    """``wait_s``, else ``$KVBENCH_LOCK_WAIT`` (default 0): how long to wait for a busy run folder.

    Raises :class:`KVBenchError` for a value that is not a finite number of seconds >= 0 (checked before any work
    by :func:`kvbench.app.validation.check_environment`)."""
    if wait_s is not None:
        return wait_s
    raw = os.environ.get(LOCK_WAIT_ENV, "0") or "0"
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise KVBenchError(
            f"{LOCK_WAIT_ENV}={raw!r} is not a number of seconds >= 0: it is how long a run waits for another "
            f"process to release its run folder (0, the default, fails at once). Fix: e.g. {LOCK_WAIT_ENV}=600, "
            f"or unset it."
        )
    return seconds


def check_not_locked(folder: Path) -> None:
    """Fail at once, before any heavy work, when another process holds ``folder``'s lock and the run would not wait
    for it (``$KVBENCH_LOCK_WAIT`` is 0).  Creates nothing: it only opens an existing lock file to probe it (the
    lock itself is taken later, by :func:`claim_run_folder`, when the run is ready to write)."""
    if lock_wait_seconds() > 0:
        return
    check_not_locked_now(folder)


def check_not_locked_now(folder: Path) -> None:
    """:func:`check_not_locked` whatever ``$KVBENCH_LOCK_WAIT`` says."""
    _probe_directory_lock(folder)
    for name in (LOCK_FILE, EXCL_LOCK_FILE):
        path = folder / name
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:  # no lock file (or unreadable): nobody to wait for, or the claim reports it
            continue
        try:
            if name == EXCL_LOCK_FILE:
                holder = _read_holder(path, patience_s=0)
                if not _holder_is_gone(holder):
                    raise _busy_error(folder, holder, lock_path=path)
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError as err:
                if err.errno in _BUSY:
                    raise _busy_error(folder, _read_holder(path)) from None
        finally:
            os.close(fd)  # releases the shared probe lock, if taken


def _probe_directory_lock(folder: Path) -> None:
    """The "in use" error when another process holds ``folder``'s directory lock (even if its lock file is gone)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:  # no folder (or not a folder: the claim reports it)
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno in _BUSY:
            raise _busy_error(folder, _read_holder(folder / LOCK_FILE, patience_s=0.2)) from None
    finally:
        os.close(fd)


@contextmanager
def run_folder_lock(folder: Path, wait_s: float | None = None, config: str | None = None) -> Iterator[Path]:
    """Hold the run folder's exclusive lock (see the module docstring); yields the lock file's path.  ``config``:
    the holding run's config hash, written in the holder line (:func:`holder_line`).

    The lock is ``flock`` on the folder's own directory, which no file removal or replacement inside it can steal;
    ``.kvbench.lock`` is locked too (what older kvbench versions lock) and names the holder.  Where directories
    cannot be locked (NFS) the lock file alone is the lock.  The folder (or that lock file) is registered with
    :mod:`kvbench.storage.ownership`, so every write checks it is still the one locked."""
    deadline = time.monotonic() + lock_wait_seconds(wait_s)
    vanished = 0
    while True:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError as err:  # a run that wrote nothing removed the folder meanwhile: make it again
            vanished = _count_vanished(folder, vanished, err)
            continue
        try:
            locked = _try_flock(dir_fd)
        except OSError as err:
            os.close(dir_fd)
            if err.errno not in _NO_FLOCK | {errno.EBADF}:  # NFS: directories open read-only cannot be locked
                raise
            try:
                with _lock_file(folder, deadline, config=config) as lock_path:
                    yield lock_path
                return
            except _Vanished as vanished_err:
                vanished = _count_vanished(folder, vanished, vanished_err.__cause__)
                continue
        if locked and _same_file(dir_fd, folder):
            try:
                with _lock_file(folder, deadline, anchor_fd=dir_fd, config=config) as lock_path:
                    yield lock_path
                return
            except _Vanished as err:
                vanished = _count_vanished(folder, vanished, err.__cause__)
                continue
            finally:
                os.close(dir_fd)
        os.close(dir_fd)
        if locked:  # we locked a folder that a discarded run had just removed: take the new one
            vanished = _count_vanished(folder, vanished, None)
            continue
        if time.monotonic() >= deadline:
            raise _busy_error(folder, _read_holder(folder / LOCK_FILE))
        time.sleep(min(1.0, max(0.05, deadline - time.monotonic())))


class _Vanished(Exception):
    """The locked folder disappeared before its lock file could be made (a discarded run removed it)."""


def _count_vanished(folder: Path, vanished: int, err: BaseException | None) -> int:
    """One more vanished folder; :class:`KVBenchError` once it keeps happening (see :data:`MAX_VANISHED_RETRIES`)."""
    vanished += 1
    if vanished > MAX_VANISHED_RETRIES:
        why = getattr(err, "strerror", None) or err or "it vanishes as soon as it is made"
        raise KVBenchError(
            f"cannot create the run folder {folder} ({why}, {vanished} tries): its parent does not keep new folders. "
            "Point run.output_root at an ordinary writable folder (e.g. run.output_root=results/runs)."
        )
    time.sleep(0.01)
    return vanished


@contextmanager
def _lock_file(
    folder: Path, deadline: float, anchor_fd: int | None = None, config: str | None = None
) -> Iterator[Path]:
    """Lock ``.kvbench.lock`` (``anchor_fd``: the folder's directory, already locked, is what identifies the hold;
    without it the lock file does) and record the holder in it; falls back to ``O_EXCL`` where ``flock`` is
    unsupported."""
    path = folder / LOCK_FILE
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except FileNotFoundError as err:  # the folder vanished: run_folder_lock makes it again
            raise _Vanished from err
        try:
            locked = _try_flock(fd)
        except OSError as err:
            os.close(fd)
            if err.errno not in _NO_FLOCK:
                raise
            with _excl_lock(folder, deadline, config) as excl_path:
                anchor = folder if anchor_fd is not None else excl_path
                ownership.hold(folder, anchor, ownership.identity_of(anchor))
                try:
                    yield excl_path
                finally:
                    ownership.release(folder)
            return
        if locked and (anchor_fd is not None or _same_file(fd, path)):
            break
        os.close(fd)
        if locked:  # a lock file that a discarded run had just removed: take the new one
            continue
        if time.monotonic() >= deadline:  # an older kvbench (file lock only) holds the folder
            raise _busy_error(folder, _read_holder(path))
        time.sleep(min(1.0, max(0.05, deadline - time.monotonic())))
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (holder_line(config) + "\n").encode(), 0)
        held = ownership.identity(anchor_fd if anchor_fd is not None else fd)
        ownership.hold(folder, folder if anchor_fd is not None else path, held)
        yield path
    finally:
        ownership.release(folder)
        os.close(fd)  # closing the descriptor releases the flock


def _try_flock(fd: int) -> bool:
    """Non-blocking exclusive flock: True when taken, False when another process holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno in _BUSY:
            return False
        raise
    return True


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (a discarded run may have removed it)."""
    try:
        held, named = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)


@contextmanager
def _excl_lock(folder: Path, deadline: float, config: str | None = None) -> Iterator[Path]:
    """The ``O_EXCL`` fallback: the lock is the existence of ``.kvbench.lock.excl``."""
    path = folder / EXCL_LOCK_FILE
    mine = holder_line(config)
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            holder = _read_holder(path)
            if _holder_is_gone(holder):
                _unlink_if_content(path, holder)
                continue
            if time.monotonic() >= deadline:
                raise _busy_error(folder, holder, lock_path=path) from None
            time.sleep(min(1.0, max(0.05, deadline - time.monotonic())))
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(mine + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        break
    try:
        yield path
    finally:
        _unlink_if_content(path, mine)


def _holder_is_gone(holder: str) -> bool:
    """Whether the process named by a holder line has provably ended."""
    match = _HOLDER.match(holder)
    if match is None:
        return False
    pid, host, job = int(match.group(1)), match.group(2), match.group(3)
    if job is not None and job == os.environ.get("SLURM_JOB_ID") and pid != os.getpid():
        return True  # an earlier attempt of this (requeued) SLURM job
    if host != platform.node():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def _unlink_if_content(path: Path, expected: str) -> None:
    """Remove ``path`` if it still holds ``expected`` (never another process's fresh lock)."""
    try:
        if path.read_text(encoding="utf-8", errors="replace").strip() == expected.strip():
            path.unlink()
    except FileNotFoundError:
        pass


def _first_missing(folder: Path) -> Path | None:
    """The outermost ancestor of ``folder`` (or itself) that does not exist yet."""
    missing = None
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            break
        missing = candidate
    return missing


#: Every run folder this process set out to claim (:func:`claim_run_folder`), in order: a command that claimed none
#: was refused before its run started (:func:`kvbench.app.cli.run_job` then removes Hydra's logs of it).
CLAIMED_FOLDERS: list[Path] = []


@contextmanager
def claim_run_folder(folder: Path, wait_s: float | None = None, config: str | None = None) -> Iterator[None]:
    """Create and lock ``folder`` for one run; if the run fails while the folder holds no results, remove what
    kvbench wrote there and the folders this call created (see the module docstring), before the lock is released:
    a process waiting for it then finds the folder gone and makes a fresh one."""
    created = _first_missing(folder)
    CLAIMED_FOLDERS.append(folder)
    with run_folder_lock(folder, wait_s, config):
        try:
            yield
        except BaseException as err:
            if not ownership.still_held(folder):  # moved or replaced mid-run: not this run's folder any more
                if isinstance(err, Exception) and not isinstance(err, Interrupted):
                    raise _moved_error(folder) from err
                raise
            if not holds_results(folder):
                discard_run_files(folder)
                (folder / LOCK_FILE).unlink(missing_ok=True)
                if created is not None:
                    _remove_empty_dirs(folder, created)
            raise


def _moved_error(folder: Path) -> KVBenchError:
    """The error of a run whose folder was moved or replaced while it ran (cleanup deletes nothing then)."""
    now = "was replaced by another folder" if folder.exists() else "is gone (moved or removed)"
    return KVBenchError(
        f"the run folder {folder} {now} while this run was writing to it, so the run stopped; nothing was deleted "
        "(what it wrote is wherever the folder went). Fix: put the folder back and rerun the same command to resume "
        "it, or rerun it with run.output_root=<the folder it was moved under>"
    )


def discard_run_files(folder: Path) -> None:
    """Remove what kvbench writes in a run folder that holds no results: ``config.yaml``, ``run_meta.json``,
    empty prediction and timing logs, temporary files and W&B's offline folder.  Anything else stays."""
    for path in (folder / CONFIG_FILE, folder / RUN_META_FILE, *folder.glob(".*.tmp")):
        path.unlink(missing_ok=True)
    for sub in [p for p in folder.iterdir() if p.is_dir()]:
        if sub.name == "wandb":
            shutil.rmtree(sub, ignore_errors=True)
            continue
        for path in (sub / PREDICTIONS_FILE, sub / TIMINGS_FILE, *sub.glob(".*.tmp")):
            path.unlink(missing_ok=True)
        _rmdir_if_empty(sub)


def _remove_empty_dirs(folder: Path, created: Path) -> None:
    """Remove ``folder`` and its parents up to ``created`` (the outermost one this run made), while empty."""
    current = folder
    while _rmdir_if_empty(current) and current != created:
        current = current.parent


def _rmdir_if_empty(path: Path) -> bool:
    try:
        path.rmdir()
    except OSError:  # not empty (another run, or files kvbench does not own) or already gone
        return not path.exists()
    return True
