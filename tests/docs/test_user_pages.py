"""The pages a user reads carry no maintainer notes (issue #60, item 6): no issue numbers, no notes about the
machines the project was built on, outside the changelog (where the history belongs).  Measured figures keep their
machine and load on the pages that report measurements (performance, the benchmarks' cost notes); the guides a new
user follows (:data:`GUIDES`) give timings without the build machine's load."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: The one page that keeps the project's history, issue numbers included.
HISTORY = "docs/changelog.md"
#: What a maintainer note looks like on a user page.
MAINTAINER_NOTES = {
    "an issue number": re.compile(r"\b[Ii]ssues? #\d+"),
    "the engineers who built it": re.compile(r"\bengineers?('s?)?\b", re.IGNORECASE),
    "the build machine": re.compile(r"\bthis machine\b|\bW&B server\b", re.IGNORECASE),
}
#: The guides, where a timing is given without the build machine's load average.
GUIDES = (
    "README.md",
    "docs/index.md",
    "docs/getting-started.md",
    "docs/results.md",
    "docs/dashboards.md",
    "docs/configuration.md",
    "docs/glossary.md",
)


def user_pages() -> list[str]:
    pages = ["README.md", *(str(p.relative_to(REPO)) for p in sorted((REPO / "docs").rglob("*.md")))]
    return [page for page in pages if page != HISTORY]


@pytest.mark.parametrize("page", user_pages())
def test_no_maintainer_notes_outside_the_changelog(page: str) -> None:
    text = (REPO / page).read_text(encoding="utf-8")
    found = [
        f"{what}: {line.strip()[:120]!r}"
        for line in text.splitlines()
        for what, pattern in MAINTAINER_NOTES.items()
        if pattern.search(line)
    ]
    if page in GUIDES:
        found += [f"a load average: {line.strip()[:120]!r}" for line in text.splitlines() if "load average" in line]
    assert not found, f"{page}:\n" + "\n".join(found)


def test_the_history_page_exists() -> None:
    assert (REPO / HISTORY).is_file()
