"""Record or check the config hash of every method preset x every named budget, plus knob variants (issue #41).

A refactor that changes the shape of the composed config must keep every existing run's hash (results folders
resume by it; docs/results.md).  Record the hashes at a commit before the change, check them after::

    PYTHONPATH=$PWD python scripts/config_hashes.py record /tmp/hashes_before.json   # at the old commit
    PYTHONPATH=$PWD python scripts/config_hashes.py check /tmp/hashes_before.json    # after the change

A knob variant names a method knob as ``knob:<key>=<value>``: spelled ``method.<key>=<value>`` where the method
schema (:class:`kvbench.config.MethodConfig`) has the key, else ``method.params.<key>=<value>`` (the family's
declared knob), so one list serves both layouts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

#: (method, knob overrides) checked at every budget besides the presets' defaults.
VARIANTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("snapkv", ("knob:kernel_size=5",)),
    ("snapkv", ("knob:pooling=avg", "knob:pool_padding=exclude")),
    ("snapkv", ("knob:gqa_reduce=after_pool",)),
    ("snapkv", ("knob:score_dtype=float32",)),
    ("snapkv", ("method.window=16", "method.gqa_granularity=kv_head")),
    ("pyramidkv", ("knob:score_dtype=float32", "method.params.beta=10")),
    ("ada_snapkv", ("knob:gqa_reduce=after_pool",)),
    ("ada_pyramidkv", ("knob:score_dtype=float32",)),
    ("cake", ("knob:score_dtype=float32",)),
    ("cake", ("knob:kernel_size=7", "knob:pooling=max")),
    ("h2o", ("knob:kernel_size=3", "knob:pooling=avg")),
    ("h2o", ("knob:score_dtype=float32",)),
    ("tova", ("knob:score_dtype=float32",)),
    ("ahakv", ("knob:score_dtype=float32",)),
    ("xkv", ("knob:pooling=max",)),
    ("streamingllm", ("method.sink_tokens=8",)),
    ("knorm", ("method.params.allocation=ada",)),
    # kvpress's composed presses and decoding presses (issue #54)
    ("snapkv_kvpress", ("method.params.selection=chunkkv",)),
    ("snapkv_kvpress", ("method.params.selection=chunkkv", "method.params.selection_length=8")),
    ("snapkv_kvpress", ("method.params.selection=block",)),
    ("snapkv_kvpress", ("method.params.rescale=critical",)),
    ("snapkv_kvpress", ("method.params.rescale=critical", "method.params.row_reduce=mean")),
    ("snapkv_kvpress", ("method.params.allocation=ada_kvpress",)),
    ("snapkv_kvpress", ("method.params.allocation=ada_kvpress", "method.params.rescale=critical")),
    ("snapkv_kvpress", ("method.params.decode_interval=4",)),
    ("snapkv", ("method.params.selection=chunkkv",)),
    ("knorm", ("method.params.selection=chunkkv",)),
    ("knorm", ("method.params.selection=chunk",)),
    ("knorm", ("method.params.selection=block",)),
    ("knorm", ("method.params.rescale=critical",)),
    ("knorm", ("method.params.decode_interval=4",)),
    ("knorm", ("method.params.decode_interval=4", "method.params.decode_ratio=0.5")),
    ("expected_attention_kvpress", ("method.params.decode_interval=8",)),
    ("kvzip", ("method.params.layerwise=true",)),
)


def spell(override: str) -> str:
    """``knob:<key>=<value>`` as the current layout spells it (module docstring)."""
    from kvbench.config import MethodConfig

    if not override.startswith("knob:"):
        return override
    key, value = override[len("knob:") :].split("=", 1)
    schema = {field.name for field in dataclasses.fields(MethodConfig)}
    return f"method.{key}={value}" if key in schema else f"method.params.{key}={value}"


def configs() -> list[tuple[str, str, tuple[str, ...]]]:
    """(method, budget, overrides) for every preset (YAML or class-only) x named budget, then every variant."""
    from kvbench.app.overrides import class_method_names
    from kvbench.resources import conf_dir

    methods = sorted({path.stem for path in (conf_dir() / "method").glob("*.yaml")} | set(class_method_names()))
    budgets = sorted(path.stem for path in (conf_dir() / "budget").glob("*.yaml"))
    plain = [(method, budget, ()) for method in methods for budget in budgets]
    return plain + [(method, budget, knobs) for method, knobs in VARIANTS for budget in budgets]


def hashes() -> dict[str, str]:
    """``"method budget overrides" -> config hash`` of every :func:`configs` entry."""
    from kvbench.api import compose_config
    from kvbench.storage.writers import config_hash

    found = {}
    for method, budget, overrides in configs():
        cfg = compose_config(method, budget, overrides=[spell(override) for override in overrides])
        found[" ".join((method, budget, *overrides))] = config_hash(cfg)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("record", "check"))
    parser.add_argument("path", type=Path)
    args = parser.parse_args(argv)
    found = hashes()
    if args.mode == "record":
        args.path.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        print(f"recorded {len(found)} config hashes in {args.path}")
        return 0
    recorded = json.loads(args.path.read_text(encoding="utf-8"))
    changed = [key for key in recorded if found.get(key) != recorded[key]]
    for key in changed:
        print(f"CHANGED {key}: {recorded[key]} -> {found.get(key)}")
    print(f"{len(recorded) - len(changed)}/{len(recorded)} config hashes unchanged")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
