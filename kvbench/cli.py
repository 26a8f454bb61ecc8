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
* :func:`hydra_error_message` -- Hydra's own errors (unknown preset, misspelt key, wrongly typed value, override
  syntax) rewritten in the same form.  :func:`main` sets ``HYDRA_FULL_ERROR=1`` so Hydra raises them instead of
  printing its own report, and :func:`reporting_hydra_errors` reports them, also with exit status 2.

Nothing here imports torch before the config checks pass; transformers is imported by the runner.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from omegaconf import DictConfig

from kvbench.errors import INTERRUPTED_EXIT, USER_ERROR_EXIT, Interrupted, KVBenchError
from kvbench.validation import unknown_key_message, validate_run

#: Environment variable that adds the traceback to user-error reports.
DEBUG_ENV = "KVBENCH_DEBUG"
OVERRIDE_GRAMMAR_URL = "https://hydra.cc/docs/advanced/override_grammar/basic/"


def debug_enabled() -> bool:
    """Whether ``KVBENCH_DEBUG`` (set and not ``0``) asks for tracebacks with user errors."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def one_paragraph(text: str) -> str:
    """``text`` with its lines joined by spaces (messages are one paragraph)."""
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


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


def hydra_error_message(err: BaseException, overrides: Sequence[str] = ()) -> str:
    """One paragraph for a Hydra/OmegaConf composition error: the key or value, the valid choices, the fix."""
    from hydra.errors import MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    cause = err.__cause__
    missing = getattr(err, "missing_cfg_file", None) or ""
    if isinstance(err, MissingConfigException) and missing.startswith("hydra/launcher/submitit"):
        return (
            f"the SLURM launcher needs Hydra's submitit plugin ({missing} is not installed): pip install -e "
            "'.[slurm]', or submit with scripts/slurm_sweep.py (plain sbatch arrays, no plugin)."
        )
    if isinstance(err, MissingConfigException) and err.missing_cfg_file and err.options:
        group, _, name = err.missing_cfg_file.rpartition("/")
        close = difflib.get_close_matches(name, err.options, n=1, cutoff=0.6)
        hint = f" Did you mean {group}={close[0]}?" if close else ""
        if group == "budget":
            hint += (
                " A budget that is not a preset is set with budget.spec=<spec> (e.g. budget.spec=96L, named after "
                "the budget preset it replaces; forms: full, <n>L, <n>/layer, <r>x with 0<r<=1)."
            )
        return (
            f"unknown {group} {name!r} (there is no conf/{err.missing_cfg_file}.yaml); valid: "
            f"{', '.join(err.options)}.{hint}"
        )
    unknown_key = isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and getattr(cause, "full_key", None)
    if unknown_key and _is_schema(cause.object_type):
        full_key, key = str(cause.full_key), str(cause.key)
        prefix = full_key[: len(full_key) - len(key)]
        valid = [field.name for field in dataclasses.fields(cause.object_type)]
        return unknown_key_message(full_key, key, valid, prefix, added=False)
    if isinstance(cause, ValidationError) and getattr(cause, "full_key", None):
        schema = cause.object_type.__name__ if _is_schema(cause.object_type) else "the schema"
        return (
            f"{cause.full_key}={cause.value!r} is not valid: {cause.msg.splitlines()[0]} (the type of "
            f"{cause.full_key} is declared in kvbench/config.py, {schema}). Give a value of that type."
        )
    if isinstance(err, OverrideParseException):
        bad = _unparsable_override(overrides)
        which = f"the override {bad!r}" if bad else "a command-line override"
        return (
            f"cannot parse {which}: {str(err).splitlines()[0]}. Overrides are key=value (lists: key=[a,b]; quote "
            f"values with spaces or special characters); see {OVERRIDE_GRAMMAR_URL}."
        )
    message = one_paragraph(str(err)) or type(err).__name__
    if cause is not None and str(cause):
        message += f" ({one_paragraph(str(cause).splitlines()[0])})"
    return message


def _is_schema(object_type: Any) -> bool:
    return isinstance(object_type, type) and dataclasses.is_dataclass(object_type)


def _unparsable_override(overrides: Sequence[str]) -> str | None:
    """The first command-line override Hydra's parser rejects, if any."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for override in overrides:
        if override.startswith("-"):
            continue
        try:
            parser.parse_overrides([override])
        except Exception:
            return override
    return None
