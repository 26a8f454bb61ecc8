"""Hydra's and OmegaConf's composition errors as one paragraph naming the bad key or value, the valid choices and
the fix (:func:`hydra_error_message`), shared by the CLI (:mod:`kvbench.app.cli`) and the API
(:func:`kvbench.api.compose_config`) from below both.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Sequence
from typing import Any

from kvbench.app.validation import unknown_key_message
from kvbench.config import SESSION_KNOBS

OVERRIDE_GRAMMAR_URL = "https://hydra.cc/docs/advanced/override_grammar/basic/"


def one_paragraph(text: str) -> str:
    """``text`` with its lines joined by spaces (messages are one paragraph)."""
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


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
        if group.startswith("budget/"):  # a per-layer spec (budget=0/layer): Hydra reads its "/" as a sub-group
            group, name = "budget", err.missing_cfg_file.removeprefix("budget/")
        options = list(err.options)
        if group == "method":  # the methods a class alone defines have no YAML: Hydra does not list them
            from kvbench.app.overrides import class_method_names

            options = sorted({*options, *class_method_names()})
        close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
        hint = f" Did you mean {group}={close[0]}?" if close else ""
        if group == "budget":
            hint += _budget_hint(name)
        return (
            f"unknown {group} {name!r} (there is no conf/{err.missing_cfg_file}.yaml); valid: "
            f"{', '.join(options)}.{hint}"
        )
    unknown_key = isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and getattr(cause, "full_key", None)
    if unknown_key and _is_schema(cause.object_type):
        full_key, key = str(cause.full_key), str(cause.key)
        prefix = full_key[: len(full_key) - len(key)]
        valid = [field.name for field in dataclasses.fields(cause.object_type)]
        return unknown_key_message(full_key, key, valid, prefix, added=False) + _own_parameters(cause, key, prefix)
    if unknown_key and str(cause.full_key).startswith("method.params.") and cause.parent_node is not None:
        # A parameter the preset does not have: its own parameters, not the schema's keys.
        listed = [str(key) for key in cause.parent_node]  # the family's own knobs first, then the session knobs
        valid = [key for key in listed if key not in SESSION_KNOBS] + [key for key in listed if key in SESSION_KNOBS]
        close = difflib.get_close_matches(str(cause.key), valid, n=1, cutoff=0.6)
        hint = f" Did you mean method.params.{close[0]}?" if close else ""
        return (
            f"{cause.full_key} is not a parameter of this method preset; its parameters are: "
            f"{', '.join(valid) or 'none'}.{hint} (`kvbench list methods` shows each preset's parameters.)"
        )
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


def _own_parameters(cause: Any, key: str, prefix: str) -> str:
    """For a misspelt ``method.<key>``: the composed method's own parameters (``method.params.*``), and the one the
    key is closest to."""
    node = cause.parent_node
    if prefix != "method." or node is None or "params" not in node:
        return ""
    params = [str(name) for name in node["params"]]
    close = difflib.get_close_matches(key, params, n=1, cutoff=0.6)
    hint = f" Did you mean method.params.{close[0]}?" if close else ""
    return f" The parameters of method={node.get('name')} (method.params.<key>): {', '.join(params) or 'none'}.{hint}"


def _budget_hint(name: str) -> str:
    """Why ``budget=<name>`` is neither a preset nor a budget spec, and the forms a spec takes."""
    from kvbench.budget import ACCEPTED_FORMS, BudgetError, parse_budget

    try:
        parse_budget(name)
        why = ""
    except BudgetError as err:
        why = f" {err}." if any(char.isdigit() for char in name) else ""
    return f"{why} Any budget spec also works as budget=<spec> ({ACCEPTED_FORMS}; a bare integer n means nL)."


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
