"""One small registry for everything kvbench looks up by name: method families, task kinds, data preparers.

Built-in entries register themselves when their module is imported (``@registry.register(name)``); ``discover``
imports them on first lookup, so ``build_method`` / ``build_task`` work without importing every module first.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


def submodule_importer(
    package: str, skip: tuple[str, ...] = ("base",), plugins: tuple[str, ...] = ()
) -> Callable[[], None]:
    """A ``discover`` function importing every module and subpackage directly under ``package`` (but ``skip``), then
    the ``plugins`` modules (entries registered from a higher package, named here so the lower one never imports
    it), so their ``@register`` decorators run."""

    def discover() -> None:
        path = importlib.import_module(package).__path__
        for module in pkgutil.iter_modules(path):
            if module.name not in skip:
                importlib.import_module(f"{package}.{module.name}")
        for plugin in plugins:
            importlib.import_module(plugin)

    return discover


class Registry(Generic[T]):
    """Name -> entry, filled by :meth:`register`, read by :meth:`get` (an unknown name lists the valid ones).

    Parameters
    ----------
    what:
        What an entry is, for messages (``"method family"``, ``"task kind"``).
    discover:
        Called once before the first lookup: imports the modules whose decorators register the built-in entries.
    load_missing:
        Called by :meth:`get` with a name that is not registered, before the name is refused: registers the entry
        if something outside the built-ins provides it (a plug-in, imported only when asked for).
    """

    def __init__(
        self,
        what: str,
        discover: Callable[[], None] | None = None,
        load_missing: Callable[[str], None] | None = None,
    ) -> None:
        self.what = what
        self._entries: dict[str, T] = {}
        self._discover = discover
        self._load_missing = load_missing
        self._discovered = discover is None
        self._discovering = False

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator registering its argument under ``name``; a name registered twice is an error."""

        def decorator(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.what} {name!r} is registered twice")
            self._entries[name] = entry
            return entry

        return decorator

    def registered(self, name: str) -> T | None:
        """The entry registered under ``name`` so far, or ``None`` (no discovery: for code that registers)."""
        return self._entries.get(name)

    def unregister(self, name: str) -> T:
        """Remove and return the entry registered under ``name`` (a plug-in unloading, a test cleaning up);
        ``ValueError`` naming the valid names when there is none."""
        entry = self.get(name)
        del self._entries[name]
        return entry

    def _ensure_discovered(self) -> None:
        """Run ``discover`` once (again after a failure; a lookup made while it runs sees what is there so far)."""
        if self._discovered or self._discovering or self._discover is None:
            return
        self._discovering = True
        try:
            self._discover()
            self._discovered = True
        finally:
            self._discovering = False

    def get(self, name: str) -> T:
        """The entry registered under ``name``; ``ValueError`` naming the valid names otherwise."""
        self._ensure_discovered()
        if name not in self._entries and self._load_missing is not None:
            self._load_missing(name)
        if name not in self._entries:
            noun = self.what.rsplit(" ", 1)[-1]
            plural = noun[:-1] + "ies" if noun.endswith("y") else noun + "s"
            raise ValueError(f"unknown {self.what} {name!r}; valid {plural}: {', '.join(self.names())}")
        return self._entries[name]

    def names(self) -> list[str]:
        """All registered names, sorted."""
        self._ensure_discovered()
        return sorted(self._entries)

    def as_dict(self) -> dict[str, T]:
        """A copy of the name -> entry mapping."""
        self._ensure_discovered()
        return dict(self._entries)

    def __contains__(self, name: object) -> bool:
        self._ensure_discovered()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
