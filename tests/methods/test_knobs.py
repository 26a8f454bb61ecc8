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
    [
        ("streamingllm", "method.pooling=avg"),
        ("tova", "method.kernel_size=5"),
        ("full", "method.window=8"),
        # issue #41: a decode switch on a family with no decode-time policy would change nothing
        ("snapkv", "method.decode_eviction=true"),
        ("ada_snapkv", "method.decode_eviction=true"),
    ],
)
def test_an_unused_knob_is_an_error_naming_the_family(method: str, override: str) -> None:
    cfg = compose_config(method, "64L", overrides=[override])
    family = cfg.method.family
    key, value = override.split("=")
    with pytest.raises(KVBenchError, match=rf"(?i){key}='?{value}'? is not used by the {family} family"):
        check_method(cfg)


def test_a_used_knob_and_every_shipped_preset_build() -> None:
    check_method(compose_config("snapkv", "64L", overrides=["method.pooling=avg"]))
    check_method(compose_config("streamingllm", "64L", overrides=["method.window=4"]))  # sizes the recent window
    for preset in sorted(Path(conf_dir(), "method").glob("*.yaml")):
        check_method(compose_config(preset.stem, "64L"))


@pytest.mark.parametrize("preset", ["streamingllm", "tova", "full", "snapkv", "nacl"])
def test_build_method_takes_a_method_config_or_a_mapping(preset: str) -> None:
    """``build_method`` documents a MethodConfig: it builds from one, from a plain mapping and from the composed
    node alike (issue #41: a MethodConfig crashed on the families with unused knobs)."""
    from omegaconf import OmegaConf

    from kvbench.config import MethodConfig
    from kvbench.methods.base import build_method

    node = compose_config(preset, "64L").method
    mapping = OmegaConf.to_container(node)
    built = [build_method(node), build_method(mapping), build_method(MethodConfig(**mapping))]
    described = {(m.name, m.keep_window, repr(m.settings), type(m.decode_policy), type(m.scorer)) for m in built}
    assert len(described) == 1, described
    with pytest.raises(ValueError, match="windw"):
        build_method({**mapping, "windw": 8})
