"""Shared-prefill sweeps (issue #56): the embedded default's ``-m method=snapkv,h2o,tova,cake budget=64L,128L
task.num_samples=3`` is planned into groups that share each sample's prefill, and each job's folder equals the job
run alone (byte-identical ``predictions.jsonl``, ``metrics.json`` equal apart from timing); a killed shared sweep
resumes only the missing (job, sample) pairs; what splits groups is declared; sharing is outside the config hash."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from kvbench.app.sweep import multirun_jobs
from kvbench.app.sweep_sharing import SweepSharing
from kvbench.app.validation import validate_run
from kvbench.run import shared_sweep
from kvbench.run.prefill_groups import group_jobs, prefill_key, unshared_reason
from kvbench.run.runner import Runner
from kvbench.storage.writers import METRICS_FILE, PREDICTIONS_FILE, RUN_META_FILE, config_hash

#: The issue's sweep on the embedded default, one of its datasets (CI time).
SWEEP = ["-m", "method=snapkv,h2o,tova,cake", "budget=64L,128L", "task.num_samples=3",
         "task.datasets=[niah_single_2k]", "run.progress=false", "run.print_table=false"]  # fmt: skip
TIMING_FIELDS = ("timing",)


def _runs(root: Path, *extra: str) -> list:
    """The sweep's jobs as the CLI's check of a local sweep validates them (once each, environment included)."""
    jobs = multirun_jobs([*SWEEP, f"run.output_root={root}", *extra])
    assert all(job.state != "invalid" and job.validated.cfg is job.cfg for job in jobs), [j.reason for j in jobs]
    return [job.validated for job in jobs]


def _files(root: Path) -> dict[str, Path]:
    return {str(path.relative_to(root)): path for path in sorted(root.rglob("*")) if path.is_file()}


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list]:
    """(shared root, alone root, the shared sweep's configs): the sweep run shared as the CLI plans it, and each of
    its jobs run alone (``run.share_prefill=false``)."""
    base = tmp_path_factory.mktemp("shared_sweep")
    shared_runs = _runs(base / "shared")
    sharing = SweepSharing.plan(shared_runs)
    for run in shared_runs:
        assert sharing.run_job(run)  # the first job of each group runs its group; the others are done
    for run in _runs(base / "alone", "run.share_prefill=false"):
        assert unshared_reason(run.cfg, run.method) == "run.share_prefill=false"
        Runner(run).run()
    return base / "shared", base / "alone", [run.cfg for run in shared_runs]


def test_the_sweep_is_planned_into_groups_by_cache_layout(sweeps) -> None:
    _, _, cfgs = sweeps
    runs = [validate_run(cfg) for cfg in cfgs]
    listing = SweepSharing.plan(runs).listing()
    # snapkv and h2o store KV heads, tova's and cake's presets query heads (their reference code): two groups.
    assert listing == [
        "shared prefill x4: snapkv/64L, snapkv/128L, h2o/64L, h2o/128L",
        "shared prefill x4: tova/64L, tova/128L, cake/64L, cake/128L",
    ]
    assert len(SweepSharing.plan(runs[:1]).groups) == 0  # one job alone: no group


def test_each_job_of_the_shared_sweep_equals_the_job_run_alone(sweeps) -> None:
    shared_root, alone_root, _ = sweeps
    shared, alone = _files(shared_root), _files(alone_root)
    predictions = [name for name in shared if name.endswith(PREDICTIONS_FILE)]
    assert len(predictions) == 8 and set(shared) == set(alone)
    for name in predictions:
        assert shared[name].read_bytes() == alone[name].read_bytes(), name
    for name in (name for name in shared if name.endswith(METRICS_FILE)):
        got, expected = (json.loads(files[name].read_text()) for files in (shared, alone))
        for field in TIMING_FIELDS:
            got.pop(field), expected.pop(field)
        assert got == expected, name
    for name in (name for name in shared if name.endswith(RUN_META_FILE)):
        meta = json.loads(shared[name].read_text())
        assert meta["status"] == "complete"
        assert meta["prefill_sharing"] == {"shared": True, "jobs": 4, "datasets_alone": {}}
        alone_meta = json.loads(alone[name].read_text())
        assert alone_meta["prefill_sharing"]["shared"] is False
        assert meta["config_hash"] == alone_meta["config_hash"]  # run.share_prefill is not part of the run


def test_a_killed_shared_sweep_resumes_only_the_missing_job_sample_pairs(sweeps, tmp_path, monkeypatch) -> None:
    _, _, cfgs = sweeps
    root = tmp_path / "runs"
    group = cfgs[:4]  # snapkv and h2o, 64L and 128L: one group
    folders = [Path(str(cfg.run.output_root)) for cfg in group]
    assert len(set(folders)) == 1
    shutil.copytree(folders[0], root)
    group = [OmegaConf.merge(cfg, {"run": {"output_root": str(root)}}) for cfg in group]
    dataset = Path("niah_single_2k")
    rows = {}
    # As a kill leaves them: job 0 lost its last row and its metrics, job 2 its whole dataset, jobs 1 and 3 finished.
    for index, cut in ((0, 2), (2, 0)):
        folder = Runner(validate_run(group[index])).folder / dataset
        lines = (folder / PREDICTIONS_FILE).read_text().splitlines(keepends=True)
        rows[index] = "".join(lines)
        (folder / PREDICTIONS_FILE).write_text("".join(lines[:cut]))
        (folder / METRICS_FILE).unlink()
    calls: list[tuple[int, list[str]]] = []
    original = shared_sweep.shared_prefill

    def counting(model, context_ids, question_ids, jobs, **kwargs):
        calls.append((len(context_ids), [job.method.name for job in jobs]))
        return original(model, context_ids, question_ids, jobs, **kwargs)

    monkeypatch.setattr(shared_sweep, "shared_prefill", counting)
    shared_sweep.run_group([validate_run(cfg) for cfg in group])
    # Samples 0 and 1: only job 2 lacks them; sample 2: jobs 0 and 2 (one shared forward).
    assert [names for _, names in calls] == [["h2o"], ["h2o"], ["snapkv", "h2o"]]
    for index, expected in rows.items():
        folder = Runner(validate_run(group[index])).folder / dataset
        assert (folder / PREDICTIONS_FILE).read_text() == expected
        assert (folder / METRICS_FILE).exists()


def test_what_splits_groups_is_declared_and_sharing_is_not_part_of_the_run(sweeps) -> None:
    _, _, cfgs = sweeps
    cfg = cfgs[0]
    method = validate_run(cfg).method
    key = prefill_key(cfg, method)
    assert prefill_key(OmegaConf.merge(cfg, {"budget": {"name": "x", "spec": "32L"}}), method) == key
    for change in ({"run": {"prefill_chunk": 64}}, {"task": {"question_mode": "agnostic"}},
                   {"model": {"dtype": "bfloat16"}}, {"seed": 1}):  # fmt: skip
        assert prefill_key(OmegaConf.merge(cfg, change), method) != key, change
    assert prefill_key(cfg, validate_run(cfgs[4]).method) != key  # tova: query-head storage
    assert "decode_batch" in str(unshared_reason(OmegaConf.merge(cfg, {"run": {"decode_batch": 4}}), method))
    assert config_hash(OmegaConf.merge(cfg, {"run": {"share_prefill": False, "prefill_group_size": 2}})) == (
        config_hash(cfg)
    )
    assert group_jobs(["a", "b", None, "a", "a", "b"], size=2) == [[0, 3], [1, 5], [2], [4]]


def test_the_slurm_manifest_puts_a_group_in_one_array_task_and_runs_it_shared(sweeps, tmp_path) -> None:
    """``scripts/slurm_sweep.py``'s manifest: one line per group of jobs sharing a prefill (``::`` between them, at
    most ``--group-size`` per line), listed by the dry run; the line runs the group in one process, each job's
    predictions equal to the job alone."""
    from kvbench.app import sweep

    _, alone_root, _ = sweeps
    root = tmp_path / "runs"
    overrides = [item for item in SWEEP if item != "-m"] + [f"run.output_root={root}"]
    jobs = sweep.plan(None, overrides, name="shared")
    tasks = sweep.manifest_tasks(jobs, size=3)
    assert [len(task) for task in tasks] == [3, 1, 3, 1]  # snapkv+h2o (4 jobs) and tova+cake (4), 3 per task
    assert [len(task) for task in sweep.manifest_tasks(jobs, share=False)] == [1] * 8
    listing = sweep.task_listing(tasks)
    assert listing.startswith("task 0 (3 jobs, one shared prefill per sample):") and "task 1 (1 job):" in listing
    manifest = sweep.write_manifest(tmp_path / "manifest.txt", sweep.manifest_text(jobs, tasks))
    line = sweep.manifest_line(manifest, 2)
    assert len(sweep.split_jobs(line)) == 3
    sweep.exec_line(line)  # tova 64L, tova 128L, cake 64L: run here, together
    for job in tasks[2]:
        relative = job.folder.relative_to(root)
        predictions = relative / "niah_single_2k" / PREDICTIONS_FILE
        assert (root / predictions).read_bytes() == (alone_root / predictions).read_bytes()
        meta = json.loads((root / relative / RUN_META_FILE).read_text())
        assert meta["prefill_sharing"]["jobs"] == 3


def test_the_kvpress_leaderboard_on_a_small_grid_runs_shared_with_the_predictions_of_its_unshared_run(
    tmp_path,
) -> None:
    """``+experiment=kvpress_leaderboard``'s 13 presses at one compression ratio, on the tiny model, two RULER tasks
    at 512 tokens, two samples each, 8-token answers (question-agnostic, kvpress's data generation and template
    options): one shared group, each job's predictions those of its run alone."""
    from kvbench.app import sweep

    grid = ["model=tiny", "task.length=512", "task.datasets=[niah_single_1,niah_multikey_1]", "task.num_samples=2",
            "task.options.max_new_tokens=8", "budget=cr0.5", "run.progress=false", "run.print_table=false"]  # fmt: skip
    shared_jobs = sweep.plan("kvpress_leaderboard", [*grid, f"run.output_root={tmp_path / 'shared'}"])
    assert len(shared_jobs) == 13 and all(job.state == "new" for job in shared_jobs)
    shared_runs = [validate_run(job.cfg) for job in shared_jobs]
    sharing = SweepSharing.plan(shared_runs)
    assert len({id(group) for group in sharing.groups.values()}) == 1 and len(sharing.groups) == 13
    for run in shared_runs:
        assert sharing.run_job(run)
    alone_overrides = [*grid, f"run.output_root={tmp_path / 'alone'}", "run.share_prefill=false"]
    for job in sweep.plan("kvpress_leaderboard", alone_overrides):
        Runner(validate_run(job.cfg)).run()
    shared, alone = _files(tmp_path / "shared"), _files(tmp_path / "alone")
    predictions = [name for name in shared if name.endswith(PREDICTIONS_FILE)]
    assert len(predictions) == 26
    for name in predictions:
        assert shared[name].read_bytes() == alone[name].read_bytes(), name


def test_a_cluster_launcher_sweep_becomes_one_launcher_job_per_group(tmp_path, monkeypatch) -> None:
    """``-m ... hydra/launcher=slurm``: the sweep handed to the launcher is one over the lines of a manifest of its
    shared-prefill tasks (the Hydra settings and the overrides no job sweeps kept); each line holds a group."""
    from kvbench.app import sweep
    from kvbench.app.shared_tasks import grouped_command_line

    monkeypatch.chdir(tmp_path)
    args = ["-m", "hydra/launcher=slurm", "method=snapkv,h2o,tova", "budget=64L,128L", "task.num_samples=1",
            f"run.output_root={tmp_path / 'runs'}"]  # fmt: skip
    jobs = multirun_jobs(args)
    line = grouped_command_line(args, jobs)
    assert line is not None
    assert line[:4] == ["-m", "hydra/launcher=slurm", "task.num_samples=1", f"run.output_root={tmp_path / 'runs'}"]
    assert line[5:] == ["run.shared_task=0,1", "hydra.sweep.subdir=task_${hydra.job.num}"]
    manifest = Path(line[4].split("=", 1)[1].strip("'"))
    assert manifest.is_relative_to(tmp_path / "logs" / "sweeps" / "multirun")
    tasks = [sweep.split_jobs(sweep.manifest_line(manifest, index)) for index in range(2)]
    methods = [[job[0] for job in task] for task in tasks]
    assert methods == [["method=snapkv"] * 2 + ["method=h2o"] * 2, ["method=tova"] * 2]
    one = ["-m", "hydra/launcher=slurm", "method=snapkv", "budget=64L", f"run.output_root={tmp_path / 'runs'}"]
    assert grouped_command_line(one, multirun_jobs(one)) is None  # nothing to share: the sweep as given
