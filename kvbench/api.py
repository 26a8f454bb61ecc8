"""kvbench's public Python API: :func:`evaluate` a method on a benchmark task with your own loaded model, and
:func:`press` a method onto your own ``model.generate`` calls.

Methods, budgets and tasks are named as on the command line (``method=snapkv budget=128L task=longbench``): the
names are composed from kvbench's ``conf/`` tree with Hydra's compose API, exactly as ``run.py`` composes them, so
a preset means the same thing in both places.  Each may also be given as a config object (a mapping or
``DictConfig`` with the fields of :class:`kvbench.config.MethodConfig` / ``BudgetConfig`` / ``TaskConfig``, checked
against that schema), and a budget as any budget string (``96L``, ``256/layer``, ``0.2x``).

:func:`evaluate` is the runner (:class:`kvbench.run.runner.Runner`) with the model and tokenizer you pass instead of
``model=<preset>``: the same prompts, truncation, stops, scoring, results folder and ``summary.json``.
"""

from __future__ import annotations

import logging
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from kvbench.app.overrides import prepare_overrides
from kvbench.checks import check_choice, check_min
from kvbench.config import (
    QUESTION_MODES,
    SESSION_KNOBS,
    BudgetConfig,
    MethodConfig,
    ModelConfig,
    TaskConfig,
    move_session_knobs,
    register_configs,
    session_knob_note,
)
from kvbench.errors import KVBenchError, environment_errors
from kvbench.resources import conf_dir

LOG = logging.getLogger(__name__)

#: Hydra's config name of kvbench's root config.
ROOT_CONFIG = "config"


def compose_config(
    method: str | Mapping[str, Any] = "snapkv",
    budget: str | Mapping[str, Any] = "64L",
    task: str | Mapping[str, Any] = "tiny_niah",
    model: str | None = None,
    overrides: Sequence[str] = (),
) -> DictConfig:
    """The run config ``run.py`` would compose for ``method=... budget=... task=... [model=...] <overrides>``.

    ``method``/``budget``/``task``: a preset name (``conf/<group>/<name>.yaml``) or a config object; ``budget`` may
    also be any budget spec (``96L``, ``0.3x``, ``512`` = ``512L``), named as on the command line
    (:func:`kvbench.config.budget_choice`: ``0.5x`` is the preset ``ratio0.5``).  ``overrides``: Hydra override
    strings as on the command line (``"method.params.window=16"``, ``"task.length=4096"``).  Raises
    :class:`KVBenchError` naming an unknown preset or key and the valid choices.
    """
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from kvbench.app.hydra_errors import hydra_error_message

    register_configs()
    choices = [
        f"{group}={value}"
        for group, value in (("method", method), ("budget", budget), ("task", task))
        if isinstance(value, str)
    ]
    if model is not None:
        choices.append(f"model={model}")
    all_overrides = prepare_overrides([*choices, *overrides])
    try:
        with _own_hydra(), initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            cfg = compose(ROOT_CONFIG, overrides=all_overrides)
        for group, value, schema in (("method", method, MethodConfig), ("task", task, TaskConfig)):
            if not isinstance(value, str):
                cfg[group] = _group_config(group, value, schema)
        if not isinstance(budget, str):
            cfg.budget = _group_config("budget", budget, BudgetConfig)
    except (HydraException, OmegaConfBaseException) as err:
        raise KVBenchError(hydra_error_message(err, all_overrides)) from err
    return cfg


def _group_config(group: str, value: Mapping[str, Any] | DictConfig, schema: type) -> DictConfig:
    """A config object given for ``group``, merged into its schema (a misspelt key or a wrong type is refused; a
    method's session knob spelt as before issue #57, ``window`` beside ``params``, moves into ``params`` with a
    note)."""
    if not isinstance(value, (Mapping, DictConfig)):
        raise KVBenchError(
            f"{group}={value!r}; valid: a preset name (conf/{group}/<name>.yaml) or a mapping of {schema.__name__} "
            "fields"
        )
    if group == "method":
        mapping = OmegaConf.to_container(value) if isinstance(value, DictConfig) else dict(value)
        for note in move_session_knobs(mapping):  # type: ignore[arg-type]
            LOG.warning(note)
        value = mapping  # type: ignore[assignment]
    return OmegaConf.merge(OmegaConf.structured(schema), value)


@contextmanager
def _own_hydra() -> Iterator[None]:
    """Compose with kvbench's config tree even inside another Hydra app, whose global state is restored after."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    backup = get_gh_backup()
    GlobalHydra.instance().clear()
    try:
        yield
    finally:
        restore_gh_from_backup(backup)


# ---------------------------------------------------------------------------------------------------- press
def press(
    model: Any,
    method: Any = "snapkv",
    budget: Any = "128L",
    question_mode: str = "aware",
    *,
    context_length: int | None = None,
    question_length: int | None = None,
    prefill_chunk: int | None = None,
) -> Any:
    """A context manager that applies ``method`` at ``budget`` to ``model``'s forwards (``model.generate``).

    ``with kvbench.press(model, "snapkv", "128L") as record: out = model.generate(**inputs, max_new_tokens=32)``
    compresses the prompt's cache as kvbench runs do and leaves ``record``
    (:class:`kvbench.inference.press.PressRecord`) holding, per prompt, the requested and achieved per-layer / per-head
    cache lengths.  On exit the model is as before (hooks removed, attention implementation restored).

    ``method``: a preset name, a method config mapping, or a built :class:`~kvbench.eviction.base.EvictionMethod`;
    ``budget``: a preset name or budget string (``128L``, ``256/layer``, ``0.2x``, ``full``) or a parsed
    :class:`~kvbench.budget.Budget`.  ``question_mode="agnostic"`` compresses only the context and needs
    ``context_length`` (the prompt's first N tokens are the context) or ``question_length`` (its last N tokens are
    the question).  Batch size 1, greedy or sampled, any ``max_new_tokens``.
    """
    from kvbench.app.validation import validate
    from kvbench.budget import Budget
    from kvbench.eviction.base import EvictionMethod
    from kvbench.inference.press import Press

    method_is_built, budget_is_parsed = isinstance(method, EvictionMethod), isinstance(budget, Budget)
    method_name = type(method).__name__
    if not (method_is_built and budget_is_parsed):
        cfg = compose_config(
            method="full" if method_is_built else method, budget="full" if budget_is_parsed else budget
        )
        built_method, built_budget = validate(cfg)
        method = method if method_is_built else built_method
        budget = budget if budget_is_parsed else built_budget
        method_name = method_name if method_is_built else str(cfg.method.name)
    return Press(
        model,
        method,
        budget,
        question_mode=question_mode,
        context_length=context_length,
        question_length=question_length,
        prefill_chunk=prefill_chunk,
        method_name=method_name,
        budget_name=budget.spec,
    )


# ---------------------------------------------------------------------------------------------------- evaluate
@dataclass
class Evaluation:
    """What :func:`evaluate` returns.

    Attributes
    ----------
    results:
        One :class:`kvbench.run.records.DatasetResult` per dataset (score, interval, kept fraction, ...).
    summary:
        The run's ``summary.json`` (per-dataset scores with bootstrap 95 % intervals, the papers' averages, kept
        fraction, timings, provenance; see :mod:`kvbench.run.summary`).
    predictions:
        Per dataset, the ``predictions.jsonl`` rows (prediction, answers, cache record, ...).
    folder:
        The run folder, or ``None`` when ``output_dir`` was not given (results were written to a temporary folder,
        read back, and removed).
    config:
        The resolved run config.
    """

    results: list[Any]
    summary: dict[str, Any]
    predictions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    folder: Path | None = None
    config: DictConfig | None = None

    @property
    def scores(self) -> dict[str, float]:
        """``{dataset: score}`` on each benchmark's own scale."""
        return {result.dataset: result.score for result in self.results}


def evaluate(
    model: Any,
    tokenizer: Any,
    method: str | Mapping[str, Any] = "snapkv",
    budget: str | Mapping[str, Any] = "128L",
    task: str | Mapping[str, Any] = "tiny_niah",
    *,
    question_mode: str | None = None,
    limit: int | None = None,
    output_dir: str | Path | None = None,
    model_config: str | None = None,
    overrides: Sequence[str] = (),
    progress: bool = True,
    print_table: bool = False,
    kv_quant: str = "none",
) -> Evaluation:
    """Evaluate ``method`` at ``budget`` on ``task`` with your loaded ``model`` and ``tokenizer``.

    Runs :class:`kvbench.run.runner.Runner` (the machinery of ``python run.py``) on the given model instead of loading
    ``model=<preset>``.  Prompt settings come from ``model_config`` (a ``conf/model`` preset name, e.g.
    ``llama3.1-8b-instruct``: its ``max_input_length``, chat template switch and stop tokens; the run is named after
    it) or, without one, from the model itself (``max_input_length`` = ``config.max_position_embeddings``, the chat
    template when the tokenizer has one, no extra stop tokens; named after ``config.name_or_path``).

    ``kv_quant``: quantized KV storage, a ``conf/kv_quant`` preset (``kivi4``, ``quanto4``...; docs/kv_quant.md).
    ``question_mode`` (``aware``/``agnostic``) and ``limit`` (samples per dataset) override the task's; other
    settings go in ``overrides`` as on the command line (``"model.max_input_length=7500"``, ``"run.tag=mine"``).
    ``output_dir``: results go to ``<output_dir>/runs/<model>/<task>/<method>/<budget>/`` (resumable, as any run)
    and generated samples to ``<output_dir>/samples``; ``None`` writes them to a temporary folder that is removed.
    The model's attention implementation is set to kvbench's for the run and restored after, as is its
    training flag.
    """
    # The caller's own argument names, before they become task.* keys (and before transformers is imported).
    check_evaluate_arguments(model, tokenizer, overrides)
    if limit is not None:
        check_min("limit", limit, 1, "samples per dataset, the first N; None for all", error=KVBenchError)
    if question_mode is not None:
        check_choice("question_mode", question_mode, QUESTION_MODES, error=KVBenchError)
    from kvbench.app.validation import validate_run
    from kvbench.inference.press import kvbench_attention
    from kvbench.models.loading import LoadedModel, input_device
    from kvbench.run.runner import Runner

    task_overrides = []
    if question_mode is not None:
        task_overrides.append(f"task.question_mode={question_mode}")
    if limit is not None:
        task_overrides.append(f"task.num_samples={limit}")
    quant = [] if kv_quant == "none" else [f"kv_quant={kv_quant}"]
    cfg = compose_config(method, budget, task, model=model_config or "tiny", overrides=[*task_overrides, *quant])
    cfg.model = _user_model_config(cfg.model, model, tokenizer, from_preset=model_config is not None)
    with tempfile.TemporaryDirectory(prefix="kvbench-evaluate-") as scratch:
        root = Path(output_dir) if output_dir is not None else Path(scratch)
        cfg.run.output_root = str(root / "runs")
        cfg.run.sample_cache = str(root / "samples")
        cfg.run.progress = progress
        cfg.run.print_table = print_table
        if overrides:
            cfg = _apply_overrides(cfg, overrides)
        loaded = LoadedModel(model=model, tokenizer=tokenizer, device=input_device(model))
        runner = Runner(validate_run(cfg, check_model=False), loaded=loaded)
        with kvbench_attention(model), environment_errors():  # disk full, permission denied: one KVBenchError
            results = runner.run()
        return Evaluation(
            results=results,
            summary=runner.summary,
            predictions=_read_predictions(runner.folder, [r.dataset for r in results]),
            folder=runner.folder if output_dir is not None else None,
            config=cfg,
        )


def check_evaluate_arguments(model: Any, tokenizer: Any, overrides: Any) -> None:
    """:func:`evaluate`'s model, tokenizer and overrides, checked before any work: one :class:`KVBenchError` naming
    the problem and the fix (never an AttributeError from deep inside): no model, the two swapped, a model
    transformers loaded as an encoder-decoder (kvbench evaluates decoder-only causal LMs), or ``overrides`` given
    as one string instead of a list of ``key=value`` strings."""
    call = "kvbench.evaluate(model, tokenizer, ...)"
    looks_like_tokenizer = hasattr(model, "get_vocab") and not hasattr(model, "config")
    if model is not None and looks_like_tokenizer and hasattr(tokenizer, "config"):
        raise KVBenchError(f"{call}: the model and the tokenizer are swapped: pass the model first, then the tokenizer")
    if model is None or not hasattr(model, "config") or not callable(model):
        raise KVBenchError(
            f"{call}: model={type(model).__name__} is not a loaded transformers model; pass one, e.g. "
            "AutoModelForCausalLM.from_pretrained(name)"
        )
    if tokenizer is None or not callable(getattr(tokenizer, "encode", None)):
        raise KVBenchError(
            f"{call}: tokenizer={type(tokenizer).__name__} is not a tokenizer; pass the model's, e.g. "
            "AutoTokenizer.from_pretrained(name)"
        )
    if getattr(model.config, "is_encoder_decoder", False):
        raise KVBenchError(
            f"{call}: {type(model).__name__} is an encoder-decoder model ({getattr(model.config, 'model_type', '?')}); "
            "kvbench evaluates decoder-only causal LMs (AutoModelForCausalLM), whose one KV cache it compresses"
        )
    if isinstance(overrides, (str, bytes)) or not all(isinstance(item, str) for item in overrides):
        raise KVBenchError(
            f"{call}: overrides={overrides!r} must be a list of key=value strings, e.g. overrides=[{overrides!r}]"
            if isinstance(overrides, str)
            else f"{call}: overrides={overrides!r} must be a list of key=value strings"
        )


def _user_model_config(preset: DictConfig, model: Any, tokenizer: Any, from_preset: bool) -> DictConfig:
    """``cfg.model`` for a model loaded by the caller: its real dtype and device; the rest from the preset, or from
    the model and tokenizer (see :func:`evaluate`)."""
    from kvbench.models.loading import input_device

    config = model.config
    node = OmegaConf.to_container(preset, resolve=True)
    assert isinstance(node, dict)
    node["dtype"] = str(model.dtype).removeprefix("torch.")
    node["device"] = str(input_device(model))
    node["device_map"] = None
    if not from_preset:
        path = str(getattr(config, "name_or_path", "") or getattr(config, "model_type", "model"))
        node["name"] = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(path).name or path).strip("-.") or "model"
        node["path"] = path
        node["max_input_length"] = int(getattr(config, "max_position_embeddings", None) or 4096)
        node["chat_template"] = getattr(tokenizer, "chat_template", None) is not None
        node["stop_tokens"] = []
        node["revision"] = None
        node["papers"] = []
    return OmegaConf.merge(OmegaConf.structured(ModelConfig), node)


def _apply_overrides(cfg: DictConfig, overrides: Sequence[str]) -> DictConfig:
    """``key=value`` overrides in Hydra's command-line syntax, applied to the composed config (after the model node
    was replaced, so ``model.*`` overrides apply to the caller's model too)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as err:
        raise KVBenchError(f"overrides {list(overrides)}: {str(err).splitlines()[0]}") from err
    for override in parsed:
        key = override.key_or_group
        if key.startswith("method.") and key.count(".") == 1 and key[len("method.") :] in SESSION_KNOBS:
            LOG.warning(session_knob_note(key[len("method.") :]))
            key = f"method.params.{key[len('method.') :]}"  # the spelling before issue #57
        if "." not in key:
            raise KVBenchError(
                f"override {override.input_line!r}: choose presets with evaluate()'s method=, budget=, task= and "
                "model_config= arguments; overrides set keys (group.key=value)"
            )
        try:
            if key.rpartition(".")[0] in ("method.params", "task.options"):  # free-form: the family checks its keys
                with open_dict(cfg):
                    OmegaConf.update(cfg, key, override.value(), merge=True)
            else:
                OmegaConf.update(cfg, key, override.value(), merge=True)
        except OmegaConfBaseException as err:
            raise KVBenchError(_override_error(cfg, override.input_line, key, err)) from err
    return cfg


def _override_error(cfg: DictConfig, line: str, key: str, err: Exception) -> str:
    """The message for an override that cannot be applied: an unknown key (with the CLI's "did you mean"), else
    OmegaConf's reason (a wrongly typed value) with the keys of its group."""
    from kvbench.app.validation import unknown_key_message

    parent, _, leaf = key.rpartition(".")
    while parent and not isinstance(OmegaConf.select(cfg, parent), DictConfig):  # an unknown group: its parent
        parent, _, leaf = parent.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    if isinstance(node, DictConfig) and leaf not in node:
        prefix = f"{parent}." if parent else ""
        return f"override {line!r}: " + unknown_key_message(f"{prefix}{leaf}", leaf, list(node), prefix, added=False)
    valid = f"; the keys of {parent} are: {', '.join(node)}" if isinstance(node, DictConfig) and parent else ""
    return f"override {line!r}: {str(err).splitlines()[0]}{valid}"


def _read_predictions(folder: Path, datasets: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    from kvbench.storage.writers import PREDICTIONS_FILE, PredictionLog

    return {name: PredictionLog(folder / name / PREDICTIONS_FILE).load() for name in datasets}
