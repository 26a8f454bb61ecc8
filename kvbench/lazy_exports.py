"""Lazy re-exports for a package that replaced a module of the same name (``kvbench.cache``, ``kvbench.attention``,
``kvbench.models``): the old module's public names stay importable from the package, loaded on first use so that
importing one submodule of the package does not load the others.

The names are the source module's own (every public, non-module attribute), read from it when first asked for:
no list is kept by hand next to it.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from typing import Any


def lazy_reexport(package: str, source: str) -> tuple[Callable[[str], Any], Callable[[], list]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package`` that re-export the public names of the module
    ``source`` (no leading underscore, not a module): the first access imports ``source`` and caches the value in
    the package's namespace; a submodule of ``package`` is never shadowed."""

    def public(module: Any) -> set[str]:
        return {
            name
            for name, value in vars(module).items()
            if not name.startswith("_") and not inspect.ismodule(value) and name != "annotations"
        }

    def __getattr__(name: str) -> Any:
        # ``from package import submodule`` asks here first: a submodule not yet imported is left to the import
        # system (importing ``source`` to look for it would load what the lazy re-export is there to avoid).
        if not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}") is None:
            module = importlib.import_module(source)
            if name in public(module):
                value = getattr(module, name)
                setattr(sys.modules[package], name, value)
                return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *public(importlib.import_module(source))})

    return __getattr__, __dir__
