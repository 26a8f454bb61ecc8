"""What one dataset's work needs from its run, handed down instead of the runner itself: the config and its hash,
the method and budget, the run folder and ``run.decode_batch`` as resolved for the device.

:class:`PendingGeneration` (what generating a dataset's missing samples needs) and :class:`Generated` (a dataset's
rows once generated) are the two halves of the runner's generation, between which the generation loop runs: the
runner's own for one job, :mod:`kvbench.run.shared_sweep`'s for the jobs of a shared-prefill group.

The generation loop (:func:`kvbench.run.generation.generate_dataset`) and a dataset with its own evaluation loop
(:meth:`kvbench.tasks.base.TaskDataset.evaluate`, lm-eval's) read it; nothing writes to it but the sessions, which
extend the dataset's state (``dataset_state``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from kvbench.budget import Budget
from kvbench.eviction.base import EvictionMethod


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
        (:meth:`~kvbench.eviction.base.LayerBudgetAllocator.new_dataset_state`: XKV's sampled-mode calibration;
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


@dataclass
class PendingGeneration:
    """What generating a dataset's missing samples needs (:meth:`kvbench.run.runner.Runner.pending_generation`).

    Attributes
    ----------
    job:
        The run's settings for the dataset, with its dataset state.
    todo:
        The samples ``predictions.jsonl`` lacks, in dataset order.
    encode, write:
        ``encode(sample)`` -> its encoded prompt; ``write(sample, encoded, output)`` appends its row (in sample
        order, under the runner's termination guard).
    stops:
        The stop token ids.
    progress:
        The progress bar over ``todo`` (or ``todo`` itself).
    done:
        Sample id -> row, of every sample written so far (``write`` adds to it).
    provenance, use_template, timing_log:
        The data's provenance, whether the chat template is used, the dataset's ``timings.jsonl``.
    """

    job: DatasetJob
    todo: list[Any]
    encode: Callable[[Any], Any]
    write: Callable[[Any, Any, Any], None]
    stops: set[int]
    progress: Any
    done: dict[str, dict[str, Any]]
    provenance: dict[str, Any]
    use_template: bool
    timing_log: Any


@dataclass
class Generated:
    """A dataset's generation, for scoring: every sample's prediction row (sample order), the data provenance,
    whether the chat template was used, and the timing summary of ``timings.jsonl``."""

    rows: list[dict[str, Any]]
    provenance: dict[str, Any]
    use_template: bool
    timing: dict[str, Any]
    #: ``decode_path`` and ``decode_path_reason`` (:func:`kvbench.run.generation.decode_path_settings`).
    decode_path: dict[str, str | None]
