"""What one dataset's work needs from its run, handed down instead of the runner itself: the config and its hash,
the method and budget, the run folder and ``run.decode_batch`` as resolved for the device.

The generation loop (:func:`kvbench.run.generation.generate_dataset`) and a dataset with its own evaluation loop
(:meth:`kvbench.tasks.base.TaskDataset.evaluate`, lm-eval's) read it; nothing writes to it but the sessions, which
extend the dataset's state (``dataset_state``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from kvbench.budget import Budget
from kvbench.methods.base import EvictionMethod


@dataclass(frozen=True)
class DatasetJob:
    """One run's settings for one dataset's work (module docstring).

    Attributes
    ----------
    cfg:
        The run's resolved config.
    cfg_hash:
        Its hash (:func:`kvbench.storage.writers.config_hash`), recorded in ``metrics.json``.
    method, budget:
        The validated eviction method and budget.
    run_folder:
        The run's results folder (a dataset's files go to ``run_folder / dataset.name``).
    decode_batch:
        ``run.decode_batch`` resolved for the device (1: one sample at a time).
    dataset_state:
        What the method keeps across this dataset's samples
        (:meth:`~kvbench.methods.base.LayerBudgetAllocator.new_dataset_state`: XKV's sampled-mode calibration;
        ``None`` for the others): created by the runner once per dataset and passed to every sample's session,
        which reads and extends it.
    """

    cfg: DictConfig
    cfg_hash: str
    method: EvictionMethod
    budget: Budget
    run_folder: Path
    decode_batch: int = 1
    dataset_state: Any = None
