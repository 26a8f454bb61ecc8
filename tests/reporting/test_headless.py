"""The headless-browser helper closes cleanly (issue #60, item 6): Chromium and every process it started end, and
its profile folder is removed, every time -- the browser exits before its renderers and helpers, which used to
write into the profile while it was being removed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvbench.reporting.headless import HeadlessChromium, _group_alive, find_chromium


@pytest.mark.skipif(find_chromium() is None, reason="no Chromium (make setup-browser)")
def test_close_ends_every_chromium_process_and_removes_the_profile(tmp_path: Path) -> None:
    page = tmp_path / "page.html"
    page.write_text("<html><body><p id='x'>hello</p><script>document.body.dataset.done = '1'</script></body></html>")
    for _ in range(3):  # the race showed now and then: a few rounds
        with HeadlessChromium() as browser:
            browser.open(page)
            assert browser.evaluate("document.getElementById('x').textContent") == "hello"
            profile, group = browser._profile, browser.process.pid
            assert profile.is_dir() and os.getpgid(group) == group
        assert not profile.exists()
        assert not _group_alive(group)
