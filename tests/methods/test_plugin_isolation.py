"""Plug-ins are isolated (issue #55 item 5): one is imported only when its method is asked for or listed; a broken
one is listed as broken and fails only its own method (exit 2, naming the package and the fix); an entry point named
like a built-in never replaces or blocks it (the built-in runs, the clash is reported once); a family refused as a
duplicate leaves the registered class in place.  In process: the entry points are made up (``entry_points``
patched), their modules written to a temporary folder on ``sys.path``."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

import kvbench.eviction.base as base
import kvbench.eviction.plugins as plugins
from kvbench.app.cli import main
from kvbench.app.listing import list_methods
from kvbench.eviction.base import METHOD_FAMILIES, build_method
from kvbench.eviction.family import family_class
from kvbench.eviction.recipe import ScorerMethod
from tests.faults.conftest import assert_one_line_error

#: Module sources: one that fails to import, one that must never be imported (named like a built-in).
MODULES = {
    "kvb_broken_plugin": "raise ImportError('needs a library that is not installed')\n",
    "kvb_snapkv_clash": "raise AssertionError('a plug-in named like a built-in was imported')\n",
}


@pytest.fixture
def installed(tmp_path: Path, monkeypatch) -> None:
    """Two installed plug-ins: ``broken_method`` (fails to import) and ``snapkv`` (named like the built-in)."""
    for name, source in MODULES.items():
        (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    points = [
        EntryPoint("broken_method", "kvb_broken_plugin:Broken", plugins.ENTRY_POINT_GROUP),
        EntryPoint("snapkv", "kvb_snapkv_clash:SnapKV", plugins.ENTRY_POINT_GROUP),
    ]
    monkeypatch.setattr(plugins, "entry_points", lambda group: [p for p in points if p.group == group])
    monkeypatch.setattr(plugins, "_CLASHES_REPORTED", set())


def test_built_ins_run_beside_a_broken_plugin_and_one_named_like_a_built_in(installed, caplog) -> None:
    caplog.set_level(logging.WARNING)
    base._discover_methods()  # what the registry's first lookup runs
    base._discover_methods()
    clash = [r.getMessage() for r in caplog.records if "named like kvbench's own method 'snapkv'" in r.getMessage()]
    assert len(clash) == 1, "the clash is reported once"
    assert "kvb_snapkv_clash" in clash[0] and "rename its entry point" in clash[0]
    for family in ("snapkv", "knorm"):
        assert build_method({"name": family, "family": family}).family == family  # the built-in, unblocked
    assert "kvb_snapkv_clash" not in sys.modules


def test_a_broken_plugin_is_listed_as_broken_and_fails_only_its_own_method(
    installed, tmp_path, capsys, monkeypatch
) -> None:
    listing = list_methods()
    (row,) = [line for line in listing.splitlines() if line.strip().startswith("broken_method")]
    assert "BROKEN" in row and "needs a library that is not installed" in row
    assert "Traceback" not in listing
    with pytest.raises(ValueError, match="pip uninstall kvb_broken_plugin"):
        METHOD_FAMILIES.get("broken_method")
    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["kvbench", "method=broken_method", f"run.output_root={tmp_path}"])
    with pytest.raises(SystemExit) as exited:
        main()
    assert_one_line_error(exited.value.code, capsys.readouterr().err, "broken_method", "fails to import", "pip")


def test_a_family_refused_as_a_duplicate_leaves_the_registered_class() -> None:
    registered = METHOD_FAMILIES.get("knorm")
    original = family_class("knorm")
    with pytest.raises(ValueError, match="registered twice"):

        @dataclass(frozen=True)
        class Impostor(ScorerMethod, family="knorm"):
            def score(self, observation):  # pragma: no cover - never registered
                raise AssertionError

    assert family_class("knorm") is original
    assert METHOD_FAMILIES.get("knorm") is registered
