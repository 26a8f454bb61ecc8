"""Build step that puts kvbench's shipped files into the wheel (all other metadata is in pyproject.toml).

The source keeps its layout (top-level ``conf/``, ``tasks/``, ``models/``, ``results/paper/``: the README and the
brief refer to them); ``build_py`` copies them into the package as ``kvbench/_shipped/<same layout>``, where
``kvbench.resources`` finds them through ``importlib.resources`` once installed.  Editable installs skip the copy:
``kvbench.resources`` then reads the checkout's folders directly.
"""

from __future__ import annotations

import fnmatch
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
#: Copied into ``kvbench/_shipped/`` (``kvbench.resources.SHIPPED_PACKAGE_DIR``), relative to the checkout root.
SHIPPED_FOLDERS = ("conf", "tasks", "models", "results/paper")
#: Never shipped: generator scripts (tasks/longbench/make_fixtures.py, results/paper/transcribe/) and caches.
EXCLUDED = ("*.py", "*.pyc", "__pycache__", ".*")


def shipped_files() -> list[Path]:
    """The data files of :data:`SHIPPED_FOLDERS`, relative to the checkout root, sorted."""
    files = []
    for folder in SHIPPED_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            relative = path.relative_to(ROOT)
            if path.is_file() and not any(
                fnmatch.fnmatch(part, pattern) for part in relative.parts for pattern in EXCLUDED
            ):
                files.append(relative)
    return files


class BuildWithShippedFiles(build_py):
    """``build_py`` plus a copy of the shipped folders into ``<build_lib>/kvbench/_shipped``."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "kvbench" / "_shipped"
        shutil.rmtree(target, ignore_errors=True)  # a reused build folder must not keep files removed since
        for relative in shipped_files():
            destination = target / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / relative, destination)


setup(cmdclass={"build_py": BuildWithShippedFiles})
