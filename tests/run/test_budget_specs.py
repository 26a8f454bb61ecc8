"""Any budget spec on the command line (issue #41 item 5): ``budget=80L``, ``budget=0.3x``, ``budget=512`` (= 512L)
compose and run without a YAML per value; a spec meaning a preset's budget is that preset (same folder, same hash);
the named presets keep their hashes."""

from __future__ import annotations

import pytest

import kvbench
from kvbench.app.overrides import prepare_overrides
from kvbench.config import budget_choice
from kvbench.errors import KVBenchError
from kvbench.storage.writers import config_hash


@pytest.mark.parametrize(
    ("value", "choice"),
    [
        ("64L", "64L"),  # a preset stays itself
        ("ratio0.5", "ratio0.5"),
        ("0.5x", "ratio0.5"),  # the preset meaning the same budget
        ("0.50x", "ratio0.5"),
        ("512", "512L"),  # a bare integer is tokens per layer
        ("128/layer", "128perlayer"),
        ("80L", "80L"),  # no preset: named in the presets' style
        ("0.3x", "ratio0.3"),
        ("ratio0.3", "ratio0.3"),
        ("96perlayer", "96perlayer"),
        ("0L", None),
        ("1.5x", None),
        ("fast", None),
    ],
)
def test_budget_choice(value: str, choice: str | None) -> None:
    assert budget_choice(value) == choice


def test_prepare_overrides_rewrites_only_group_values() -> None:
    lines = ["budget=512", "method=snapkv", "-m", "budget=64L,0.3x", "model=7", "budget.spec=96L", "task.num_samples=2"]
    assert prepare_overrides(lines) == [
        "budget='512L'",
        "method=snapkv",
        "-m",
        "budget='64L','ratio0.3'",
        "model='7'",  # Hydra now reports an unknown model '7' instead of refusing an integer
        "budget.spec=96L",
        "task.num_samples=2",
    ]


def test_a_spec_and_its_preset_share_folder_and_hash() -> None:
    named, spec = kvbench.compose_config(budget="ratio0.5"), kvbench.compose_config(budget="0.5x")
    assert (spec.budget.name, spec.budget.spec) == ("ratio0.5", "0.5x")
    assert config_hash(spec) == config_hash(named)
    assert config_hash(kvbench.compose_config(budget="512")) == config_hash(kvbench.compose_config(budget="512L"))
    free = kvbench.compose_config(budget="0.3x")
    assert (free.budget.name, free.budget.spec) == ("ratio0.3", "0.3x")
    with pytest.raises(KVBenchError, match=r"unknown budget '0L'.*'0L' must be positive.*budget=<spec>"):
        kvbench.compose_config(budget="0L")


# ``python run.py -m budget=80L,0.3x,512`` (three jobs into the folders 80L, ratio0.3 and 512L) is checked by
# tests/methods/test_plugins.py::test_run_py_runs_budget_specs_in_a_multirun, whose one run.py process also runs the
# plug-in method (one start of torch and transformers for both).
