"""Open a page in headless Chromium and drive it over the DevTools protocol through a pipe (no extra package).

Chromium started with ``--remote-debugging-pipe`` reads DevTools commands from file descriptor 3 and writes
responses and events to descriptor 4, each message one JSON object followed by a NUL byte.  :class:`HeadlessChromium`
starts it once (a fresh ``--user-data-dir``; no network services: ``--disable-background-networking``,
``--disable-component-update``, ``--disable-sync``, ``--disable-quic``, ``--no-first-run``), opens a tab, and offers
what the results-site tests and the README screenshot need: :meth:`~HeadlessChromium.open` (navigate and wait for the
load event), :meth:`~HeadlessChromium.evaluate` (a JavaScript expression's JSON value),
:meth:`~HeadlessChromium.screenshot` (PNG bytes) and :attr:`~HeadlessChromium.errors` (every console error,
uncaught exception and failed resource load seen so far).

    with HeadlessChromium() as browser:
        browser.open(Path("results/site/index.html"))
        rows = browser.evaluate("document.querySelectorAll('tr.lb-row').length")
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any

from kvbench.errors import KVBenchError

#: Where Debian/Ubuntu put Chromium (``make setup-browser``), tried in order after ``$KVBENCH_CHROMIUM``.
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
)


def find_chromium() -> str | None:
    """The Chromium executable: ``$KVBENCH_CHROMIUM``, else the first of :data:`CHROMIUM_NAMES` on ``PATH``."""
    explicit = os.environ.get("KVBENCH_CHROMIUM")
    if explicit:
        return explicit if shutil.which(explicit) else None
    return next((path for name in CHROMIUM_NAMES if (path := shutil.which(name))), None)


#: Seconds Chromium's processes get to exit after SIGTERM before SIGKILL.
CLOSE_GRACE_S = 10.0


def _signal_group(group: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, sig)


def _group_alive(group: int) -> bool:
    """Whether any process of the group is left (a zombie of this process's own child counts until reaped)."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_profile(folder: Path, attempts: int = 20) -> None:
    """Remove Chromium's profile folder, retrying while a process that just ended still has files appearing."""
    for _ in range(attempts):
        shutil.rmtree(folder, ignore_errors=True)
        if not folder.exists():
            return
        time.sleep(0.1)
    warnings.warn(f"could not remove Chromium's profile folder {folder}; remove it by hand", stacklevel=3)


class HeadlessChromium:
    """One headless Chromium process with one tab, driven over the DevTools pipe (module docstring)."""

    def __init__(self, executable: str | None = None, width: int = 1280, height: int = 900, timeout_s: float = 60.0):
        self.executable = executable or find_chromium()
        if self.executable is None:
            raise KVBenchError(f"no Chromium found (tried $KVBENCH_CHROMIUM, {', '.join(CHROMIUM_NAMES)})")
        self.width, self.height, self.timeout_s = width, height, timeout_s
        self.errors: list[str] = []
        self._next_id = 0
        self._buffer = b""
        self._events: list[dict[str, Any]] = []
        self._session: str | None = None

    def __enter__(self) -> HeadlessChromium:
        self._profile = Path(tempfile.mkdtemp(prefix="kvbench-chromium-"))
        to_browser_read, self._to_browser = os.pipe()
        self._from_browser, from_browser_write = os.pipe()
        # The child's descriptors 3 and 4 must be exactly these pipe ends: copy them to free numbers >= 10 first,
        # so that moving them to 3 and 4 in the child cannot overwrite one with the other.
        high_in = fcntl.fcntl(to_browser_read, fcntl.F_DUPFD_CLOEXEC, 10)
        high_out = fcntl.fcntl(from_browser_write, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_browser_read)
        os.close(from_browser_write)

        def attach_pipes() -> None:
            os.dup2(high_in, 3)
            os.dup2(high_out, 4)

        command = [
            self.executable,
            *FLAGS,
            f"--user-data-dir={self._profile}",
            f"--window-size={self.width},{self.height}",
            "about:blank",
        ]
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(3, 4, high_in, high_out),
            preexec_fn=attach_pipes,  # the fds must be at 3 and 4 (single-threaded caller)
            start_new_session=True,  # its own process group: close() ends the renderers and helpers too
        )
        os.close(high_in)
        os.close(high_out)
        try:
            target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            self._session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                self.send(f"{domain}.enable")
            self.send(
                "Emulation.setDeviceMetricsOverride",
                {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False},
            )
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Stop Chromium and every process it started, then remove its profile folder.

        The browser process exits before its children (renderer, GPU and utility processes, the zygote), which may
        still write into the profile: removing the folder at once could fail ("Directory not empty").  So the whole
        process group is ended (SIGTERM, then SIGKILL after :data:`CLOSE_GRACE_S`) and waited for, and only then is
        the folder removed, retried while a straggler's files appear; a folder that still cannot be removed is left
        in the temporary folder with a warning, never an error (the page was already read)."""
        for fd in (self._to_browser, self._from_browser):
            with contextlib.suppress(OSError):
                os.close(fd)
        group = self.process.pid  # the session leader's pid is its process group's id
        _signal_group(group, signal.SIGTERM)
        try:
            self.process.wait(timeout=CLOSE_GRACE_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        deadline = time.monotonic() + CLOSE_GRACE_S
        while _group_alive(group) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _group_alive(group):
            _signal_group(group, signal.SIGKILL)
        _remove_profile(self._profile)

    # ------------------------------------------------------------------------------------------ the protocol
    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise TimeoutError("no answer from Chromium's DevTools pipe in time")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError(f"Chromium closed its DevTools pipe (exit status {self.process.poll()})")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message = json.loads(raw)
        if "method" in message:
            self._note_event(message)
        return message

    def _note_event(self, event: dict[str, Any]) -> None:
        """Keep the event; record console errors, exceptions and failed loads in :attr:`errors`."""
        self._events.append(event)
        params = event.get("params") or {}
        if event["method"] == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.errors.append(
                "console: " + " ".join(str(a.get("value", a.get("description"))) for a in params["args"])
            )
        elif event["method"] == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails") or {}
            self.errors.append("exception: " + str((details.get("exception") or {}).get("description") or details))
        elif event["method"] == "Log.entryAdded" and (params.get("entry") or {}).get("level") == "error":
            entry = params["entry"]
            self.errors.append(f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}".strip())

    def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send one DevTools command (to the tab once attached) and return its result."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if self._session and not method.startswith("Target."):
            message["sessionId"] = self._session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"DevTools {method} failed: {reply['error']}")
                return reply.get("result") or {}

    def wait_for_event(self, method: str) -> dict[str, Any]:
        """Wait for (and consume) the next event named ``method``."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            for i, event in enumerate(self._events):
                if event["method"] == method:
                    return self._events.pop(i)
            self._read_message(deadline)

    # ------------------------------------------------------------------------------------------ page helpers
    def open(self, path: str | Path) -> None:
        """Load ``path`` (a file, as a ``file://`` URL) and wait for its load event."""
        self._events.clear()
        url = Path(path).resolve().as_uri()
        self.send("Page.navigate", {"url": url})
        self.wait_for_event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression in the page (an exception is raised as ``RuntimeError``)."""
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"JavaScript error in {expression!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, full_page: bool = False) -> bytes:
        """A PNG of the viewport (or of the whole page)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
        return base64.b64decode(self.send("Page.captureScreenshot", params)["data"])
