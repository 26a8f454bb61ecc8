"""Old import paths kept working after a move.

* :func:`lazy_reexport` -- a package that replaced a module of the same name (``kvbench.cache``,
  ``kvbench.attention``, ``kvbench.models``): the old module's public names stay importable from the package, loaded
  on first use so that importing one submodule of the package does not load the others.  The names are the source
  module's own (every public, non-module attribute), read from it when first asked for: no list is kept by hand.
* :func:`alias_moved_modules` -- modules moved to another package (issue #57: the method machinery to
  ``kvbench.eviction``, the application layer to ``kvbench.app``): importing one by its old dotted name gives the
  moved module itself, with a ``DeprecationWarning`` naming the new path.  The old names are no files, so nothing is
  imported twice and the folders hold only what lives there.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import inspect
import sys
import warnings
from collections.abc import Callable, Mapping
from types import ModuleType
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


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Old dotted module name -> the moved module (the same object), found before the path-based finders."""

    def __init__(self, moved: Mapping[str, str], issue: str) -> None:
        self.moved, self.issue = dict(moved), issue

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        return importlib.util.spec_from_loader(fullname, self) if fullname in self.moved else None

    def create_module(self, spec: Any) -> ModuleType:
        new = self.moved[spec.name]
        warnings.warn(f"{spec.name} moved to {new} ({self.issue}); import it from there", DeprecationWarning, 3)
        module = importlib.import_module(new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._spec  # the import system set the alias's spec on the module: give it back its own


def alias_moved_modules(moved: Mapping[str, str], issue: str) -> None:
    """Make each old dotted module name of ``moved`` (old -> new) import the module at its new path, with a
    ``DeprecationWarning`` naming it and ``issue``; installed once per mapping (a re-import adds nothing)."""
    for finder in sys.meta_path:
        if isinstance(finder, _MovedModules) and finder.moved == dict(moved):
            return
    sys.meta_path.append(_MovedModules(moved, issue))
