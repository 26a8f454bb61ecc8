"""The option names defined in conf/: the one source of the names presets and reference tables may use."""

from __future__ import annotations

from pathlib import Path

CONF = Path(__file__).resolve().parents[1] / "conf"


def options(group: str) -> set[str]:
    """Names of the option files of a config group (``conf/<group>/*.yaml``)."""
    return {path.stem for path in (CONF / group).glob("*.yaml")}


MODELS = options("model")
METHODS = options("method")
BUDGETS = options("budget")
TASKS = options("task")
#: Methods the papers' tables name but kvbench cannot implement faithfully (none left: NACL is kvbench/methods/nacl.py).
UNIMPLEMENTED_METHODS: set[str] = set()
