"""Download benchmark data for offline compute nodes.

Runs every registered data preparer (``@register_data_preparer`` in ``kvbench/tasks/*``), or only the named
ones, each into ``<out>/<name>/``; afterwards point the task at it, e.g. ``task.data_dir=data/longbench``.

Usage::

    python scripts/prepare_data.py --list
    python scripts/prepare_data.py                      # every benchmark, into data/
    python scripts/prepare_data.py longbench --out /shared/kvbench-data
    python scripts/prepare_data.py longbench --set hub_revision=refs/convert/parquet --set include_e=false
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

# Allow `python scripts/prepare_data.py` from a source checkout without installing the package.
from kvbench.tasks.base import data_preparers


def _parse_value(text: str) -> Any:
    """``true``/``false``/``null``/integers become Python values; anything else stays a string."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("null", "none"):
        return None
    try:
        return int(text)
    except ValueError:
        return text


def parse_options(pairs: list[str]) -> dict[str, Any]:
    """``["key=value", ...]`` -> ``{key: value}``; a pair without ``=`` is an error."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set expects key=value, got {pair!r}")
        options[key] = _parse_value(value)
    return options


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the process exit code."""
    preparers = data_preparers()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help=f"benchmarks to prepare (default: all of {', '.join(preparers)})")
    parser.add_argument("--out", default="data", help="output root; each benchmark goes to <out>/<name>/")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="option for the preparer(s)")
    parser.add_argument("--list", action="store_true", help="list the registered benchmarks and exit")
    args = parser.parse_args(argv)

    if args.list:
        for name in sorted(preparers):
            print(name)
        return 0
    names = args.names or sorted(preparers)
    unknown = [name for name in names if name not in preparers]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; valid: {', '.join(sorted(preparers))}")
    options = parse_options(args.set)
    for name in names:
        target = Path(args.out) / name
        print(f"[prepare_data] {name} -> {target}")
        preparers[name](target, **options)
        print(f"[prepare_data] done: use task.data_dir={target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
