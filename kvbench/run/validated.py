"""A run's config once it passed validation, with what validation built from it: what the runner takes.

Validation itself is the application layer's (:func:`kvbench.app.validation.validate_run`, one pass before any
work); the runner and a shared-prefill group (:mod:`kvbench.run.shared_sweep`) only run what it hands them and never
validate again.  Importing this module loads neither torch nor transformers.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from omegaconf import DictConfig


@dataclasses.dataclass(frozen=True)
class ValidatedRun:
    """A config that passed every stage of :mod:`kvbench.app.validation`, with what validation built from it.

    Attributes
    ----------
    cfg:
        The run's composed config.
    method:
        The :class:`~kvbench.eviction.base.EvictionMethod` it built (fresh: no sample has run through it).
    budget:
        The :class:`~kvbench.budget.Budget` it parsed.
    """

    cfg: DictConfig
    method: Any
    budget: Any
