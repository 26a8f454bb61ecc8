"""A local ``-m`` sweep's shared-prefill groups (issue #56), planned before its first job runs.

:func:`kvbench.app.cli.check_sweep` validates every job of the sweep once (:func:`kvbench.app.sweep.plan`) and hands
the validated runs to :meth:`SweepSharing.plan`, which groups the jobs that share each sample's prefill
(:mod:`kvbench.run.prefill_groups`); the first job of a group that Hydra runs runs the whole group
(:func:`kvbench.run.shared_sweep.run_group`) with the runs validated for the plan, its own validated from Hydra's
config of it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig

from kvbench.run.prefill_groups import group_jobs, group_size, prefill_key, unshared_reason
from kvbench.run.shared_sweep import run_group
from kvbench.run.validated import ValidatedRun
from kvbench.storage.paths import run_folder
from kvbench.storage.writers import config_hash

LOG = logging.getLogger(__name__)


def group_labels(cfgs: Sequence[DictConfig]) -> str:
    """``method/budget`` of each job of a group, for logs and listings."""
    return ", ".join(f"{cfg.method.name}/{cfg.budget.name}" for cfg in cfgs)


class SweepSharing:
    """A local ``-m`` sweep's shared-prefill groups (:mod:`kvbench.app.cli`): built from the sweep's validated jobs
    before the first one runs; the first job of a group that Hydra runs runs the whole group (:func:`run_group`), the
    group's other jobs then have nothing left to do.  A job of a failed group, or one whose config is not the one
    composed beforehand, runs alone (resuming what the group wrote)."""

    def __init__(self) -> None:
        #: Run folder -> the group of its job (groups of two jobs or more only).
        self.groups: dict[Path, _Group] = {}
        #: Run folder -> why its job runs its own prefill (``run_meta.json``'s ``prefill_sharing``).
        self.alone: dict[Path, str] = {}

    @classmethod
    def plan(cls, runs: Sequence[ValidatedRun]) -> SweepSharing:
        """Group the sweep's valid jobs, validated once each (:func:`kvbench.app.sweep.plan`), by their prefill
        settings (:mod:`kvbench.run.prefill_groups`)."""
        sharing = cls()
        runs, keys = list(runs), []
        for run in runs:
            reason = unshared_reason(run.cfg, run.method)
            keys.append(None if reason else prefill_key(run.cfg, run.method))
            if reason:
                sharing.alone[run_folder(run.cfg)] = reason
        size = group_size(runs[0].cfg) if runs else None
        for indices in group_jobs(keys, size):
            folders = [run_folder(runs[index].cfg) for index in indices]
            if len(indices) == 1:
                sharing.alone.setdefault(folders[0], "no other job of the sweep has the same prefill settings")
                continue
            group = _Group([runs[index] for index in indices])
            sharing.groups.update(dict.fromkeys(folders, group))
        return sharing

    def listing(self) -> list[str]:
        """One line per group of two jobs or more: its jobs (``method/budget``)."""
        seen: list[_Group] = []
        for group in self.groups.values():
            if all(group is not other for other in seen):
                seen.append(group)
        return [f"shared prefill x{len(g.runs)}: {group_labels([r.cfg for r in g.runs])}" for g in seen]

    def run_job(self, job: ValidatedRun) -> bool:
        """Run ``job`` (Hydra's config of it, validated) with its group when it has one: ``True`` when the group ran
        it (now, or earlier in the sweep), ``False`` when the caller runs it alone (no group, a failed group, another
        config)."""
        cfg = job.cfg
        folder = run_folder(cfg)
        group = self.groups.get(folder)
        if group is None or group.state == "failed":
            return False
        if group.state == "done":
            return True
        runs = list(group.runs)
        for index, run in enumerate(runs):
            if run_folder(run.cfg) == folder:
                if config_hash(run.cfg) != config_hash(cfg):
                    return False  # composed otherwise than Hydra's: alone
                runs[index] = job
        group.state = "failed"
        LOG.info("shared prefill for %d jobs: %s", len(runs), group_labels([run.cfg for run in runs]))
        run_group(runs)
        group.state = "done"
        return True

    def reason(self, cfg: DictConfig) -> str | None:
        """Why the job of ``cfg`` runs alone in this sweep, if the plan says."""
        return self.alone.get(run_folder(cfg))


class _Group:
    """The jobs of one group and whether it ran (``pending``, ``done``, ``failed``)."""

    def __init__(self, runs: list[ValidatedRun]) -> None:
        self.runs = runs
        self.state = "pending"
