"""User-facing errors and the stop signal: run.py prints their message (no traceback) and exits with one code."""

#: Exit status of every user error (bad config value, missing data/model/package, busy run folder).
USER_ERROR_EXIT = 2
#: Exit status of a run stopped by SIGTERM/SIGINT (128 + 15); rerunning the same command resumes it.
INTERRUPTED_EXIT = 143


class KVBenchError(Exception):
    """A problem with the user's input or environment, with a message that says how to fix it."""


class Interrupted(Exception):
    """SIGTERM/SIGINT received: predictions written so far are kept; the run can be resumed."""


#: ``OSError`` numbers that mean the user's environment refused a file operation, not a bug in kvbench.
_ENVIRONMENT_ERRNOS = {
    "ENOSPC": "no space left on the device (disk full)",
    "EDQUOT": "disk quota exceeded",
    "EACCES": "permission denied",
    "EPERM": "operation not permitted",
    "EROFS": "read-only file system",
    "ENOTDIR": "a file stands where a folder is needed",
    "EISDIR": "a folder stands where a file is needed",
    "EEXIST": "a file of that name is in the way",
}


def environment_error_message(err: BaseException) -> str | None:
    """One paragraph for an ``OSError`` the environment caused (disk full, permission denied, read-only, a file in
    the way), naming the file and the fix; ``None`` for any other error (a bug keeps its traceback)."""
    import errno as errno_names

    if not isinstance(err, OSError) or err.errno is None:
        return None
    name = errno_names.errorcode.get(err.errno, "")
    what = _ENVIRONMENT_ERRNOS.get(name)
    if what is None:
        return None
    where = f" {err.filename}" if err.filename else ""
    if name in ("ENOSPC", "EDQUOT"):
        fix = (
            "Free some space (or point run.output_root / --out elsewhere) and rerun the same command: a run resumes "
            "from the predictions already written, and a half-written line is cut off and regenerated."
        )
    elif name in ("EACCES", "EPERM", "EROFS"):
        fix = "Make it writable (chmod / chown), or point run.output_root / --out at a folder you can write."
    else:
        fix = "Move what is in the way, or point run.output_root / --out elsewhere."
    return f"cannot write{where}: {what} ({err.strerror or name}). Nothing was lost. {fix}"


class _EnvironmentErrors:
    """``with environment_errors():`` -- an ``OSError`` the environment caused becomes one :class:`KVBenchError`
    (:func:`environment_error_message`); any other exception passes unchanged (for the Python API)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, err: BaseException | None, traceback: object) -> bool:
        message = environment_error_message(err) if err is not None else None
        if message is not None:
            raise KVBenchError(message) from err
        return False


environment_errors = _EnvironmentErrors
