"""Getting started, executed top to bottom as a new user types it (issue #60, item 2).

Every bash block of ``docs/getting-started.md`` is handled in page order, in one fresh scratch working folder (so
each command sees the results of the ones before it, as a user's checkout does), by its marker:

* ``<!-- runnable -->``: run as shown; exit status 0; a file named after ``--out`` exists afterwards.
* ``<!-- runnable: <test> -->``: that test checks what it prints at full size; here it runs too, reduced by
  :data:`REDUCED` (``python run.py`` -> ``python run.py task.num_samples=2``: the quicker look the page itself
  offers), so that the commands after it meet the folders it leaves, as a user's do.
* ``<!-- compose-only: <why> -->``: too long to run here; each command is composed instead: a ``run.py`` sweep's
  every job through the sweep planner (:func:`kvbench.app.sweep.plan`: composed, validated, and a folder of its
  own), a single run through ``run.py``'s config checks, ``scripts/smollm2_grid.py run`` with ``--dry-run`` (the
  default phases limited to :data:`GRID_PHASES_COMPOSED`), ``make <target>`` with ``make -n``.
* ``<!-- not-runnable: <why> -->``: installs and the installed ``kvbench`` command (``tests/packaging`` runs those
  from a wheel); not run here.

The docs home's quick start (``docs/index.md``) is ``python run.py`` alone, which
``tests/end_to_end/test_tiny_model_eviction.py`` runs at full size and compares, line by line, with the page.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.docs.test_docs import REPO, commands, marked_blocks, shell_argv

PAGE = "docs/getting-started.md"
#: Commands run reduced here (their full-size output is checked by the test the page names).
REDUCED = {("python", "run.py"): ["task.num_samples=2"]}
#: The SmolLM2 grid's default phases composed here: phase 1 (the full cache on every 2K cell) and phase 2 (every
#: method on the cheap cells); phases 3-6 are the same methods at the other budget and mode, and on the 4K cells.
GRID_PHASES_COMPOSED = ["1", "2"]


def run_shown(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return subprocess.run(shell_argv(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def compose_shown(argv: list[str], cwd: Path) -> str:
    """Compose a long command instead of running it (see the module docstring); what was checked, for the record."""
    if argv[0] == "make":
        done = subprocess.run(["make", "-n", "-C", str(REPO), *argv[1:]], capture_output=True, text=True)
        assert done.returncode == 0, f"make -n {' '.join(argv[1:])}: {done.stderr}"
        return f"make -n {' '.join(argv[1:])}"
    if argv[:2] == ["python", "scripts/smollm2_grid.py"]:
        if argv[2] != "run":
            return "skipped (tabulates the runs of the command before it)"
        extra = [] if "--phases" in argv else ["--phases", *GRID_PHASES_COMPOSED]
        done = run_shown([*argv, "--dry-run", *extra], cwd)
        assert done.returncode == 0, f"{' '.join(argv)} --dry-run\n{done.stderr[-3000:]}"
        assert "compose and validate (nothing run)" in done.stdout
        return done.stdout.strip().splitlines()[-1]
    if argv[:2] == ["python", "run.py"]:
        overrides = argv[2:]
        if "-m" in overrides:
            from kvbench.app import sweep

            jobs = sweep.plan(
                None, [o for o in overrides if o != "-m"], name="getting-started", check_environment=False
            )
            bad = [f"{job.line}: {job.reason}" for job in jobs if job.state == "invalid"]
            assert jobs and not bad, "\n".join(bad)
            return f"{len(jobs)} jobs planned"
        import kvbench
        from kvbench.app.validation import check_config

        chosen: dict[str, str | None] = {"method": "snapkv", "budget": "64L", "task": "tiny_niah", "model": None}
        rest = [o for o in overrides if o.partition("=")[0] not in chosen]
        chosen.update({k: v for k, _, v in (o.partition("=") for o in overrides) if k in chosen})
        check_config(kvbench.compose_config(**chosen, overrides=rest))  # type: ignore[arg-type]
        return "composed and checked"
    return "skipped (not a run command)"


def test_getting_started_runs_top_to_bottom(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the sweep planner reads run folders relative to the working folder
    done_kinds: list[str] = []
    for kind, detail, body in marked_blocks(PAGE):
        for argv in commands(body):
            if kind == "runnable":
                shown = argv + REDUCED.get(tuple(argv), []) if detail else argv
                done = run_shown(shown, tmp_path)
                assert done.returncode == 0, f"{' '.join(shown)}\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
                assert "note:" not in done.stderr or "holds a run with other settings" in done.stderr
                if "--out" in argv:
                    assert (tmp_path / argv[argv.index("--out") + 1]).exists(), f"{' '.join(argv)} wrote nothing"
                if detail:  # the embedded default: its comparison table, the four runs side by side
                    assert "full cache" in done.stdout and "StreamingLLM" in done.stdout, done.stdout[-2000:]
                done_kinds.append("ran")
            elif kind == "compose-only":
                done_kinds.append(compose_shown(argv, tmp_path))
    assert done_kinds.count("ran") >= 5 and len(done_kinds) >= 10, done_kinds
    # What the page says of the sweep: the run the comparison made is not run again, and the tables exist.
    assert (tmp_path / "results/tables/runs.csv").is_file() and (tmp_path / "results/tables/runs_summary.md").is_file()
    assert (tmp_path / "results/site/index.html").is_file()
