"""Issue #57 moved the shared machinery out of kvbench/methods/ into kvbench/eviction/, and the application layer into
kvbench/app/: the old module paths stay importable (a plug-in package or a script written against them), as the moved
modules themselves.

i57-move: keep the old paths (this test names them on purpose; /work/notes/i57_move.py leaves the file as it is)
"""

from __future__ import annotations

import pytest

from kvbench.eviction.base import method_families


def test_the_machinerys_old_paths_import_the_moved_modules_with_a_deprecation_warning() -> None:
    """Issue #57 moved the machinery out of kvbench/methods/: ``kvbench.methods.recipe`` (a plug-in written against
    it) is the module ``kvbench.eviction.recipe`` itself, with a DeprecationWarning; the method registry still finds
    the methods only, and the package's API names load from their modules."""
    import importlib
    import sys

    import kvbench.eviction
    import kvbench.eviction.recipe

    sys.modules.pop("kvbench.methods.recipe", None)
    with pytest.warns(DeprecationWarning, match="kvbench.methods.recipe moved to kvbench.eviction.recipe"):
        old = importlib.import_module("kvbench.methods.recipe")
    assert old is kvbench.eviction.recipe and old.__spec__.name == "kvbench.eviction.recipe"
    assert kvbench.eviction.ScorerMethod is kvbench.eviction.recipe.ScorerMethod
    assert "snapkv" in method_families() and "recipe" not in method_families()


@pytest.mark.parametrize(
    ("old", "new"),
    [("kvbench.cli", "kvbench.app.cli"), ("kvbench.validation", "kvbench.app.validation"),
     ("kvbench.run.sweep", "kvbench.app.sweep")],
)  # fmt: skip
def test_the_application_layers_old_paths_import_the_moved_modules(old: str, new: str) -> None:
    """Issue #57 put the application layer in kvbench/app/ (the CLI, validation, sweeps...): a script importing an
    old path (``from kvbench.cli import main``) gets the module itself, with a DeprecationWarning naming the new one;
    no file is left at the old place."""
    import importlib
    import sys
    from pathlib import Path

    import kvbench

    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new) and module.__spec__.name == new
    assert not (Path(kvbench.__file__).parent / (old.removeprefix("kvbench.").replace(".", "/") + ".py")).exists()
