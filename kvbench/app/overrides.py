"""Command-line overrides as Hydra composes them (:func:`prepare_overrides`), for ``run.py``/``kvbench``, the API's
:func:`kvbench.api.compose_config` and the sweep composer alike, so that a choice Hydra has no file for still composes:

* any budget spec (``budget=80L``, ``budget=0.3x``, ``budget=512``) becomes its
  :func:`kvbench.config.budget_choice`, registered in Hydra's ConfigStore when no ``conf/budget`` YAML exists;
* ``method=<family>`` of a method defined by a class alone (:mod:`kvbench.eviction.recipe`) gets the class's default
  preset (:func:`register_method_choice`), unless ``conf/method/<family>.yaml`` exists (that YAML wins);
* a bare number given to any config group becomes a string (Hydra refuses an integer as a group choice);
* ``method.<knob>=<value>`` of a session knob (``method.window=16``, their spelling before issue #57) becomes
  ``method.params.<knob>=<value>`` with a one-line note;
* ``method.params.<knob>=<value>`` sets the knob whether or not the preset lists it (it becomes
  ``++method.params.<knob>=<value>``): every knob the method's class declares can be set on every preset of its
  family, and a knob it does not declare is an error listing the method's own knobs
  (:func:`kvbench.eviction.family.check_declared_params`, before any model loads).

Nothing here imports torch unless a class-only method is asked for (its module is imported to read its fields), be
it kvbench's (``kvbench/methods/<family>.py``) or another package's (entry-point group ``kvbench.methods``).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import logging
import re
from collections.abc import Sequence
from pathlib import Path

from hydra.core.config_store import ConfigStore

from kvbench.config import (
    SESSION_KNOBS,
    WRAPPER_LABEL_PARTS,
    budget_choice,
    method_label_interpolation,
    register_budget_choice,
    register_configs,
    session_knob_note,
)
from kvbench.errors import KVBenchError
from kvbench.eviction.plugins import load_plugin, method_entry_points
from kvbench.resources import conf_dir

LOG = logging.getLogger(__name__)


def class_method_module(name: str) -> str | None:
    """The module defining the class-only method ``name``, found without importing it: ``kvbench.methods.<name>``
    (such a module is named after its family); ``None`` when there is none."""
    if not name.isidentifier():
        return None
    module = f"kvbench.methods.{name}"
    try:
        return module if importlib.util.find_spec(module) is not None else None
    except (ImportError, ValueError):
        return None


#: ``class X(ScorerMethod, family="x", ...)`` in a method module's source.
_CLASS_FAMILY = re.compile(r'^class \w+\([^)]*\bfamily="(\w+)"', re.MULTILINE)


def class_method_names() -> list[str]:
    """Every ``method=<family>`` a class alone defines (``kvbench/methods/*.py``, read as text: nothing imported)
    or another package adds (entry-point group ``kvbench.methods``), for error messages and listings."""
    spec = importlib.util.find_spec("kvbench.methods")  # the package's folder, wherever this module lives
    methods_dir = Path(next(iter(spec.submodule_search_locations or ()))) if spec else Path()
    found = {name for path in methods_dir.glob("*.py") for name in _CLASS_FAMILY.findall(path.read_text("utf-8"))}
    return sorted(found | set(method_entry_points()))


def register_method_choice(name: str) -> bool:
    """Register ``method/<name>`` in Hydra's ConfigStore: the default preset of a class-only method (``name`` and
    ``family`` = ``name``, ``params`` = the class's fields at their defaults, ``reference`` = the class's), unless
    ``conf/method/<name>.yaml`` exists (that YAML is the preset that wins).  Whether a node was registered."""
    if (conf_dir() / "method" / f"{name}.yaml").is_file():
        return False
    module = class_method_module(name)
    if module is not None:
        importlib.import_module(module)
    elif name in method_entry_points():  # a method of another package (kvbench.eviction.plugins)
        try:
            load_plugin(name)
        except ValueError as err:
            raise KVBenchError(str(err)) from None
    elif not defined_in_process(name):  # no such method: Hydra reports the unknown preset (torch never imported)
        return False
    from kvbench.eviction.base import METHOD_FAMILIES

    method_class = METHOD_FAMILIES.registered(name)
    if method_class is None:
        return False
    register_configs()  # the label resolver
    ConfigStore.instance().store(group="method", name=name, node=default_preset(method_class))
    return True


def defined_in_process(name: str) -> bool:
    """Whether a method class of family ``name`` was defined in this process (a user's script or notebook), its
    module already imported: such a class composes by name like kvbench's own (nothing imported here)."""
    import sys

    if "kvbench.eviction.base" not in sys.modules:
        return False
    from kvbench.eviction.base import METHOD_FAMILIES

    return METHOD_FAMILIES.registered(name) is not None


def default_preset(method_class: type) -> dict:
    """The preset of a class-only method: its family, its fields at their defaults, its reference (with the
    providing package and version for another package's method, so that they enter the config hash)."""
    from kvbench.eviction.plugins import PLUGIN_PACKAGES

    family = method_class.family
    knobs = method_class.field_knobs()
    defaults = {field.name: field.default for field in dataclasses.fields(method_class)}
    params = {name: defaults[name] for name in knobs}
    # The name (results folder) names the wrappers that are on: knorm, knorm+ada, knorm+ada+pyramid, knorm+chunkkv,
    # knorm+decode4, knorm+decode4+target8, knorm+decode4+ratio0.5 (a default preset's name is unchanged: every
    # wrapper off).
    label = method_label_interpolation(family)
    node = {"defaults": ["/schema/method/method@_here_", "_self_"], "name": label, "family": family, "params": params}
    reference = {"code": method_class.reference} if method_class.reference else {}
    reference.update(PLUGIN_PACKAGES.get(family, {}))
    if reference:
        node["reference"] = reference
    return node


def session_knob_of(key: str) -> str | None:
    """The session knob ``key`` spells as before issue #57 (``method.window`` -> ``window``), else ``None``."""
    parts = key.split(".")
    return parts[1] if len(parts) == 2 and parts[0] == "method" and parts[1] in SESSION_KNOBS else None


def is_method_knob(key: str) -> bool:
    """Whether ``key`` is a method knob, ``method.params.<knob>`` (one level: a knob's own keys are not)."""
    parts = key.split(".")
    return len(parts) == 3 and parts[:2] == ["method", "params"] and parts[2].isidentifier()


def prepare_overrides(overrides: Sequence[str]) -> list[str]:
    """Command-line overrides as Hydra composes them, for every config group: a bare number given to a group
    (``budget=512``, where Hydra refuses an integer) becomes a string, and every ``budget=`` value, sweeps
    included (``-m budget=64L,80L``), becomes its :func:`budget_choice`, registered when it has no YAML; a
    ``method=`` value naming a class-only method gets its default preset (:func:`register_method_choice`); a
    ``method.params.<knob>=`` override sets the knob even where the preset does not list it (``++``).  Other
    arguments (Hydra's flags, other overrides) are returned unchanged; one Hydra cannot parse is left for Hydra to
    report."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType, ValueType
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    groups = {path.name for path in conf_dir().iterdir() if path.is_dir()}
    prepared = []
    wrapper_knobs: list[str] = []  # the method.params.<knob> overrides (the wrappers among them name the folder)
    method_choices: list[str] | None = None
    named = False  # method.name given: the folder is the user's to name
    for line in overrides:
        try:  # Hydra's flags (-m, --cfg job) and what Hydra cannot parse pass through as they are
            override = parser.parse_override(line) if "=" in line and not line.startswith("-") else None
        except HydraException:
            override = None
        if override is None:
            prepared.append(line)
            continue
        legacy = session_knob_of(override.key_or_group)
        if legacy is not None and override.type in (OverrideType.CHANGE, OverrideType.ADD, OverrideType.FORCE_ADD):
            LOG.warning(session_knob_note(legacy))
            line = f"method.params.{legacy}={line.split('=', 1)[1]}"
            override = parser.parse_override(line)
        if is_method_knob(override.key_or_group) and override.type == OverrideType.CHANGE:
            prepared.append(f"++{line}")  # a knob the preset does not list (the family checks it is declared)
            wrapper_knobs.append(override.key_or_group.split(".")[2])
            continue
        if override.key_or_group == "method.name":
            named = True
        simple = override.value_type in (
            ValueType.ELEMENT,
            ValueType.SIMPLE_CHOICE_SWEEP,
            ValueType.CHOICE_SWEEP,
            ValueType.RANGE_SWEEP,
        )
        if override.key_or_group not in groups or override.is_delete() or not simple:
            prepared.append(line)
            continue
        values = list(override.sweep_string_iterator()) if override.is_sweep_override() else [override.value()]
        if not all(isinstance(value, (str, int, float)) and not isinstance(value, bool) for value in values):
            prepared.append(line)
            continue
        choices = [str(value) for value in values]
        if override.key_or_group == "budget":
            choices = [budget_choice(choice) or choice for choice in choices]
            for choice in choices:
                if budget_choice(choice) == choice:
                    register_budget_choice(choice)
        if override.key_or_group == "method":
            method_choices = choices
            for choice in choices:
                register_method_choice(choice)
        if choices == values:  # strings Hydra already reads as they are
            prepared.append(line)
            continue
        key = line.split("=", 1)[0]
        prepared.append(f"{key}={','.join(repr(choice) for choice in choices)}")
    if method_choices is None:
        method_choices = experiment_methods(overrides)
    return prepared + ([] if named else wrapper_label_override(method_choices, wrapper_knobs))


def experiment_methods(overrides: Sequence[str]) -> list[str] | None:
    """The method presets an experiment given on the command line (``+experiment=<name>``) sweeps
    (``hydra.sweeper.params.method``, read in a sweep: ``-m``); ``None`` when it names none (or no experiment is
    given, or this is no sweep)."""
    from omegaconf import OmegaConf

    if not any(arg in ("-m", "--multirun") or arg.replace(" ", "") == "hydra.mode=MULTIRUN" for arg in overrides):
        return None
    for line in overrides:
        key, _, name = line.partition("=")
        path = conf_dir() / "experiment" / f"{name}.yaml"
        if key.lstrip("+") == "experiment" and path.is_file():
            swept = OmegaConf.select(OmegaConf.load(path), "hydra.sweeper.params.method", default=None)
            return [choice.strip() for choice in str(swept).split(",")] if swept else None
    return None


def wrapper_label_override(method_choices: Sequence[str] | None, knobs: Sequence[str]) -> list[str]:
    """The ``method.name`` override that names the wrappers set on a YAML preset (``method=snapkv_kvpress
    method.params.allocation=ada_kvpress`` runs in ``snapkv_kvpress+ada_kvpress/``, as a class-only method's default
    preset names its own: ``knorm+ada``); none when no wrapper knob is set or the preset is class-only.  A sweep over
    several presets with a wrapper knob is refused (each preset would need its own name)."""
    wrappers = [knob for knob in knobs if knob in WRAPPER_LABEL_PARTS]
    if not wrappers:
        return []
    from omegaconf import OmegaConf

    from kvbench.eviction.wrappers import declares_wrappers

    choices = list(method_choices) if method_choices is not None else [default_method()]
    preset_files = [conf_dir() / "method" / f"{choice}.yaml" for choice in choices]
    presets = [
        path.stem
        for path in preset_files
        if path.is_file() and declares_wrappers(str(OmegaConf.load(path).get("family", "")))
    ]
    if not presets:
        return []  # class-only methods (their default preset's name is the label already), or no wrappers (CAKE)
    if len(choices) > 1:
        raise KVBenchError(
            f"method={','.join(choices)} with method.params.{wrappers[0]}: a sweep over presets cannot name each "
            "preset's wrappers in its results folder; run one method per command (or set method.name)"
        )
    return [f"++method.name='{method_label_interpolation(presets[0], wrappers)}'"]


def default_method() -> str:
    """The method preset ``conf/config.yaml`` composes when no ``method=`` is given."""
    from omegaconf import OmegaConf

    defaults = OmegaConf.load(conf_dir() / "config.yaml").get("defaults", [])
    return next((str(entry["method"]) for entry in defaults if isinstance(entry, dict) and "method" in entry), "")
