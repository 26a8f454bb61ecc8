"""Every check that can run before any work, in three stages of rising cost.

1. :func:`check_config` -- the composed config alone: no unknown keys (``+method.windw=8`` included), no missing
   values, names usable as folder names, budget string, knob ranges and choices, ``task.datasets`` against the
   task's dataset names, ``run.prefill_chunk``.  Imports neither torch nor
   transformers, so ``python run.py`` reports a bad value in well under a second (``scripts/bench_errors.py``).
2. :func:`check_environment` -- what the config points at, still without torch: the model (builtin, an existing
   local folder, or a hub id -- in the local cache when offline), the data folder, the optional packages the
   run needs, a results root where a folder can be made (probed by making one), ``$KVBENCH_LOCK_WAIT``, and that
   no other process holds the run folder.
3. :func:`validate` -- needs torch (lazily imported): the method family builds with its parameters (the families'
   ``parse_params``), the task kind is registered.  :func:`validate_run` runs the three stages once and returns a
   :class:`~kvbench.run.validated.ValidatedRun` (the config with the method and budget it built), which every
   caller of the runner passes to it (``run.py``, :func:`kvbench.evaluate`, a sweep's groups): the runner never
   validates again.  It then checks the device, loads the tokenizer and reads every selected dataset
   (:func:`kvbench.tasks.base.check_samples`),
   before the model's weights load and before anything is written under ``results/``.

Every failure is a :class:`~kvbench.errors.KVBenchError` whose message names the key and value, the valid
choices and the fix, in one paragraph.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.util
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from kvbench.budget import BudgetError, budget_label, parse_budget
from kvbench.checks import check_choice, check_decode_batch, check_min
from kvbench.config import (
    CHANGED_INPUTS,
    DTYPE_NAMES,
    QUESTION_MODES,
    SESSION_KNOBS,
    WANDB_MODES,
    KVBenchConfig,
    check_kv_quant,
    kv_quant_refusal,
)
from kvbench.errors import KVBenchError
from kvbench.models.source import resolve_model_source
from kvbench.resources import conf_dir
from kvbench.run.validated import ValidatedRun
from kvbench.storage.folder import check_not_locked
from kvbench.storage.paths import check_run_folder_path, output_root, run_folder

#: Config values used as results folder names (``results/runs/<model>/<task>/<method>/<budget>[~<tag>]``).
FOLDER_NAME_KEYS = ("model.name", "task.name", "method.name", "budget.name", "kv_quant.name", "run.tag")


# ---------------------------------------------------------------------------------------------------- stage 1
def check_config(cfg: DictConfig) -> None:
    """Stage 1: the config's keys and values (see the module docstring); raises :class:`KVBenchError`."""
    _check_keys(cfg, KVBenchConfig, prefix="")
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise KVBenchError(
            f"{', '.join(missing)} must be set (no value given); pick a preset (model=, method=, budget=, task=) "
            "or set the key on the command line."
        )
    for key in FOLDER_NAME_KEYS:
        _check_folder_name(key, OmegaConf.select(cfg, key))
    _check_budget(str(cfg.budget.spec))
    label_budget(cfg)
    check_session_knobs(cfg.method)
    _check_task_values(cfg.task)
    _check_choice("model.dtype", cfg.model.dtype, DTYPE_NAMES)
    _check_min("model.max_input_length", cfg.model.max_input_length, 2)
    _check_choice("wandb.mode", cfg.wandb.mode, WANDB_MODES)
    if cfg.run.threads is not None:
        _check_min("run.threads", cfg.run.threads, 1)
    if cfg.run.prefill_chunk is not None:
        _check_min(
            "run.prefill_chunk",
            cfg.run.prefill_chunk,
            0,
            "tokens per forward of the compressed prefill; 0 = one forward, null = automatic",
        )
    check_decode_batch(cfg.run.decode_batch, error=KVBenchError)
    _check_choice("run.changed_inputs", cfg.run.changed_inputs, CHANGED_INPUTS)
    if OmegaConf.select(cfg, "kv_quant") is not None:
        check_kv_quant(cfg.kv_quant, error=KVBenchError)


def label_budget(cfg: DictConfig) -> None:
    """Name the budget after what runs: a preset's ``budget.name`` left over after ``budget.spec=<spec>`` changed
    its spec (``budget=64L budget.spec=999999L`` would otherwise record ``64L`` and share 64L's folder) becomes
    the spec's own label (:func:`kvbench.budget.budget_label`: ``999999L``).  A name the user chose
    (``budget.name=<name>``, not a preset's) is kept."""
    spec, name = str(cfg.budget.spec), str(cfg.budget.name)
    preset_spec = _preset_budget_specs().get(name)
    if preset_spec is not None and preset_spec != spec.strip():
        cfg.budget.name = budget_label(spec)


@functools.cache
def _preset_budget_specs() -> dict[str, str]:
    """Preset name -> its spec, from ``conf/budget/*.yaml``."""
    import yaml

    specs = {}
    for path in sorted((conf_dir() / "budget").glob("*.yaml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        if isinstance(data, dict) and "name" in data and "spec" in data:
            specs[str(data["name"])] = str(data["spec"])
    return specs


def _check_keys(node: Any, schema: type, prefix: str) -> None:
    """Every key of ``node`` must be a field of the ``schema`` dataclass (recursively for dataclass fields)."""
    if not isinstance(node, DictConfig):
        return
    fields = [field.name for field in dataclasses.fields(schema)]
    hints = typing.get_type_hints(schema)
    for key in node:
        if key not in fields:
            raise KVBenchError(unknown_key_message(f"{prefix}{key}", str(key), fields, prefix))
        field_type = hints[key]
        if dataclasses.is_dataclass(field_type) and not OmegaConf.is_missing(node, key):
            _check_keys(node[key], field_type, f"{prefix}{key}.")


def unknown_key_message(full_key: str, key: str, valid: Sequence[str], prefix: str, added: bool = True) -> str:
    """One paragraph for a key that is not in the schema; ``added``: it got in with Hydra's ``+``."""
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    if not close and prefix == "method.":  # a session knob, misspelt as it was spelt before issue #57
        knob = difflib.get_close_matches(key, SESSION_KNOBS, n=1, cutoff=0.6)
        close = [f"params.{knob[0]}"] if knob else []
    group = prefix.rstrip(".") or "the root config"
    how = " (a key added with '+' is not checked by Hydra)" if added else ""
    suggestion = ""
    if close:
        suggestion = f" Did you mean {prefix}{close[0]}?" + (
            f" Set it without '+': {prefix}{close[0]}=<value>." if added else ""
        )
    extra = " Family hyper-parameters go under method.params.<key>." if prefix == "method." else ""
    return f"{full_key} is not a kvbench setting{how}; the keys of {group} are: {', '.join(valid)}.{suggestion}{extra}"


def _check_folder_name(key: str, value: Any) -> None:
    if value is None and key in ("run.tag", "kv_quant.name"):  # no tag; a config from before kv_quant
        return
    text = str(value)
    if not text or text in (".", "..") or any(ch in text for ch in "/\\\0") or text != text.strip():
        raise KVBenchError(
            f"{key}={value!r} cannot be used as a results folder name: use a non-empty name without '/', '\\' or "
            f"surrounding spaces (e.g. {key}=my_variant)."
        )


def _check_budget(spec: str) -> None:
    try:
        parse_budget(spec)
    except BudgetError as err:
        raise KVBenchError(
            f"{err}. Pick a preset (budget=128L, budget=full, ...) or set budget.spec to one of the accepted forms."
        ) from err


def check_session_knobs(method: Any) -> None:
    """The session knobs ``method.params`` sets (``window``, ``gqa_agg``, ...: type, range, choices), checked by their
    declaration (:class:`kvbench.eviction.knobs.SessionKnobs`) before torch loads; whether the family reads them, and
    its own knobs, are checked when it builds (stage 3)."""
    from kvbench.eviction.knobs import SessionKnobs
    from kvbench.eviction.params import parse_params

    given = {key: value for key, value in (method.params or {}).items() if key in SESSION_KNOBS}
    try:
        parse_params(SessionKnobs, given, str(method.family))
    except ValueError as err:
        raise KVBenchError(f"method={method.name}: {err}") from None


def _check_task_values(task: Any) -> None:
    _check_datasets(task)
    _check_choice("task.question_mode", task.question_mode, QUESTION_MODES)
    if task.num_samples is not None:
        _check_min("task.num_samples", task.num_samples, 1, "or null for all samples")
    if task.length is not None:
        _check_min("task.length", task.length, 1, "the target context length in tokens")
    for length in task.lengths or ():
        _check_min("task.lengths", length, 1, "target context lengths in tokens")
    for depth in task.depths or ():
        if not 0 <= depth <= 100:
            raise KVBenchError(
                f"task.depths contains {depth!r}: needle depths are percentages in [0, 100] (e.g. "
                "task.depths=[0,50,100])."
            )


def _check_datasets(task: Any) -> None:
    """``task.datasets`` names datasets of the task, for a kind that knows its names without building
    (:attr:`kvbench.tasks.base.TaskKind.dataset_names`); other kinds check their names when they build."""
    kind = _registered_kind(task.kind)
    if task.datasets is None or kind is None or kind.dataset_names is None:
        return
    try:
        available = kind.dataset_names(task)
    except (ValueError, KeyError):  # a bad setting the task builder reports with its own message
        return
    unknown = [str(name) for name in task.datasets if name not in available]
    if unknown:
        close = [match for name in unknown for match in difflib.get_close_matches(name, available, n=1)]
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise KVBenchError(
            f"task.datasets={unknown} are not datasets of task={task.name} (kind {task.kind}); valid datasets: "
            f"{', '.join(available)}.{hint} Or leave task.datasets=null for all of them (`kvbench list tasks`)."
        )
    if not task.datasets:
        raise KVBenchError(
            f"task.datasets=[] selects no dataset of task={task.name}; valid datasets: {', '.join(available)}, or "
            "task.datasets=null for all of them."
        )


def _registered_kind(name: str) -> Any:
    """The registered :class:`~kvbench.tasks.base.TaskKind` named ``name``, or ``None`` (stage 3 reports an unknown
    kind).  Imports the task modules, which import neither torch nor transformers."""
    from kvbench.tasks.base import TASK_KINDS

    return TASK_KINDS.as_dict().get(name)


def _check_choice(key: str, value: Any, valid: Sequence[str], also: str = "") -> None:
    check_choice(key, value, valid, also, error=KVBenchError)


def _check_min(key: str, value: Any, minimum: int, meaning: str = "") -> None:
    check_min(key, value, minimum, meaning, error=KVBenchError)


# ---------------------------------------------------------------------------------------------------- stage 2
def check_environment(cfg: DictConfig, check_model: bool = True) -> None:
    """Stage 2: the model's weights can be found, the data folder exists, optional packages are installed, the
    results root can be written.  No torch; no network.  ``check_model=False``: the caller loaded the model itself
    (:func:`kvbench.evaluate`)."""
    if check_model:
        resolve_model_source(cfg.model)
    _check_data_dir(cfg.task)
    for module, why, fix in required_packages(cfg):
        if not any(package_available(name) for name in module.split("|")):
            raise KVBenchError(
                f"{why} needs the Python package {module.split('|')[0]!r}, which is not installed. {fix}"
            )
    folder = run_folder(cfg)  # run.output_root empty or ~unknown: refused here
    check_run_folder_path(output_root(cfg), folder)  # a file in the way, a place that refuses folders
    check_not_locked(folder)  # also checks $KVBENCH_LOCK_WAIT


def package_available(module: str) -> bool:
    """Whether ``module`` can be imported (found on the path; not imported here)."""
    return importlib.util.find_spec(module) is not None


def _check_data_dir(task: Any) -> None:
    """``task.data_dir`` names an existing folder (or a value the task kind names its shipped data with, e.g.
    LongBench's ``fixtures``: :attr:`~kvbench.tasks.base.TaskKind.data_dir_values`; with
    ``task.options.source=hub`` it is where downloads go, so it may not exist yet)."""
    data_dir = task.data_dir
    kind = _registered_kind(task.kind)
    shipped = kind.data_dir_values if kind is not None else {}
    if data_dir is None or data_dir in shipped:
        return
    if (task.options or {}).get("source") == "hub":
        return
    path = Path(str(data_dir)).expanduser()
    if not path.is_dir():
        preparer = kind.preparer_name if kind is not None else task.kind
        also = "".join(f" (or task.data_dir={value} for {meaning})" for value, meaning in shipped.items())
        problem = "is not a folder" if path.exists() else "does not exist"
        raise KVBenchError(
            f"task.data_dir={data_dir!r} {problem}. Point it at the folder that `python scripts/prepare_data.py "
            f"{preparer} --out <dir>` wrote{also}, or leave it unset (task.data_dir=null) for the task's default "
            "source."
        )


def required_packages(cfg: DictConfig) -> list[tuple[str, str, str]]:
    """Optional packages this run needs: ``(module, why, how to fix)``; ``a|b`` means either module will do.  The
    task's come from its kind (:attr:`~kvbench.tasks.base.TaskKind.required_packages`)."""
    needs: list[tuple[str, str, str]] = []
    if cfg.model.get("device_map") is not None:
        needs.append(("accelerate", "model.device_map", "Install it with `pip install accelerate`."))
    kind = _registered_kind(cfg.task.kind)
    if kind is not None and kind.required_packages is not None:
        needs.extend((need.module, need.why, need.fix) for need in kind.required_packages(cfg.task))
    return needs


# ---------------------------------------------------------------------------------------------------- stage 3
def check_method(cfg: DictConfig) -> Any:
    """Build the method family with its parameters (``method.family``, ``method.params.*``: the families'
    ``parse_params``) and return the ``EvictionMethod``.  Imports torch and the method modules, not transformers
    (the families import the cache for type hints only), so these errors come in about 1.5 s."""
    from kvbench.eviction.base import build_method

    check_method_knobs(cfg)
    try:
        return build_method(cfg.method)
    except ValueError as err:
        raise KVBenchError(f"method={cfg.method.name}: {str(err).rstrip('.')}.") from err


def check_method_knobs(cfg: DictConfig) -> None:
    """``method.params``'s keys against the knobs the method's class declares (a command-line
    ``method.params.<knob>=`` sets a knob the preset does not list: :func:`kvbench.app.overrides.prepare_overrides`), an
    error naming the method's own knobs; imports torch and the method modules."""
    from kvbench.eviction.family import check_declared_params

    try:
        check_declared_params(cfg.method)
    except ValueError as err:
        raise KVBenchError(f"method={cfg.method.name}: {err}") from err


def validate(cfg: DictConfig) -> tuple[Any, Any]:
    """Stages 1 and 3 (no environment checks: a sweep plans jobs on a login node this way); imports torch.

    Returns ``(EvictionMethod, Budget)``.
    """
    check_config(cfg)
    return _build_run(cfg)


def validate_run(cfg: DictConfig, check_model: bool = True) -> ValidatedRun:
    """Stages 1, 2 and 3 once, in that order (``python run.py``'s; ``check_model=False``: the caller loaded the
    model itself, :func:`kvbench.evaluate`); returns the validated config with the method and budget it built."""
    check_config(cfg)
    check_environment(cfg, check_model=check_model)
    method, budget = _build_run(cfg)
    return ValidatedRun(cfg, method, budget)


def _build_run(cfg: DictConfig) -> tuple[Any, Any]:
    """Stage 3: the method family builds with its parameters (before anything imports transformers), the task kind
    is registered, the budget parses; returns ``(EvictionMethod, Budget)``."""
    method = check_method(cfg)
    if OmegaConf.select(cfg, "kv_quant") is not None:
        refusal = kv_quant_refusal(check_kv_quant(cfg.kv_quant, error=KVBenchError), method)
        if refusal is not None:
            raise KVBenchError(f"{refusal}.")
    from kvbench.tasks.base import task_kinds

    kinds = task_kinds()
    if cfg.task.kind not in kinds:
        raise KVBenchError(
            f"task.kind={cfg.task.kind!r} is not a registered task kind; valid: {', '.join(kinds)} (pick a task "
            "preset: task=longbench, task=ruler, ...)."
        )
    from kvbench.eviction.threshold import check_budget_form

    budget = parse_budget(str(cfg.budget.spec))
    try:  # a threshold method takes a threshold budget (<t>thr), every other method a size
        check_budget_form(method, budget)
    except ValueError as err:
        raise KVBenchError(str(err)) from None
    return method, budget
