"""Task configs for task-builder tests, with the defaults read from the real schema (kvbench.config.TaskConfig)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

from kvbench.config import TaskConfig


def task_config(task: str, /, **overrides: Any) -> SimpleNamespace:
    """``TaskConfig``'s defaults with ``name`` and ``kind`` set to ``task``, then ``overrides`` (may set them too).

    Unknown keys are rejected, as Hydra would reject them.
    """
    defaults: dict[str, Any] = {}
    for field in dataclasses.fields(TaskConfig):
        has_factory = field.default_factory is not dataclasses.MISSING
        defaults[field.name] = field.default_factory() if has_factory else field.default
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        raise TypeError(f"unknown TaskConfig field(s) {unknown}")
    return SimpleNamespace(**{**defaults, "name": task, "kind": task, **overrides})
