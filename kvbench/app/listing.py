"""``kvbench list methods|tasks|models|budgets|kv_quant``: every preset of a config group with its parameters and
defaults.

Read from the shipped Hydra config tree (:func:`kvbench.resources.conf_dir`: each preset composed with its schema,
so a value the preset leaves out shows the schema default) and from the registries (method families, task kinds):

* methods -- family, the knobs a preset sets (``params``), the paper, the code; then every family's knobs, each
  once with its default and meaning (the session, wrapper and attention-vote knobs in blocks of their own);
* tasks -- kind, the datasets the preset runs (``task.datasets=[...]`` selects a subset), settings and options;
* models -- source (builtin / local / hub), architecture family, ``max_input_length``, dtype, path;
* budgets -- the spec and what it means (:mod:`kvbench.budget`);
* kv_quant -- the quantized KV storage presets: scheme, bits, group size, residual window, axes (docs/kv_quant.md).

An unknown target is a user error (exit status 2) naming the valid ones.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

from kvbench import resources
from kvbench.errors import USER_ERROR_EXIT

USAGE = "usage: kvbench list {methods,tasks,models,budgets,kv_quant}"
#: Budget kinds (:class:`kvbench.budget.Budget`) and what they keep (``{n}``: tokens, ``{r}``: ratio).
BUDGET_SEMANTICS = {
    "full": "no eviction (the full cache)",
    "total_per_layer": "a total of {n} x num_layers tokens per stored head, spread over the layers by the method's "
    "allocator ({n} per layer when uniform)",
    "fixed_per_layer": "exactly {n} tokens per head in every layer (layer allocators bypassed)",
    "ratio": "keep {r} of the context: round({r} x context) x num_layers tokens per stored head in total",
    "compression": "kvpress's compression ratio {r}: max(1, int(context x (1 - {r}))) x num_layers tokens per stored "
    "head in total",
    "threshold": "evict every token scored below {r} (threshold methods only: the kept count is measured, not set)",
}
#: Method fields shown in the header (their schema defaults) and, per preset, where they differ.
_TASK_SKIP = ("name", "kind", "options", "datasets")


def main(argv: Sequence[str]) -> int:
    """Print the listing named by ``argv[0]``; returns the exit status (2 for a missing or unknown target)."""
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        print(__doc__.split("\n\n")[1])
        return 0
    if len(argv) != 1 or argv[0] not in LISTINGS:
        given = f"unknown list target {argv[0]!r}" if argv else "missing list target"
        close = difflib.get_close_matches(argv[0], list(LISTINGS), n=1) if argv else []
        given += f" (did you mean {close[0]!r}?)" if close and argv[0] not in LISTINGS else ""
        extra = f" (one target at a time, got {len(argv)})" if len(argv) > 1 and argv[0] in LISTINGS else ""
        print(f"error: {given}{extra}; valid: {', '.join(LISTINGS)}. {USAGE}", file=sys.stderr)
        return USER_ERROR_EXIT
    text = LISTINGS[argv[0]]()
    try:
        print(text, flush=True)
    except BrokenPipeError:  # `kvbench list methods | head`: the reader left, nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


# ---------------------------------------------------------------------------------------------------- presets
def presets(group: str) -> dict[str, DictConfig]:
    """Every preset of a config group (``method``, ``task``, ``model``, ``budget``), composed with its schema."""
    from hydra import compose, initialize_config_dir

    from kvbench.config import register_configs

    register_configs()
    names = sorted(path.stem for path in (resources.conf_dir() / group).glob("*.yaml"))
    with initialize_config_dir(config_dir=str(resources.conf_dir()), version_base="1.3"):
        return {name: compose(config_name=f"{group}/{name}")[group] for name in names}


#: ``${oc.select:<key>,<default>}``: a value that follows another setting, with a default when that one is unset.
_SELECT = re.compile(r"^\$\{oc\.select:([^,}]+),([^}]*)\}$")
_REFERENCE = re.compile(r"^\$\{([A-Za-z0-9_.]+)\}$")


def _interpolation(value: str) -> str | None:
    """What an interpolated value resolves to in the default run config (``python run.py``) and the setting it
    follows: ``null (follows run.tag; adakv_late where no run.tag exists)``; ``None`` for a plain value."""
    select, reference = _SELECT.match(value), _REFERENCE.match(value)
    if select is None and reference is None:
        return None
    key = (select or reference).group(1).strip()  # type: ignore[union-attr]
    found = OmegaConf.select(_default_root(), key, default=_ABSENT)
    fallback = select.group(2).strip() or "null" if select else None
    resolved = value_text(fallback if found is _ABSENT else found)
    absent = f"; {fallback} where no {key} exists" if fallback is not None else ""
    return f"{resolved} (follows {key}{absent})"


_ABSENT = object()


@functools.lru_cache(maxsize=1)
def _default_root() -> DictConfig:
    """The root config ``python run.py`` composes with no overrides (what interpolations see by default)."""
    from hydra import compose, initialize_config_dir

    from kvbench.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(resources.conf_dir()), version_base="1.3"):
        return compose(config_name="config")


def value_text(value: Any) -> str:
    """A config value as it would be written on the command line (``null``, ``true``, ``[a, b]``); an interpolation
    as its default and the setting it follows (:func:`_interpolation`)."""
    if isinstance(value, str) and value.startswith("${"):
        described = _interpolation(value)
        if described is not None:
            return described
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False).replace('"', "")
    return json.dumps(value) if value is None or isinstance(value, bool) else str(value)


def _pairs(node: dict[str, Any], keys: Sequence[str]) -> str:
    return " ".join(f"{key}={value_text(node[key])}" for key in keys)


def _raw(node: DictConfig) -> dict[str, Any]:
    """The node as plain data, interpolations unresolved (``${oc.select:model.name,null}`` stays as written)."""
    data = OmegaConf.to_container(node, resolve=False)
    assert isinstance(data, dict)
    return data


def rows_named(rows: list[list[str]]) -> set[str]:
    """The first column of a listing's rows."""
    return {row[0] for row in rows}


def _table(rows: list[list[str]]) -> list[str]:
    """Left-aligned columns (the last one unpadded)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    padded = ["  ".join(cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)) for row in rows]
    return [f"  {cells}  {row[-1]}" for cells, row in zip(padded, rows, strict=True)]


# ---------------------------------------------------------------------------------------------------- methods
def _reference_note(reference: dict) -> str:
    """`` [code: repo@commit file]`` of a preset's ``reference:`` block (empty without one)."""
    if not reference or "repo" not in reference:
        return ""
    commit = (str(reference.get("commit") or "").split() or [""])[0]  # a sha, or a version ("0.5.5 (PyPI ...)")
    at = f"@{commit[:12]}" if commit else ""
    return f" [code: {reference['repo']}{at} {reference.get('file', '')}]".replace(" ]", "]")


def list_methods() -> str:
    """Method presets (family, the knobs a preset sets, paper, code), then every family's knobs, each listed once
    with its default and meaning (the knobs several families share, in a block of their own)."""
    from kvbench.eviction.base import METHOD_FAMILIES, load_plugin_methods, method_families
    from kvbench.eviction.plugins import PLUGIN_PACKAGES
    from kvbench.eviction.recipe import ScorerMethod

    method_families()  # imports every method module: the classes register themselves
    broken = load_plugin_methods()  # and every installed package's; one that fails to import is listed as broken
    classes = METHOD_FAMILIES.as_dict()
    rows = [["preset", "family", "stores", "settings (the knobs the preset sets: method.params.<knob>)"]]
    for name, node in presets("method").items():
        data = _raw(node)
        params = data["params"] or {}
        settings = "params: " + _pairs(params, list(params)) if params else ""
        if data["paper"]:
            settings += f" [paper: {data['paper']}]"
        settings += _reference_note(data.get("reference") or {})
        stores = "query heads" if params.get("gqa_granularity") == "query_head" else "KV heads"
        if name in classes and issubclass(classes[name], ScorerMethod):
            settings += " [YAML preset: wins over the class's default]"
        rows.append([name, str(data["family"]), stores, settings.strip() or "(the defaults)"])
    for family, method_class in sorted(classes.items()):
        if family not in rows_named(rows) and (conf_path("method", family) is None):
            reference = f" [code: {method_class.reference}]" if getattr(method_class, "reference", "") else ""
            if family in PLUGIN_PACKAGES:
                reference += " [package: {package} {version}]".format(**PLUGIN_PACKAGES[family])
            rows.append([family, family, "KV heads", f"[class default, no YAML]{reference}".strip()])
    for family, why in sorted(broken.items()):
        rows.append([family, family, "-", f"BROKEN: {why}"])
    return "\n".join(
        [
            "Methods: method=<preset> (conf/method/<preset>.yaml, or a one-class method's default preset); every knob "
            "is method.params.<knob>, e.g. method.params.window=16 (the knobs of each family below).",
            "Memory: a budget keeping r of the context holds r x the full cache when a preset stores KV heads, and "
            "r x H_q/H_kv x the full cache when it stores query heads (the reference code's layout: at GQA 3:1, "
            "r=0.5 holds 1.5x the full cache); method.params.gqa_granularity=kv_head switches to KV heads.  "
            "kvpress's compression ratio c (budget=<c>cr) keeps max(1, int(S (1 - c))) of S tokens per layer and KV "
            "head: about 1 - c of the full cache.",
            *_table(rows),
            *family_knobs(classes),
            f"Registered method families: {', '.join(method_families())}",
            _sharing_note(classes),
        ]
    )


def _sharing_note(method_classes: dict[str, Any]) -> str:
    """Which methods share a sweep's prefill forward: each method class's ``unshared_prefill`` (a one-class method's
    scorer declares it)."""
    alone = {
        family: reason for family, cls in method_classes.items() if (reason := getattr(cls, "unshared_prefill", None))
    }
    listed = "; ".join(f"{family} ({reason})" for family, reason in sorted(alone.items())) or "none"
    return (
        "Sweeps share each sample's prefill forward between jobs that differ only in method and budget "
        "(run.share_prefill; presets storing query heads share among themselves); methods that prefill alone "
        f"(unshared_prefill): {listed}"
    )


def conf_path(group: str, name: str) -> Any:
    """``conf/<group>/<name>.yaml`` when it exists, else ``None``."""
    path = resources.conf_dir() / group / f"{name}.yaml"
    return path if path.is_file() else None


def family_knobs(classes: dict[str, Any]) -> list[str]:
    """Every family's knobs (``method.params.<knob>``), each once with its default and meaning: the blocks several
    families share (session, wrapper, attention-vote knobs) first, then each family's own and the blocks it has."""
    from kvbench.eviction.knobs import SessionKnobs, knob_meanings, shared_fields
    from kvbench.eviction.token_scores import VoteKnobs
    from kvbench.eviction.wrappers import Wrappers

    bundles = {"session knobs": SessionKnobs, "wrapper knobs": Wrappers, "attention-vote knobs": VoteKnobs}
    lines = ["Knobs (method.params.<knob> = default: meaning):"]
    for title, bundle in bundles.items():
        lines.append(f"  {title}:")
        lines += _knob_lines(bundle, list(bundle.__dataclass_fields__), knob_meanings(bundle))
    for family, method_class in sorted(classes.items()):
        declared = set(method_class.field_knobs())
        has, taken = [], set()
        for title, bundle in bundles.items():
            shared = [name for name in shared_fields(method_class, bundle) if name not in taken]
            taken.update(shared)
            present = [name for name in shared if name in declared]
            if present:
                whole = present == list(bundle.__dataclass_fields__)
                has.append(title if whole else f"{title} {', '.join(present)}")
        own = [name for name in method_class.__dataclass_fields__ if name not in taken and name in declared]
        shared_text = "; ".join(has) or "no shared knobs"
        lines.append(f"  knobs of {family}: {shared_text}" + ("" if own else "; no knob of its own"))
        lines += _knob_lines(method_class, own, knob_meanings(method_class))
    return lines


def _knob_lines(method_class: Any, names: list[str], meanings: dict[str, str]) -> list[str]:
    fields = method_class.__dataclass_fields__
    return [f"    {name} = {value_text(fields[name].default)}: {meanings.get(name) or '-'}" for name in names]


# ---------------------------------------------------------------------------------------------------- tasks
def list_tasks() -> str:
    """Task presets: kind, datasets, settings and options."""
    from kvbench.config import TaskConfig
    from kvbench.tasks.base import TASK_KINDS, task_kinds

    defaults = _raw(OmegaConf.structured(TaskConfig))
    lines = [
        "Tasks: task=<preset> (conf/task/<preset>.yaml); task.datasets=[a,b] runs a subset.",
        "Shared settings and their defaults: " + _pairs(defaults, [k for k in defaults if k not in _TASK_SKIP]),
    ]
    for name, node in presets("task").items():
        data = _raw(node)
        selected = data["datasets"]
        kind = TASK_KINDS.as_dict().get(data["kind"])
        if selected is None and kind is not None and kind.dataset_names is not None:
            datasets = kind.dataset_names(data)
        else:
            datasets = selected or []
        changed = [key for key in defaults if key not in _TASK_SKIP and data[key] != defaults[key]]
        lines.append(f"  {name}  (kind {data['kind']})")
        if datasets:
            lines.append(f"    datasets ({len(datasets)}): {', '.join(datasets)}")
        else:
            lines.append("    datasets: chosen by the task's builder")
        if changed:
            lines.append(f"    settings: {_pairs(data, changed)}")
        if data["options"]:
            lines.append(f"    options: {_pairs(data['options'], list(data['options']))}")
    lines.append(f"Registered task kinds: {', '.join(task_kinds())}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------- models
def model_source_and_family(name: str, path: str) -> tuple[str, str]:
    """Where ``model.path`` loads from (builtin / package / local / hub) and the architecture family: a local folder's
    ``config.json`` ``model_type``, else the family in the preset's name (``llama3-8b-instruct`` -> ``llama``)."""
    from kvbench.models.source import BUILTIN_PREFIX, resolve_local_path

    if path.startswith(BUILTIN_PREFIX):
        source = "builtin"
    elif path.startswith("package:"):  # a GGUF file in an installed package (kvbench.models.gguf_cache)
        source = "package"
    else:
        local = resolve_local_path(path)
        if local is not None and (local / "config.json").is_file():
            model_type = json.loads((local / "config.json").read_text(encoding="utf-8")).get("model_type", "?")
            return "local", str(model_type)
        source = "hub"
    stem = name.removeprefix("tiny-random-").removeprefix("random-")
    family = "".join(char for char in stem.split("-")[0] if char.isalpha()) or "?"
    return source, family


def list_models() -> str:
    """Model presets: source, family, maximum input length, dtype, path."""
    rows = [["preset", "source", "family", "max_input_length", "dtype", "path"]]
    for name, node in presets("model").items():
        data = _raw(node)
        source, family = model_source_and_family(name, str(data["path"]))
        rows.append([name, source, family, str(data["max_input_length"]), str(data["dtype"]), str(data["path"])])
    return "\n".join(
        [
            "Models: model=<preset> (conf/model/<preset>.yaml), or model.path=<hub id | local folder | builtin:name | "
            "package:module/file.gguf>.",
            "Hub models load from the local hub cache (download them first on an offline machine).",
            *_table(rows),
        ]
    )


# ---------------------------------------------------------------------------------------------------- budgets
def list_budgets() -> str:
    """Budget presets: spec and meaning; any spec in the accepted forms works as budget=<spec>."""
    from kvbench.budget import ACCEPTED_FORMS, parse_budget

    rows = [["preset", "spec", "meaning"]]
    for name, node in presets("budget").items():
        budget = parse_budget(str(node.spec))
        meaning = BUDGET_SEMANTICS[budget.kind].format(n=int(budget.value), r=f"{budget.value:g}")
        rows.append([name, budget.spec, meaning])
    return "\n".join(
        [
            f"Budgets: budget=<preset> (conf/budget/<preset>.yaml), or budget=<spec>: {ACCEPTED_FORMS}; a bare "
            "integer n means nL. A spec meaning a preset's budget is that preset (budget=0.5x is ratio0.5: same "
            "folder, same hash).",
            "Budgets count tokens per stored head and include the observation window (method.params.window_in_budget).",
            *_table(rows),
        ]
    )


# ---------------------------------------------------------------------------------------------------- kv_quant
def list_kv_quant() -> str:
    """Quantized KV storage presets: scheme, bits (keys/values), group size, residual window, axes."""
    rows = [["preset", "scheme", "bits K/V", "group", "residual", "axes K/V"]]
    for name, node in presets("kv_quant").items():
        if node.scheme == "none":
            rows.append([name, "none", "model dtype", "-", "-", "-"])
            continue
        values = node.nbits if node.value_nbits is None else node.value_nbits
        axes = "channel/token" if node.scheme == "kivi" else f"{node.axis_key}/{node.axis_value}"
        rows.append(
            [name, node.scheme, f"{node.nbits}/{values}", str(node.group_size), str(node.residual_length), axes]
        )
    return "\n".join(
        [
            "Quantized KV storage: kv_quant=<preset> (conf/kv_quant/<preset>.yaml), composed with any method and "
            "budget; results go to <budget>+<preset> and stored bytes count the packed codes, scales and zero "
            "points and the full-precision residual (docs/kv_quant.md).",
            *_table(rows),
        ]
    )


#: ``kvbench list <target>``: the function that formats each listing.
LISTINGS: dict[str, Callable[[], str]] = {
    "methods": list_methods,
    "tasks": list_tasks,
    "models": list_models,
    "budgets": list_budgets,
    "kv_quant": list_kv_quant,
}
