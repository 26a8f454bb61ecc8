"""Methods from other packages: the entry-point group ``kvbench.methods`` (issue #41).

A package adds a method by defining a one-class method (:class:`kvbench.methods.recipe.ScorerMethod`) and declaring
it in its packaging metadata, the entry point's name being the family::

    [project.entry-points."kvbench.methods"]
    keydiff = "my_package.keydiff:KeyDiff"

kvbench finds the entry points at start-up without importing them (:func:`method_entry_points`); ``method=keydiff``
loads the one named (:func:`load_plugin`), and the method registry's discovery loads them all (``kvbench list
methods``).  The providing package's name and version are recorded in the method's default preset (``reference``,
so in the config hash) and in ``run_meta.json`` (``method_package``).
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from typing import Any

#: The entry-point group a package declares its methods in.
ENTRY_POINT_GROUP = "kvbench.methods"
#: Family -> ``{"package": ..., "version": ...}`` of every plug-in method loaded so far.
PLUGIN_PACKAGES: dict[str, dict[str, str]] = {}


def method_entry_points() -> dict[str, EntryPoint]:
    """The installed packages' methods by family (entry-point name), not imported."""
    return {point.name: point for point in entry_points(group=ENTRY_POINT_GROUP)}


def load_plugin(family: str) -> dict[str, str] | None:
    """Import the plug-in method ``family`` (its class registers itself); its package and version, or ``None`` when
    no installed package declares it.  ``ValueError`` when the entry point is not a one-class method of that family
    (it must name the class: ``module:Class``)."""
    if family in PLUGIN_PACKAGES:
        return PLUGIN_PACKAGES[family]
    point = method_entry_points().get(family)
    if point is None:
        return None
    loaded: Any = point.load()  # defining the class registers it (kvbench.methods.recipe)
    if not isinstance(loaded, type) or getattr(loaded, "family", None) != family:
        raise ValueError(
            f"entry point {family} = {point.value!r} (group {ENTRY_POINT_GROUP}) defines no one-class method of "
            f"family {family!r}: the class must subclass kvbench.methods.recipe.ScorerMethod with family={family!r}"
        )
    distribution = point.dist
    package = {
        "package": distribution.metadata["Name"] if distribution else point.module,
        "version": distribution.version if distribution else "unknown",
    }
    PLUGIN_PACKAGES[family] = package
    return package


def load_plugins() -> None:
    """Load every installed plug-in method (the method registry's discovery)."""
    for family in method_entry_points():
        load_plugin(family)
