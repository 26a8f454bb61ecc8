"""The option names defined in conf/: the one source of the names presets and reference tables may use."""

from __future__ import annotations

from pathlib import Path

from kvbench.app.overrides import class_method_names

CONF = Path(__file__).resolve().parents[1] / "conf"


def options(group: str) -> set[str]:
    """Names of the option files of a config group (``conf/<group>/*.yaml``)."""
    return {path.stem for path in (CONF / group).glob("*.yaml")}


MODELS = options("model")
#: The method presets: YAML files and the class-only methods (``kvbench/methods/<family>.py``, no YAML needed).
METHODS = options("method") | set(class_method_names())
BUDGETS = options("budget")
TASKS = options("task")
#: Methods the papers' tables name but kvbench cannot implement faithfully (none left: NACL is kvbench/methods/nacl.py).
UNIMPLEMENTED_METHODS: set[str] = set()
