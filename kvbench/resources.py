"""Where kvbench's shipped files live: Hydra configs, task data, tiny models, chat templates, the papers' numbers.

Every module finds these folders through this one place, never through ``Path(__file__).parents[n]``, so the same
code works from a source checkout and from an installed wheel.  Each function returns a :class:`pathlib.Path`.
"""

from __future__ import annotations

from pathlib import Path

#: The source checkout (the folder holding ``run.py``) when kvbench runs from one.
SOURCE_ROOT = Path(__file__).resolve().parent.parent


def conf_dir() -> Path:
    """Hydra's config tree (``config.yaml``, ``method/``, ``task/``, ``model/``, ``budget/``, ``experiment/``)."""
    return SOURCE_ROOT / "conf"


def tasks_dir() -> Path:
    """Shipped task data (``longbench/`` settings and fixtures, needle grids)."""
    return SOURCE_ROOT / "tasks"


def models_dir() -> Path:
    """Shipped models: ``tiny-niah`` and the other trained tiny models, ``chat_templates/``."""
    return SOURCE_ROOT / "models"


def paper_dir() -> Path:
    """The papers' printed numbers, one CSV per table (``results/paper``)."""
    return SOURCE_ROOT / "results" / "paper"
