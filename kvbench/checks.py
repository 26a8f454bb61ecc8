"""The checks every user-facing setting goes through, written once, with one message style.

Each check names the key, the value and what is valid, e.g. ``method.params.gqa_agg='median' is not valid; valid: mean,
max, sum (e.g. params.gqa_agg=mean).``  ``error`` picks the exception class: :class:`ValueError` where library code is
called directly, :class:`kvbench.errors.KVBenchError` in :mod:`kvbench.app.validation` (printed without a traceback).
The choice tuples themselves live beside the settings they constrain (:mod:`kvbench.config` for the common knobs,
each method family's module for its parameters).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def check_choice(key: str, value: T, choices: Sequence[Any], also: str = "", error: type[Exception] = ValueError) -> T:
    """``value`` if it is one of ``choices``; else raise ``error`` naming ``key``, the value and the choices.

    ``also`` adds to the list of valid values (e.g. ``"or null for the family's reference"``)."""
    if value not in choices:
        extra = f", {also}" if also else ""
        raise error(
            f"{key}={value!r} is not valid; valid: {', '.join(map(str, choices))}{extra} (e.g. {key}={choices[0]})."
        )
    return value


def check_min(key: str, value: Any, minimum: int, meaning: str = "", error: type[Exception] = ValueError) -> int:
    """``value`` if it is an integer (not a bool) ``>= minimum``; else raise ``error`` (``meaning`` explains it)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        note = f" ({meaning})" if meaning else ""
        raise error(f"{key}={value!r} is not valid: it must be an integer >= {minimum}{note}.")
    return value


def check_range(
    key: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    error: type[Exception] = ValueError,
) -> Any:
    """``value`` if it is a finite number in ``[low, high]`` (``(low, high]`` with ``low_open``; a ``None`` bound is
    unbounded); else raise ``error`` naming the interval.  NaN and the infinities are refused whatever the bounds
    (``nan`` compares false with every bound, and ``1e400`` reads as ``inf``)."""
    check_finite(key, value, error)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    too_low = low is not None and number and (value <= low if low_open else value < low)
    too_high = high is not None and number and value > high
    if not number or too_low or too_high:
        lower = ("(" if low_open else "[") + ("-inf" if low is None else f"{low:g}")
        upper = "inf)" if high is None else f"{high:g}]"
        raise error(f"{key}={value!r} is not valid: it must be a number in {lower}, {upper}.")
    return value


def check_finite(key: str, value: Any, error: type[Exception] = ValueError) -> Any:
    """``value`` unless it is a float NaN or infinity (``nan``, ``inf``, ``-inf``, or ``1e400``, which reads as
    ``inf``); else raise ``error`` naming ``key`` and the value.  Anything that is not a float passes (its type is
    another check's business)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise error(
            f"{key}={value!r} is not valid: it must be a finite number (NaN and infinities are refused; a number "
            f"written beyond float range such as 1e400 reads as inf). Give a finite value, e.g. {key}=0.5."
        )
    return value


def check_known_keys(
    given: Iterable[str], valid: Iterable[str], where: str, owner: str = "", error: type[Exception] = ValueError
) -> None:
    """Raise ``error`` when ``given`` holds a key that is not in ``valid``, naming the unknown and the valid keys.

    ``where`` is the config node (``method.params``, ``task.options``), ``owner`` what it belongs to (``family
    'cake'``, ``task 'ruler'``)."""
    known = sorted(valid)
    unknown = sorted(set(given) - set(known))
    if unknown:
        of = f" for {owner}" if owner else ""
        raise error(f"unknown {where} key(s) {unknown}{of}; valid keys: {', '.join(known) or 'none'}")


def json_error_text(err: Any) -> str:
    """A :class:`json.JSONDecodeError` in words: ``invalid control character (a raw tab, newline or other character
    below U+0020 inside a string; JSON needs it escaped, e.g. \\t) at column 243``."""
    msg = str(err.msg).removesuffix(" at").rstrip(":")
    if msg.lower().startswith("invalid control character"):
        msg = (
            "invalid control character (a raw tab, newline or other character below U+0020 inside a string; JSON "
            "needs it escaped, e.g. \\t or \\n)"
        )
    return f"{msg} at column {err.colno}"


#: ``run.decode_batch='auto'``: as many samples per decoding step as fit the device
#: (:mod:`kvbench.inference.batched_decode`).
DECODE_BATCH_AUTO = "auto"


def check_decode_batch(value: Any, key: str = "run.decode_batch", error: type[Exception] = ValueError) -> int | str:
    """``value`` as a decode batch setting: an integer ``>= 1`` (also written as a string of digits) or ``"auto"``;
    else raise ``error`` naming ``key``, the value and the valid choices."""
    if isinstance(value, str) and value.strip().lower() == DECODE_BATCH_AUTO:
        return DECODE_BATCH_AUTO
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise error(
            f"{key}={value!r} is not valid; valid: an integer >= 1 (1 = one sample at a time, the default) or "
            f"auto (CUDA: as many as fit the free memory; CPU: 1) (e.g. {key}=8)."
        )
    return value
