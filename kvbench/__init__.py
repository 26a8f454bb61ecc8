"""kvbench: a reproducible benchmark harness for KV-cache eviction research.

The public Python API (docs/api.md): :func:`evaluate` a method on a task with your own loaded model and
tokenizer, :func:`press` a method onto your own ``model.generate`` calls, :func:`compose_config` the config
``run.py`` would run.  They are imported on first use, so ``import kvbench`` stays cheap (no torch, no Hydra).
(The press machinery lives in ``kvbench.inference.press``: a submodule named ``press`` would replace the function
``kvbench.press`` once imported.)
"""

from typing import TYPE_CHECKING, Any

from kvbench.lazy_exports import alias_moved_modules
from kvbench.version import __version__

__all__ = ["Evaluation", "PressRecord", "__version__", "compose_config", "evaluate", "press"]

#: Public name -> the module that defines it (imported lazily by :func:`__getattr__`).
_LAZY = {
    "evaluate": "kvbench.api",
    "press": "kvbench.api",
    "compose_config": "kvbench.api",
    "Evaluation": "kvbench.api",
    "PressRecord": "kvbench.inference.press",
}

#: The application layer's modules before issue #57 put them in :mod:`kvbench.app`: their old paths import the moved
#: modules, with a DeprecationWarning (no file is left behind them).
MOVED_TO_APP = {
    f"kvbench.{old}": f"kvbench.app.{old.rpartition('.')[2]}"
    for old in ("cli", "dashboards", "demo", "hydra_errors", "listing", "overrides", "validation", "run.sweep",
                "run.shared_tasks")
}  # fmt: skip
alias_moved_modules(MOVED_TO_APP, "issue #57")

if TYPE_CHECKING:
    from kvbench.api import Evaluation, compose_config, evaluate, press
    from kvbench.inference.press import PressRecord


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kvbench' has no attribute {name!r}")
