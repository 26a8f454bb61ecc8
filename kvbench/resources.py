"""Where kvbench's shipped files live: Hydra configs, task data, tiny models, chat templates, the papers' numbers.

Every module finds these folders through this one place, never through ``Path(__file__).parents[n]``, so the same
code works from a source checkout and from an installed wheel.  Each function returns a :class:`pathlib.Path`.

The shipped files keep one layout in both cases (``conf/``, ``tasks/``, ``models/``, ``results/paper/``) under
:func:`shipped_root`:

* from a source checkout (``pip install -e .`` or ``python run.py`` in the checkout): the checkout itself, the
  folder holding ``run.py`` (the README and the brief refer to these top-level folders);
* from a wheel (``pip install .``): the package data folder ``kvbench/_shipped/`` that ``setup.py``'s ``build_py``
  copies the four folders into, found through :mod:`importlib.resources`.

Results never go there: run folders, tables and logs are written under the current working directory.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources as importlib_resources
from pathlib import Path

#: Folder inside the installed ``kvbench`` package that holds the shipped files (see ``setup.py``).
SHIPPED_PACKAGE_DIR = "_shipped"
#: The folder above the ``kvbench`` package: the source checkout when kvbench runs from one.
_PACKAGE_PARENT = Path(__file__).resolve().parent.parent


@lru_cache(maxsize=1)
def shipped_root() -> Path:
    """The folder holding ``conf/``, ``tasks/``, ``models/`` and ``results/paper/``: the installed package data
    when present, else the source checkout.  Raises :class:`FileNotFoundError` when neither is there."""
    installed = importlib_resources.files("kvbench") / SHIPPED_PACKAGE_DIR
    if isinstance(installed, Path) and installed.is_dir():
        return installed.resolve()
    if (_PACKAGE_PARENT / "conf" / "config.yaml").is_file() and (_PACKAGE_PARENT / "run.py").is_file():
        return _PACKAGE_PARENT
    raise FileNotFoundError(
        f"kvbench's shipped files (conf/, tasks/, models/, results/paper/) are missing: neither {installed} "
        f"(an installed wheel) nor {_PACKAGE_PARENT}/conf (a source checkout) exists. Reinstall with `pip install "
        "kvbench` from a wheel or sdist, or `pip install -e .` in a checkout (kvbench cannot run from a zip file)."
    )


def checkout_dir() -> Path | None:
    """The source checkout (the folder holding ``run.py``, ``scripts/``, ``slurm/``) when kvbench runs from one,
    else None (an installed wheel ships no scripts)."""
    root = shipped_root()
    return root if root == _PACKAGE_PARENT else None


def conf_dir() -> Path:
    """Hydra's config tree (``config.yaml``, ``method/``, ``task/``, ``model/``, ``budget/``, ``experiment/``)."""
    return shipped_root() / "conf"


def tasks_dir() -> Path:
    """Shipped task data (``longbench/`` settings and fixtures, needle grids)."""
    return shipped_root() / "tasks"


def models_dir() -> Path:
    """Shipped models: ``tiny-niah`` and the other trained tiny models, ``chat_templates/``."""
    return shipped_root() / "models"


def paper_dir() -> Path:
    """The papers' printed numbers, one CSV per table (``results/paper``)."""
    return shipped_root() / "results" / "paper"
