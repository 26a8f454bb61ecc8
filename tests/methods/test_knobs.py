"""A method family declares the common knobs it uses; setting one it does not use is an error naming the family
(issue #31), and no shipped preset sets one."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbench.api import compose_config
from kvbench.errors import KVBenchError
from kvbench.resources import conf_dir
from kvbench.validation import check_method


@pytest.mark.parametrize(
    ("method", "override"),
    [("streamingllm", "method.pooling=avg"), ("tova", "method.kernel_size=5"), ("full", "method.window=8")],
)
def test_an_unused_knob_is_an_error_naming_the_family(method: str, override: str) -> None:
    cfg = compose_config(method, "64L", overrides=[override])
    family = cfg.method.family
    key, value = override.split("=")
    with pytest.raises(KVBenchError, match=rf"{key}='?{value}'? is not used by the {family} family"):
        check_method(cfg)


def test_a_used_knob_and_every_shipped_preset_build() -> None:
    check_method(compose_config("snapkv", "64L", overrides=["method.pooling=avg"]))
    check_method(compose_config("streamingllm", "64L", overrides=["method.window=4"]))  # sizes the recent window
    for preset in sorted(Path(conf_dir(), "method").glob("*.yaml")):
        check_method(compose_config(preset.stem, "64L"))
