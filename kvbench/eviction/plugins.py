"""Methods from other packages: the entry-point group ``kvbench.methods`` (issue #41).

A package adds a method by defining a one-class method (:class:`kvbench.eviction.recipe.ScorerMethod`) and declaring
it in its packaging metadata, the entry point's name being the family::

    [project.entry-points."kvbench.methods"]
    keydiff = "my_package.keydiff:KeyDiff"

kvbench finds the entry points at start-up without importing them (:func:`method_entry_points`).  A plug-in is
imported only when its method is asked for (``method=keydiff``, or a lookup of family ``keydiff`` in the method
registry: :func:`load_plugin`) or listed (``kvbench list methods`` loads them all, and shows one that fails to import
as broken, with its error), so a broken plug-in never breaks another method (issue #55 item 5).  An entry point
named like one of kvbench's own families never replaces or blocks it: the built-in runs, and the clash is reported
once (:func:`clash_message`).  The providing package's name and version are recorded in the method's default preset
(``reference``, so in the config hash) and in ``run_meta.json`` (``method_package``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from importlib.metadata import EntryPoint, entry_points
from typing import Any

LOG = logging.getLogger(__name__)

#: The entry-point group a package declares its methods in.
ENTRY_POINT_GROUP = "kvbench.methods"
#: Family -> ``{"package": ..., "version": ...}`` of every plug-in method loaded so far.
PLUGIN_PACKAGES: dict[str, dict[str, str]] = {}
#: The entry points already reported as named like a built-in family (each is reported once per process).
_CLASHES_REPORTED: set[str] = set()


class PluginError(ValueError):
    """A plug-in method that cannot be used: its module fails to import, or it defines no method of its family."""


def method_entry_points() -> dict[str, EntryPoint]:
    """The installed packages' methods by family (entry-point name), not imported."""
    return {point.name: point for point in entry_points(group=ENTRY_POINT_GROUP)}


def package_of(point: EntryPoint) -> dict[str, str]:
    """``{"package": ..., "version": ...}`` of the distribution declaring ``point`` (its module when unknown)."""
    distribution = point.dist
    return {
        "package": distribution.metadata["Name"] if distribution else point.module,
        "version": distribution.version if distribution else "unknown",
    }


def load_plugin(family: str) -> dict[str, str] | None:
    """Import the plug-in method ``family`` (its class registers itself); its package and version, or ``None`` when
    no installed package declares it.  :class:`PluginError` (a ``ValueError``), naming the package, the entry point
    and the fix, when its module fails to import or the entry point is not a one-class method of that family (it
    must name the class: ``module:Class``).  The caller makes sure ``family`` is not one of kvbench's own."""
    if family in PLUGIN_PACKAGES:
        return PLUGIN_PACKAGES[family]
    point = method_entry_points().get(family)
    if point is None:
        return None
    package = package_of(point)
    where = f"entry point {family} = {point.value!r} (group {ENTRY_POINT_GROUP}) of package {package['package']}"
    try:
        loaded: Any = point.load()  # defining the class registers it (kvbench.eviction.recipe)
    except Exception as err:  # any failure of another package's code: that method is unusable, nothing else
        raise PluginError(
            f"method {family!r} cannot be loaded: {where} fails to import ({type(err).__name__}: {err}). Fix or "
            f"reinstall {package['package']}, or uninstall it (pip uninstall {package['package']}); kvbench's own "
            "methods are unaffected"
        ) from err
    if not isinstance(loaded, type) or getattr(loaded, "family", None) != family:
        raise PluginError(
            f"{where} defines no one-class method of family {family!r}: the class must subclass "
            f"kvbench.eviction.recipe.ScorerMethod with family={family!r}"
        )
    PLUGIN_PACKAGES[family] = package
    return package


def clash_message(point: EntryPoint) -> str:
    """The note for an entry point named like one of kvbench's own families: ignored, and how to fix it."""
    package = package_of(point)["package"]
    return (
        f"entry point {point.name} = {point.value!r} (group {ENTRY_POINT_GROUP}) of package {package} is named like "
        f"kvbench's own method {point.name!r}: it is ignored and the built-in runs. To use that package's method, "
        f"rename its entry point in {package}'s packaging metadata (e.g. {package.replace('-', '_')}_{point.name}) "
        "and reinstall it"
    )


def report_clashes(builtin_families: Iterable[str]) -> None:
    """Warn once per process for each installed entry point named like one of ``builtin_families``."""
    builtins = set(builtin_families)
    for name, point in method_entry_points().items():
        if name in builtins and name not in _CLASHES_REPORTED:
            _CLASHES_REPORTED.add(name)
            LOG.warning(clash_message(point))


def load_plugins(builtin_families: Iterable[str]) -> dict[str, str]:
    """Load every installed plug-in method but those named like ``builtin_families`` (``kvbench list methods``);
    returns the broken ones: family -> why (the :class:`PluginError` message), so a listing shows them."""
    builtins = set(builtin_families)
    broken = {}
    for family in method_entry_points():
        if family in builtins:
            continue
        try:
            load_plugin(family)
        except PluginError as err:
            broken[family] = str(err)
    return broken
