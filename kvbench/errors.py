"""User-facing errors and the stop signal: run.py prints their message (no traceback) and exits with one code."""

#: Exit status of every user error (bad config value, missing data/model/package, busy run folder).
USER_ERROR_EXIT = 2
#: Exit status of a run stopped by SIGTERM/SIGINT (128 + 15); rerunning the same command resumes it.
INTERRUPTED_EXIT = 143


class KVBenchError(Exception):
    """A problem with the user's input or environment, with a message that says how to fix it."""


class Interrupted(Exception):
    """SIGTERM/SIGINT received: predictions written so far are kept; the run can be resumed."""
