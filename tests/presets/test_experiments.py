"""Experiment presets (conf/experiment/*.yaml): valid YAML, known names only, and one grid per paper table."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvbench.config import SESSION_KNOBS
from kvbench.reporting.paper_refs import TABLES, load_reference
from tests.conf_names import BUDGETS, METHODS, MODELS, TASKS, UNIMPLEMENTED_METHODS

CONF = Path(__file__).resolve().parents[2] / "conf" / "experiment"
PRESETS = sorted(CONF.glob("*.yaml"))

#: Keys a preset may set outside hydra.sweeper.params (fields of the structured schema in kvbench/config.py).
#: An experiment may set the method knobs every family shares (the session knobs, ``method.params.<knob>``: they
#: apply to every method of its grid), never a preset's identity or its family-specific params.
COMMON_METHOD_KNOBS = set(SESSION_KNOBS)
ALLOWED_TOP = {"run": {"experiment", "tag"}, "task": {"question_mode", "length", "options", "datasets"},
               "method": {"params"}, "hydra": {"sweeper"}}  # fmt: skip


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _grid(cfg: dict) -> dict[str, list[str]]:
    params = cfg["hydra"]["sweeper"]["params"]
    return {k: [v.strip() for v in str(params[k]).split(",")] for k in ("model", "task", "method", "budget")}


def test_there_are_presets():
    assert len(PRESETS) >= len([t for t in TABLES.values() if t.kind == "scores"])


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_preset_parses_and_uses_known_names(path):
    text = path.read_text()
    assert text.splitlines()[0] == "# @package _global_"
    cfg = _load(path)
    assert cfg["run"]["experiment"] == path.stem
    assert set(cfg) <= set(ALLOWED_TOP), set(cfg) - set(ALLOWED_TOP)
    for key, allowed in ALLOWED_TOP.items():
        if key in cfg and key != "hydra":
            assert set(cfg[key]) <= allowed, (key, set(cfg[key]) - allowed)
    shared = set((cfg.get("method") or {}).get("params") or {})
    assert shared <= COMMON_METHOD_KNOBS, shared - COMMON_METHOD_KNOBS
    grid = _grid(cfg)
    assert set(grid["model"]) <= MODELS, set(grid["model"]) - MODELS
    assert set(grid["method"]) <= METHODS | UNIMPLEMENTED_METHODS, set(grid["method"]) - METHODS - UNIMPLEMENTED_METHODS
    assert set(grid["budget"]) <= BUDGETS, set(grid["budget"]) - BUDGETS
    assert len(grid["task"]) == 1 and grid["task"][0] in TASKS
    assert all(grid.values())
    # A preset only pairs the full-cache method with the full budget (no wasted full x budget runs).
    assert ("full" in grid["method"]) == ("full" in grid["budget"])
    if "full" in grid["method"]:
        assert grid["method"] == ["full"] and grid["budget"] == ["full"]


def _cells_of_presets(table: str, tag: str | None) -> set[tuple[str, str, str, str]]:
    """(model, task, method, budget) covered by the table's presets and the full-cache preset of its tag."""
    cells = set()
    for path in PRESETS:
        cfg = _load(path)
        name = path.stem
        mine = name == table or name.startswith(table + "_")
        is_full = name.endswith("_full") and cfg["run"]["tag"] in TABLES[table].tags_for("full")
        if not (mine or is_full):
            continue
        if mine:
            assert cfg["run"]["tag"] == tag
        g = _grid(cfg)
        methods = [_method_name(option) for option in g["method"]]
        cells |= {(m, g["task"][0], me, b) for m in g["model"] for me in methods for b in g["budget"]}
    return cells


def _method_name(option: str) -> str:
    """The ``name`` a method preset runs under (``pyramidkv_adakv`` runs as ``pyramidkv``)."""
    path = CONF.parent / "method" / f"{option}.yaml"
    return str(_load(path)["name"]) if path.exists() else option


@pytest.mark.parametrize("table", [t for t, s in TABLES.items() if s.kind == "scores"])
def test_every_table_row_is_covered_by_a_preset(table):
    spec = TABLES[table]
    ref = load_reference(table).drop_duplicates("row")
    ref = ref[ref["method"] != ""]  # a row whose method is unrecoverable in the source cannot be run
    cells = _cells_of_presets(table, spec.tags[0])
    need = {(r.model, r.task, r.method, r.budget) for r in ref.itertuples()}
    assert need <= cells, sorted(need - cells)


def test_question_agnostic_and_subset_settings():
    t4 = _load(CONF / "adakv_late_t4.yaml")
    assert t4["task"]["question_mode"] == "agnostic"
    xkv = _load(CONF / "xkv_t3.yaml")
    assert len(xkv["task"]["datasets"]) == 14 and "passage_count" not in xkv["task"]["datasets"]
    nb32, nb8 = _load(CONF / "cake_t10.yaml"), _load(CONF / "cake_t11.yaml")
    assert nb32["task"]["options"]["size"] == "32k" and nb8["task"]["options"]["size"] == "8k"
    assert nb32["run"]["tag"] != nb8["run"]["tag"]  # the 8K and 32K runs must not share a results folder


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_preset_composes_with_the_schema(path):
    """The preset's fixed keys merge into the real root config (grid choices swapped for existing options)."""
    from hydra import compose, initialize_config_dir

    from kvbench.config import register_configs

    register_configs()
    task = _grid(_load(path))["task"][0]
    conf = CONF.parent
    if not (conf / "task" / f"{task}.yaml").exists():
        pytest.skip(f"conf/task/{task}.yaml does not exist yet")
    overrides = [f"+experiment={path.stem}", f"task={task}", "model=tiny", "method=snapkv", "budget=64L"]
    with initialize_config_dir(str(conf), version_base=None):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    raw = _load(path)
    assert cfg.run.experiment == path.stem and cfg.run.tag == raw["run"]["tag"]
    for key, value in (raw.get("task") or {}).items():
        got = cfg.task[key]
        assert (dict(got) if key == "options" else list(got) if isinstance(value, list) else got) == (
            {**dict(got), **value} if key == "options" else value
        )
    assert cfg.hydra.sweeper.params.method == raw["hydra"]["sweeper"]["params"]["method"]
