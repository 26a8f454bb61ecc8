"""Method-family parameters (``method.params``) as typed dataclasses, validated in one place.

A family declares its parameters as a dataclass; a field restricted to a set of values is declared with
:func:`choice`, a number restricted to an interval with :func:`bounded`.  :func:`parse_params` is the one
validation: unknown keys, then each given value's type (from the annotation: ``bool``, ``int``, ``float``, ``str``,
``X | None``), then its choices or interval, each error naming the key, the value and what is valid::

    @dataclass
    class PyramidKVParams:
        beta: int = bounded(20, low=1)
        schedule: str = choice("kvcache_factory", PYRAMID_SCHEDULES)

Constraints that tie several fields together stay in the family's class (e.g. NACL's ratios must not all be 0).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Sequence
from typing import Any, TypeVar

from kvbench.checks import check_choice, check_finite, check_known_keys, check_range

ParamsT = TypeVar("ParamsT")

_TYPE_NAMES = {bool: "a boolean (true / false)", int: "an integer", float: "a number", str: "a string"}


def choice(default: str, choices: Sequence[str]) -> Any:
    """A dataclass field whose value must be one of ``choices`` (checked by :func:`parse_params`)."""
    return dataclasses.field(default=default, metadata={"choices": tuple(choices)})


def bounded(
    default: float | int | None,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    odd: bool = False,
) -> Any:
    """A dataclass field whose number must lie in ``[low, high]`` (``(low, high]`` with ``low_open``; a ``None``
    bound is open-ended), odd when ``odd``; ``None`` passes when the annotation allows it."""
    return dataclasses.field(default=default, metadata={"range": (low, high, low_open), "odd": odd})


def parse_params(params_cls: type[ParamsT], params: Any, family: str) -> ParamsT:
    """Build a family's parameter dataclass from ``method.params`` (a mapping or ``None``), validating every given
    value: unknown keys, type, choices and interval (see the module docstring)."""
    given = dict(params or {})
    fields = {f.name: f for f in dataclasses.fields(params_cls)}  # type: ignore[arg-type]
    check_known_keys(given, fields, "method.params", f"family {family!r}")
    hints = typing.get_type_hints(params_cls)
    for name, value in given.items():
        key = f"method.params.{name}"
        allowed = _allowed_types(hints[name])
        if not _has_type(value, allowed):
            names = [_TYPE_NAMES.get(t, getattr(t, "__name__", str(t))) for t in allowed if t is not type(None)]
            also = " or null" if type(None) in allowed else ""
            raise ValueError(f"{key}={value!r} is not valid: it must be {' or '.join(names)}{also}.")
        if value is None:
            continue
        check_finite(key, value)  # every float knob, bounded or not: NaN passes any comparison with a bound
        metadata = fields[name].metadata
        if "choices" in metadata:
            check_choice(key, value, metadata["choices"])
        if "range" in metadata:
            low, high, low_open = metadata["range"]
            check_range(key, value, low, high, low_open=low_open)
            if metadata["odd"] and value % 2 == 0:
                raise ValueError(f"{key}={value!r} is not valid: it must be odd.")
    return params_cls(**given)


def _allowed_types(hint: Any) -> tuple[Any, ...]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def _has_type(value: Any, allowed: tuple[Any, ...]) -> bool:
    """Whether ``value`` is one of the ``allowed`` types (an int passes as a float, a bool never as a number)."""
    for kind in allowed:
        if kind is Any or kind not in (*_TYPE_NAMES, type(None)):
            return True
        if kind is type(None) and value is None:
            return True
        if kind is bool and isinstance(value, bool):
            return True
        if kind is int and isinstance(value, int) and not isinstance(value, bool):
            return True
        if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
        if kind is str and isinstance(value, str):
            return True
    return False
