"""kvbench inside lm-evaluation-harness (the optional extra ``pip install 'kvbench[lmeval]'``).

* :mod:`kvbench.lmeval.loglikelihood` -- continuation log-likelihoods on a context compressed once (torch only);
* :mod:`kvbench.lmeval.model` -- :class:`~kvbench.lmeval.model.KVBenchLM`, registered with lm-eval as ``kvbench``;
* :mod:`kvbench.lmeval.tasks` -- loading lm-eval tasks with clear errors when their data is not available offline;
* :mod:`kvbench.lmeval.runner` -- ``python run.py task=lmeval``: lm-eval tasks in kvbench's results layout;
* :mod:`kvbench.lmeval.figure` -- AhaKV Figure 4's layout (accuracy against the kept budget);
* ``python -m kvbench.lmeval ...`` -- lm-eval's own command line with the ``kvbench`` model registered.

Importing this package registers the model with lm-eval when lm-eval is installed, and does nothing otherwise, so
kvbench works without the extra.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from kvbench.errors import KVBenchError

#: The lm-eval release the bridge was written and tested against.
LM_EVAL_VERSION = "0.4.13"
INSTALL_HINT = "pip install 'kvbench[lmeval]' (or: pip install 'lm_eval==0.4.13')"


def lm_eval_available() -> bool:
    """Whether lm-eval can be imported."""
    return importlib.util.find_spec("lm_eval") is not None


def require_lm_eval(purpose: str = "lm-eval tasks") -> None:
    """Raise :class:`KVBenchError` naming the install command when lm-eval is missing."""
    if not lm_eval_available():
        raise KVBenchError(f"{purpose} need lm-evaluation-harness, which is not installed: {INSTALL_HINT}")


def register() -> Any:
    """Register ``kvbench`` with lm-eval's model registry (idempotent); returns the model class."""
    require_lm_eval("--model kvbench")
    from kvbench.lmeval.model import KVBenchLM

    return KVBenchLM


if lm_eval_available():
    register()
