"""Lazy re-exports for a package that replaced a module of the same name (``kvbench.cache``, ``kvbench.attention``,
``kvbench.models``): the old module's public names stay importable from the package, loaded on first use so that
importing one submodule of the package does not load the others."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable
from typing import Any


def lazy_reexport(package: str, source: str, names: Iterable[str]) -> tuple[Callable[[str], Any], Callable[[], list]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package`` that re-export ``names`` from the module
    ``source``: the first access imports ``source`` and caches the value in the package's namespace."""
    exported = frozenset(names)

    def __getattr__(name: str) -> Any:
        if name in exported:
            value = getattr(importlib.import_module(source), name)
            setattr(sys.modules[package], name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exported})

    return __getattr__, __dir__
