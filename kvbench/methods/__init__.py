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

from kvbench.lazy_exports import alias_moved_modules

#: The modules of :mod:`kvbench.eviction` that lived here, importable by their old name.
MOVED = frozenset(
    {
        "base", "recipe", "family", "params", "knobs", "state", "observation", "prerope", "token_scores", "selection",
        "wrappers", "decoding", "kept_sets", "seeding", "plugins", "channels", "head_allocation", "layer_schedules",
        "kvpress_ada", "kvpress_decoding", "kvpress_pyramid", "critical",
    }
)  # fmt: skip

alias_moved_modules({f"{__name__}.{name}": f"kvbench.eviction.{name}" for name in sorted(MOVED)}, "issue #57")
