"""NaN and the infinities are refused by every float knob and bound (issue #55 item 6): ``nan`` compares false with
every bound, so a range check alone let it through, and the run scored 0 without a word."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbench.checks import check_range
from kvbench.eviction.family import family_class
from kvbench.eviction.params import parse_params
from tests.faults.conftest import assert_one_line_error, run_job_status


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400"])
def test_a_float_knob_refuses_nan_and_infinities_naming_the_knob(tmp_path: Path, capsys, value: str) -> None:
    code, stderr = run_job_status(tmp_path / "runs", capsys, "method=cake", f"method.params.gamma={value}")
    assert_one_line_error(code, stderr, "method.params.gamma", "finite number")
    assert not (tmp_path / "runs").exists()  # refused before anything was written


def test_range_checks_refuse_nan_inside_any_bounds() -> None:
    for low, high in [(0.0, 1.0), (None, None), (0.0, None)]:
        with pytest.raises(ValueError, match="finite number"):
            check_range("k", float("nan"), low, high)
    with pytest.raises(ValueError, match="finite number"):
        check_range("k", float("inf"), 0.0, None)
    assert check_range("k", 0.5, 0.0, 1.0) == 0.5


def test_an_unbounded_float_field_refuses_nan() -> None:
    cake = family_class("cake")  # gamma: a float knob without bounds
    with pytest.raises(ValueError, match=r"method\.params\.gamma=nan"):
        parse_params(cake, {"gamma": float("nan")}, "cake")
