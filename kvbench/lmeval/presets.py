"""``--model_args`` of the lm-eval bridge -> kvbench configs: a model, a method and a budget.

Each of ``pretrained``, ``method`` and ``budget`` is first read as a kvbench preset (``conf/model/<name>.yaml``,
``conf/method/<name>.yaml``, ``conf/budget/<name>.yaml``, merged into its typed schema as Hydra would), else as a
value: ``pretrained`` as a ``model.path`` (a local Hugging Face folder, a hub id, or ``builtin:<name>``), ``budget``
as a budget string (``0.2x``, ``128L``, ``64/layer``, ``0.25cr``, ``full``).  ``method`` must be a preset or a
method a class alone defines (``knorm``, ``keydiff``, ...: its default preset, as ``run.py method=<name>``).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from kvbench.budget import BudgetError, parse_budget
from kvbench.config import BudgetConfig, MethodConfig, ModelConfig
from kvbench.errors import KVBenchError
from kvbench.resources import conf_dir


def preset_names(group: str) -> list[str]:
    """Names of the presets of one config group (``model``, ``method``, ``budget``)."""
    return sorted(path.stem for path in (conf_dir() / group).glob("*.yaml"))


def load_preset(group: str, name: str, schema: type) -> DictConfig | None:
    """``conf/<group>/<name>.yaml`` merged into ``schema`` (its ``defaults`` list dropped), or ``None`` if absent."""
    path = conf_dir() / group / f"{name}.yaml"
    if "/" in name or not path.is_file():
        return None
    raw = OmegaConf.load(path)
    raw.pop("defaults", None)
    return OmegaConf.merge(OmegaConf.structured(schema), raw)


def model_config(pretrained: str, **overrides: Any) -> DictConfig:
    """A :class:`~kvbench.config.ModelConfig` for ``pretrained`` (a model preset name or a ``model.path``);
    ``overrides`` (``dtype``, ``device``, ``revision``, ...; ``None`` values ignored) replace the preset's keys."""
    cfg = load_preset("model", pretrained, ModelConfig)
    if cfg is None:
        name = Path(pretrained.removeprefix("builtin:").rstrip("/")).name or "model"
        cfg = OmegaConf.merge(
            OmegaConf.structured(ModelConfig),
            {"name": name, "path": pretrained, "dtype": "float32", "chat_template": False, "device": "auto"},
        )
    for key, value in overrides.items():
        if value is not None:
            cfg[key] = value
    return cfg


def method_config(method: str, **overrides: Any) -> DictConfig:
    """The :class:`~kvbench.config.MethodConfig` of preset ``method``; ``overrides`` replace its keys."""
    cfg = load_preset("method", method, MethodConfig)
    if cfg is None:
        cfg = class_method_preset(method)
    if cfg is None:
        from kvbench.app.overrides import class_method_names

        names = sorted({*preset_names("method"), *class_method_names()})
        close = difflib.get_close_matches(method, names, n=1, cutoff=0.6)
        hint = f" Did you mean method={close[0]}?" if close else ""
        raise KVBenchError(
            f"unknown method {method!r} (there is no conf/method/{method}.yaml); valid: {', '.join(names)}.{hint}"
        )
    for key, value in overrides.items():
        cfg[key] = value
    return cfg


def class_method_preset(method: str) -> DictConfig | None:
    """The default preset of a method a class alone defines (``kvbench/methods/<family>.py`` or another package's,
    no YAML), as ``run.py method=<method>`` composes it, merged into the schema; ``None`` when there is none."""
    from hydra.core.config_store import ConfigStore

    from kvbench.app.overrides import register_method_choice

    if not method.isidentifier() or not register_method_choice(method):
        return None
    node = OmegaConf.create(ConfigStore.instance().load(f"method/{method}.yaml").node)
    node.pop("defaults", None)
    return OmegaConf.merge(OmegaConf.structured(MethodConfig), node)


def budget_config(budget: str) -> DictConfig:
    """The :class:`~kvbench.config.BudgetConfig` of preset ``budget`` or of a budget string (named after it)."""
    cfg = load_preset("budget", budget, BudgetConfig)
    if cfg is None:
        cfg = OmegaConf.merge(OmegaConf.structured(BudgetConfig), {"name": budget, "spec": budget})
    try:
        parse_budget(str(cfg.spec))
    except BudgetError as err:
        raise KVBenchError(
            f"budget={budget!r}: {err}. Pick a preset ({', '.join(preset_names('budget'))}) or one of the accepted "
            "forms."
        ) from err
    return cfg
