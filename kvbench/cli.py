"""The ``kvbench`` console script and ``python run.py``: one Hydra app, one exit code (2) per user error.

* :func:`main` -- the entry point of both: ``kvbench list methods|tasks|models|budgets`` (:mod:`kvbench.listing`),
  else the Hydra app over the shipped config tree (:func:`kvbench.resources.conf_dir`, an absolute path, so the
  installed package finds it from any working directory; results go under the working directory's ``results/``).
* :func:`run_job` -- one configuration: the checks that need no torch first (:mod:`kvbench.validation`), the
  method family and its parameters (torch, not transformers), then the runner (or, for ``python run.py`` alone,
  the embedded demo).
* :func:`reporting_errors` -- a :class:`~kvbench.errors.KVBenchError` becomes ``error: <message>`` on stderr and
  exit status 2, without a traceback unless ``KVBENCH_DEBUG=1``; SIGTERM/SIGINT exit 143/130 (the run resumes
  from where it stopped); anything else is a bug and keeps its traceback (exit 1).
* :func:`~kvbench.hydra_errors.hydra_error_message` -- Hydra's own errors (unknown preset, misspelt key, wrongly
  typed value, override syntax) rewritten in the same form.  :func:`main` sets ``HYDRA_FULL_ERROR=1`` so Hydra
  raises them instead of printing its own report, and :func:`reporting_hydra_errors` reports them, also with exit
  status 2.

Nothing here imports torch before the config checks pass; transformers is imported by the runner.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from omegaconf import DictConfig

from kvbench.errors import INTERRUPTED_EXIT, USER_ERROR_EXIT, Interrupted, KVBenchError
from kvbench.hydra_errors import hydra_error_message, one_paragraph
from kvbench.validation import validate_run

#: Environment variable that adds the traceback to user-error reports.
DEBUG_ENV = "KVBENCH_DEBUG"


def debug_enabled() -> bool:
    """Whether ``KVBENCH_DEBUG`` (set and not ``0``) asks for tracebacks with user errors."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def report_user_error(message: str) -> None:
    """Print ``error: <message>`` to stderr (with the current traceback first when debugging)."""
    if debug_enabled() and sys.exc_info()[0] is not None:
        traceback.print_exc()
    print(f"error: {one_paragraph(message)}", file=sys.stderr, flush=True)


@contextmanager
def reporting_errors() -> Iterator[None]:
    """Turn user errors and stop signals into a message and an exit status (see the module docstring)."""
    try:
        yield
    except KVBenchError as err:
        report_user_error(str(err))
        sys.exit(USER_ERROR_EXIT)
    except Interrupted as err:
        print(f"interrupted ({err}); predictions so far are saved, rerun the same command to resume", file=sys.stderr)
        sys.exit(INTERRUPTED_EXIT)
    except KeyboardInterrupt:
        print("interrupted (Ctrl-C); predictions so far are saved, rerun the same command to resume", file=sys.stderr)
        sys.exit(130)
    except Exception:  # a bug, not a user error: keep its traceback (and never let Hydra's handler relabel it)
        traceback.print_exc()
        print("kvbench: unexpected error (the traceback above); please report it", file=sys.stderr, flush=True)
        sys.exit(1)


def main() -> None:
    """``kvbench [overrides ...]`` / ``python run.py [overrides ...]``, or ``kvbench list <target>``.

    With no arguments: the embedded default (tiny model, offline synthetic task, CPU) beside its variants."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Hydra raises its own errors instead of printing them (exit 1); reporting_hydra_errors reports them (exit 2).
    os.environ["HYDRA_FULL_ERROR"] = "1"
    if sys.argv[1:2] == ["list"]:
        from kvbench.listing import main as list_main

        sys.exit(list_main(sys.argv[2:]))
    if sys.argv[1:2] in (["report"], ["wandb-report"]):  # the dashboards (kvbench/dashboards.py)
        from kvbench.dashboards import main as dashboards_main

        with reporting_errors():
            sys.exit(dashboards_main(sys.argv[1:]))
    from kvbench.overrides import prepare_overrides

    # Any budget spec (budget=80L, budget=0.3x, budget=512) and a number given to any group, as Hydra composes them.
    sys.argv[1:] = prepare_overrides(sys.argv[1:])
    with reporting_hydra_errors(sys.argv[1:]):
        hydra_app()()


def hydra_app() -> Callable[[], None]:
    """The Hydra app over the shipped config tree; Hydra reads the overrides from ``sys.argv``."""
    import hydra

    from kvbench import resources
    from kvbench.config import register_configs

    register_configs()

    @hydra.main(version_base="1.3", config_path=str(resources.conf_dir()), config_name="config")
    def app(cfg: DictConfig) -> None:
        """Run one configuration (Hydra calls this once per job in a sweep)."""
        # `kvbench` / `python run.py` alone (or with extent/run settings only): the embedded default beside its
        # variants.
        overrides = sys.argv[1:]
        run_job(cfg, demo=demo_overrides(overrides), overrides=overrides)

    return app


#: Overrides that keep ``kvbench`` / ``python run.py`` on the embedded default's comparison: they change how much
#: is run and where, not what (``python run.py task.num_samples=2`` is the comparison on 2 samples per dataset).
DEMO_KEEPING_PREFIXES = ("task.num_samples=", "seed=", "run.", "wandb.")


def demo_overrides(overrides: Sequence[str]) -> bool:
    """Whether these command-line overrides still run the embedded default's comparison (see
    :data:`DEMO_KEEPING_PREFIXES`; ``run.tag`` names a variant, so it does not)."""
    return all(o.startswith(DEMO_KEEPING_PREFIXES) and not o.startswith("run.tag=") for o in overrides)


def run_job(cfg: DictConfig, demo: bool = False, overrides: Sequence[str] = ()) -> None:
    """Run one configuration as ``run.py`` does; exits with status 2 on a user error.  ``demo``: the embedded
    default's comparison, its variants composed with ``overrides`` too."""
    with reporting_errors():
        validated = validate_run(cfg)  # the method family's parameters before the runner imports transformers
        if demo:
            from kvbench.demo import run_demo

            run_demo(cfg, overrides)
        else:
            from kvbench.run.runner import Runner

            Runner(cfg, validated=validated).run()


@contextmanager
def reporting_hydra_errors(overrides: Sequence[str]) -> Iterator[None]:
    """Report an error raised by Hydra itself (composition, overrides) as a user error: exit status 2."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        yield
    except (HydraException, OmegaConfBaseException) as err:  # run_job reports everything raised inside a job
        report_user_error(hydra_error_message(err, overrides))
        sys.exit(USER_ERROR_EXIT)
