"""The eviction methods: one module per method family (a frozen dataclass of its knobs plus its score or its pieces,
registered by defining it), nothing else.  What they share -- the pieces and the recipe, a method's class and its
knobs, what a score reads, the wrappers over any scorer -- is :mod:`kvbench.eviction` (issue #57).

Those modules lived here before issue #57 (``kvbench.methods.base``, ``kvbench.methods.recipe`` ...): importing one
by its old name still works, with a ``DeprecationWarning``, and gives the module itself (``kvbench.eviction.<name>``),
so a plug-in package written against the old paths keeps running.  The method modules' discovery reads this
folder's files (:func:`kvbench.registry.submodule_importer`): the old names are no files, so nothing is imported
twice.  (i57-move: keep the old paths -- /work/notes/i57_move.py leaves this module as it is.)
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any

#: The modules of :mod:`kvbench.eviction` that lived here, importable by their old name.
MOVED = frozenset(
    {
        "base", "recipe", "family", "params", "knobs", "state", "observation", "prerope", "token_scores", "selection",
        "wrappers", "decoding", "kept_sets", "seeding", "plugins", "channels", "head_allocation", "layer_schedules",
        "kvpress_ada", "kvpress_decoding", "kvpress_pyramid", "critical",
    }
)  # fmt: skip


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``kvbench.methods.<moved>`` -> the module ``kvbench.eviction.<moved>`` (the same object)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        package, _, name = fullname.rpartition(".")
        if package != __name__ or name not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: Any) -> ModuleType:
        new = f"kvbench.eviction.{spec.name.rpartition('.')[2]}"
        warnings.warn(f"{spec.name} moved to {new} (issue #57); import it from there", DeprecationWarning, 3)
        module = importlib.import_module(new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._spec  # the import system set the alias's spec on the module: give it back its own


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())
