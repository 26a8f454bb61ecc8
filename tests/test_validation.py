"""Validation once (issues #31, #57): ``run.py`` validates a config and builds its method once, in one pass at the
application layer; the runner takes what validation built and never validates again, and composing a config
validates nothing."""

from __future__ import annotations

import pytest

import kvbench.eviction.base
from kvbench.api import compose_config
from kvbench.app.validation import validate_run
from kvbench.errors import KVBenchError
from kvbench.run.runner import Runner


def test_the_runner_uses_the_validated_method_and_budget(tmp_path, monkeypatch) -> None:
    cfg = compose_config("snapkv", "64L", overrides=[f"run.output_root={tmp_path}"])
    builds = []
    real_build = kvbench.eviction.base.build_method
    monkeypatch.setattr(kvbench.eviction.base, "build_method", lambda method: builds.append(1) or real_build(method))
    validated = validate_run(cfg)
    runner = Runner(validated)
    assert runner.cfg is cfg and runner.method is validated.method and runner.budget is validated.budget
    assert len(builds) == 1  # built once, by validation
    with pytest.raises(TypeError, match=r"Runner takes a validated run, not DictConfig: .*validate_run\(cfg\)"):
        Runner(cfg)


def test_composing_validates_nothing_and_validation_refuses_an_unknown_knob(tmp_path) -> None:
    """``kvbench.compose_config`` composes (a knob the preset does not list is set with ``++``); the one validation
    pass refuses it, naming the method's own knobs."""
    cfg = compose_config("pyramidkv", "64L", overrides=[f"run.output_root={tmp_path}", "method.params.layers=pyramid"])
    assert cfg.method.params.layers == "pyramid"
    with pytest.raises(KVBenchError, match=r"params.layers is not a parameter.*its parameters are: .*kernel_size"):
        validate_run(cfg)


def test_validate_run_reports_a_bad_method_value_as_run_py_does(tmp_path) -> None:
    cfg = compose_config("snapkv", "64L", overrides=[f"run.output_root={tmp_path}", "method.params.kernel_size=4"])
    with pytest.raises(KVBenchError, match=r"method.params.kernel_size=4"):
        validate_run(cfg)
