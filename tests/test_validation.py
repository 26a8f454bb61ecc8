"""Validation once (issue #31): ``run.py`` validates a config and builds its method once, and the runner uses what
validation built instead of validating and building again."""

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
    runner = Runner(cfg, validated=validated)
    assert runner.method is validated.method and runner.budget is validated.budget
    assert len(builds) == 1  # built once, by validation
    other = compose_config("snapkv", "64L", overrides=[f"run.output_root={tmp_path}"])
    with pytest.raises(ValueError, match="another config"):
        Runner(other, validated=validated)


def test_validate_run_reports_a_bad_method_value_as_run_py_does(tmp_path) -> None:
    cfg = compose_config("snapkv", "64L", overrides=[f"run.output_root={tmp_path}", "method.params.kernel_size=4"])
    with pytest.raises(KVBenchError, match=r"method.params.kernel_size=4"):
        validate_run(cfg)
