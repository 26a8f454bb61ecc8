"""A method's knobs are declared where they are read (issue #41): the scorer knobs (pooling, kernel size, GQA-reduction
order, score dtype) are the family's own fields (``method.params.<knob>``), and a knob the method does not declare
is an error at composition listing the method's own knobs; a session knob (``method.<knob>``) the family does not
read, or a decode switch on a method with no decode policy, is an error naming the family."""

from __future__ import annotations

import pytest

from kvbench.api import compose_config
from kvbench.errors import KVBenchError
from kvbench.validation import check_method


@pytest.mark.parametrize(
    ("method", "override", "own"),
    [
        ("streamingllm", "method.pooling=avg", "window, .*sink_tokens, decode_eviction.*method=streamingllm"),
        ("tova", "method.params.kernel_size=5", "its parameters are: score_dtype, head_average, protect_recent"),
        ("knorm", "method.params.score_dtype=float32", "its parameters are: keep_window, allocation"),
    ],
)
def test_an_undeclared_knob_is_an_error_at_composition_listing_the_methods_own(method, override, own) -> None:
    with pytest.raises(KVBenchError, match=rf"{override.split('=')[0]}.*{own}"):
        compose_config(method, "64L", overrides=[override])


@pytest.mark.parametrize(
    ("method", "override"),
    [
        ("full", "method.window=8"),
        ("nacl", "method.window=8"),
        ("snapkv", "method.decode_eviction=true"),
        ("knorm", "method.decode_eviction=true"),
    ],
)
def test_an_unused_session_knob_is_an_error_naming_the_family(method: str, override: str) -> None:
    cfg = compose_config(method, "64L", overrides=[override])
    family = cfg.method.family
    key, value = override.split("=")
    with pytest.raises(KVBenchError, match=rf"(?i){key}='?{value}'? is not used by the {family} family"):
        check_method(cfg)


def test_a_declared_knob_builds() -> None:
    """(Every shipped preset builds and runs: tests/end_to_end/test_methods_end_to_end.py.)"""
    check_method(compose_config("snapkv", "64L", overrides=["method.params.pooling=avg"]))
    check_method(compose_config("tova", "64L", overrides=["method.params.score_dtype=float32"]))
    check_method(compose_config("streamingllm", "64L", overrides=["method.window=4"]))  # sizes the recent window


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
    with pytest.raises(ValueError, match=r"kernel_sise.*valid keys"):
        build_method(MethodConfig(**{**mapping, "params": {**mapping["params"], "kernel_sise": 5}}))
