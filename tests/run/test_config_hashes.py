"""Config hashes survive the layout change of issue #41: the scorer knobs moved from ``method.<knob>`` to the
families' ``method.params.<knob>``, and the hash is computed from the config put back in its earlier layout
(:func:`kvbench.storage.writers.canonical_config`), so existing results folders resume.  The fixture holds hashes
recorded by ``scripts/config_hashes.py record`` at commit 9542a94, before the move (the script checked all 1178)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from omegaconf import OmegaConf

from kvbench.api import compose_config
from kvbench.storage.writers import CONFIG_FILE, canonical_config, config_differences, config_hash

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "tests" / "fixtures" / "config_hashes_before_issue41.json"


def _script():
    spec = importlib.util.spec_from_file_location("config_hashes", REPO / "scripts" / "config_hashes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hashes_recorded_before_the_knobs_moved_are_unchanged() -> None:
    spell = _script().spell
    recorded = json.loads(RECORDED.read_text(encoding="utf-8"))
    assert len(recorded) == 8
    for key, expected in recorded.items():
        method, budget, *knobs = key.split()
        assert config_hash(compose_config(method, budget, overrides=[spell(knob) for knob in knobs])) == expected, key


def test_a_config_yaml_in_the_earlier_layout_is_the_same_run(tmp_path: Path) -> None:
    cfg = compose_config("snapkv", "64L", overrides=["method.params.pooling=avg"])
    old = canonical_config(OmegaConf.to_container(cfg, resolve=True))
    assert old["method"]["pooling"] == "avg" and "pooling" not in old["method"]["params"]
    assert config_hash(OmegaConf.create(old)) == config_hash(cfg)
    (tmp_path / CONFIG_FILE).write_text(OmegaConf.to_yaml(old), encoding="utf-8")
    assert config_differences(tmp_path, cfg) == []
    other = compose_config("snapkv", "64L", overrides=["method.params.pooling=max"])
    assert config_differences(tmp_path, other) == ["method.pooling: 'avg' -> 'max'"]
