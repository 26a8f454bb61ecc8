"""Every experiment preset's whole grid composes: ``python run.py -m +experiment=<name> model=tiny`` expanded job by
job (the same expansion and composition as ``scripts/slurm_sweep.py`` and ``run.py -m``) and validated, without loading
a model.  A preset that names a config that does not exist (e.g. ``method=nacl`` before NACL lands) fails here, not
on a cluster.  Cost: one Hydra composition per job, 385 jobs today, about 35 s of CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbench.app.sweep import CONF_DIR, Composer, Job, expand_grid, experiment_params
from kvbench.app.validation import validate

PRESETS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))

#: Presets whose grid names a method that has not landed yet: strict xfails, so they flip to failures (and this
#: list must shrink) the day the method's option file exists.
PENDING: dict[str, str] = {}  # none: NACL (the AhaKV presets' baseline) has landed


class MissingPreset(AssertionError):
    """A job of the grid names an option file that does not exist."""


def _params(name: str) -> list:
    marks = [pytest.mark.xfail(strict=True, raises=MissingPreset, reason=PENDING[name])] if name in PENDING else []
    return pytest.param(name, marks=marks, id=name)


@pytest.fixture(scope="module")
def composer():
    composer = Composer(CONF_DIR)
    yield composer
    composer.close()


@pytest.mark.parametrize("experiment", [_params(name) for name in PRESETS])
def test_preset_grid_composes(experiment: str, composer: Composer, tmp_path: Path) -> None:
    overrides = ["model=tiny", f"run.output_root={tmp_path}"]
    jobs = [
        Job([f"+experiment={experiment}", *combo]) for combo in expand_grid(experiment_params(experiment), overrides)
    ]
    assert jobs, f"{experiment}: empty grid"
    missing, broken = [], []
    for job in jobs:
        try:
            validate(composer.compose(job.overrides))
        except Exception as err:  # composition and validation errors, reported per job
            reason = (str(err).strip() or type(err).__name__).splitlines()[0]
            (missing if "Could not find '" in reason else broken).append(f"{job.line}: {reason}")
    if broken:
        pytest.fail(f"{experiment}: {len(broken)}/{len(jobs)} jobs do not validate:\n" + "\n".join(broken[:10]))
    if missing:
        raise MissingPreset(
            f"{experiment}: {len(missing)}/{len(jobs)} jobs name a missing preset:\n" + "\n".join(missing)
        )
