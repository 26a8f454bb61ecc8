"""A method's knobs are declared where they are read (issue #41): the scorer knobs (pooling, kernel size, GQA-reduction
order, score dtype) are the family's own fields (``method.params.<knob>``), and a knob the method does not declare
is an error at composition listing the method's own knobs; a session knob (``method.<knob>``) the family does not
read, or a decode switch on a method with no decode policy, is an error naming the family."""

from __future__ import annotations

import pytest

from kvbench.api import compose_config
from kvbench.app.validation import check_method
from kvbench.errors import KVBenchError


@pytest.mark.parametrize(
    ("method", "override", "own"),
    [
        ("streamingllm", "method.pooling=avg", "method=streamingllm.*sink_tokens, window, decode_eviction"),
        ("tova", "method.params.kernel_size=5", "its parameters are: .*score_dtype, head_average, protect_recent"),
        ("knorm", "method.params.score_dtype=float32", "its parameters are: allocation, layers, .*keep_window"),
    ],
)
def test_an_undeclared_knob_is_an_error_at_validation_listing_the_methods_own(method, override, own) -> None:
    """Composing sets the knob (``++``, as ``run.py`` does); the one validation pass refuses it (issue #57)."""
    with pytest.raises(KVBenchError, match=rf"{override.split('=')[0]}.*{own}"):
        check_method(compose_config(method, "64L", overrides=[override]))


@pytest.mark.parametrize(
    ("method", "override", "error"),
    [  # a session knob the family never reads is not among its knobs; one it reads only in some settings is refused
        ("full", "method.window=8", "method.params.window is not a parameter of this method .family 'full'."),
        ("nacl", "method.params.window=8", "method.params.window is not a parameter of this method .family 'nacl'."),
        ("snapkv", "method.decode_eviction=true", "params.decode_eviction=True is not used by the snapkv family"),
        ("knorm", "method.params.decode_eviction=true", "decode_eviction=True is not used by the knorm family"),
        ("tova", "method.params.gqa_agg=max", "method.params.gqa_agg='max' is not used by the tova family as set"),
    ],
)
def test_an_unused_session_knob_is_an_error_naming_the_family(method: str, override: str, error: str) -> None:
    with pytest.raises(KVBenchError, match=rf"(?i){error}"):
        check_method(compose_config(method, "64L", overrides=[override]))


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
    from kvbench.eviction.base import build_method

    node = compose_config(preset, "64L").method
    mapping = OmegaConf.to_container(node)
    built = [build_method(node), build_method(mapping), build_method(MethodConfig(**mapping))]
    described = {(m.name, m.keep_window, repr(m.settings), type(m.decode_policy), type(m.scorer)) for m in built}
    assert len(described) == 1, described
    with pytest.raises(ValueError, match="windw"):
        build_method({**mapping, "windw": 8})
    with pytest.raises(ValueError, match=r"kernel_sise.*valid keys"):
        build_method(MethodConfig(**{**mapping, "params": {**mapping["params"], "kernel_sise": 5}}))


def _hydra_value(value) -> str:
    """A knob's default as a command-line override value."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    return f"'{value}'" if isinstance(value, str) else str(value)


#: Presets that leave some of their family's knobs out (paper families' YAMLs, a one-class method's YAML); the rewrite
#: (kvbench.app.overrides.prepare_overrides) is one rule for every preset, so a sample covers it.
UNLISTED_KNOB_PRESETS = ["streamingllm", "cake_alloc_random", "headkv", "expected_attention_kvpress"]


@pytest.mark.parametrize("preset", UNLISTED_KNOB_PRESETS)
def test_every_declared_knob_can_be_set_on_a_preset_that_does_not_list_it(preset: str) -> None:
    """``method.params.<knob>=`` sets every knob the method's class declares, listed in the preset or not (Hydra's
    struct mode refused the unlisted ones): at its default, the method builds the same recipe."""
    import dataclasses

    from kvbench.eviction.family import family_class

    plain = compose_config(preset, "64L")
    params = plain.method.params
    method_class = family_class(plain.method.family)
    defaults = {field.name: field.default for field in dataclasses.fields(method_class)}
    unlisted = {knob: defaults[knob] for knob in method_class.declared_knobs(params) if knob not in params}
    assert unlisted, f"{preset} lists every knob of its family"
    overrides = [f"method.params.{knob}={_hydra_value(value)}" for knob, value in unlisted.items()]
    composed = compose_config(preset, "64L", overrides=overrides)
    assert {knob: composed.method.params[knob] for knob in unlisted} == unlisted
    assert check_method(composed).settings == check_method(plain).settings


def test_think_passes_a_knob_its_preset_does_not_list_to_its_token_method() -> None:
    """``method=think method.params.tokens=knorm method.params.allocation=ada`` (no ``+``): ThinK over KNorm under
    Ada-KV's allocation; SnapKV's knobs left in the preset are refused, naming ThinK's and KNorm's knobs."""
    from kvbench.methods.adakv import AdaHeadAllocator

    over_knorm = ["method.params.tokens=knorm", "method.params.allocation=ada"]
    refused = r"method.params.kernel_size, .* are not parameters .* are: .*tokens, .*allocation"
    with pytest.raises(KVBenchError, match=refused):
        check_method(compose_config("think", "64L", overrides=over_knorm))
    vote_knobs = ["kernel_size", "pooling", "pool_padding", "gqa_reduce", "score_dtype"]
    method = check_method(
        compose_config("think", "64L", overrides=[*over_knorm, *(f"~method.params.{k}" for k in vote_knobs)])
    )
    assert method.family == "think" and isinstance(method.head_allocator, AdaHeadAllocator)
    assert method.settings["tokens"] == "knorm" and method.settings["allocation"] == "ada"


def test_an_unlisted_knob_set_on_the_command_line_runs_and_is_recorded(tmp_path) -> None:
    """``method=streamingllm method.params.evict_on_append=false`` (the preset does not list the knob) runs, and
    metrics.json's settings record the switch."""
    import json

    from kvbench.app.validation import validate_run
    from kvbench.run.runner import Runner

    overrides = ["method.params.evict_on_append=false", "task.lengths=[1024]", "task.datasets=[niah_single_1k]",
                 "task.num_samples=1", f"run.output_root={tmp_path}", "run.progress=false",
                 "run.print_table=false"]  # fmt: skip
    runner = Runner(validate_run(compose_config("streamingllm", "64L", model="tiny", overrides=overrides)))
    runner.run()
    settings = json.loads((runner.folder / "niah_single_1k" / "metrics.json").read_text())["settings"]
    assert settings["params"] == {"evict_on_append": False} and settings["resolved"]["evict_on_append"] is False


def test_an_undeclared_knob_on_the_command_line_exits_2_naming_the_methods_own(tmp_path, capsys) -> None:
    """``python run.py method=streamingllm method.params.evict_on_appnd=false`` (its overrides prepared and run as
    run.py does, in process): exit 2, one paragraph naming the method's knobs (those its preset does not list too)
    and the closest one, nothing written."""
    from kvbench.app.overrides import prepare_overrides
    from tests.bad_input.test_bad_input import assert_clean_failure, run_in_process

    args = ["method=streamingllm", "method.params.evict_on_appnd=false", f"run.output_root={tmp_path / 'runs'}"]
    code, stderr = run_in_process(prepare_overrides(args), capsys)
    expected = (
        "error: method=streamingllm: method.params.evict_on_appnd is not a parameter of this method (family "
        "'streamingllm'); its parameters are: sink_tokens, window, decode_eviction, evict_on_append, scores, "
        "window_in_budget, gqa_granularity. Did you mean method.params.evict_on_append?"
    )
    assert_clean_failure(code, stderr, [expected])
    assert stderr.startswith(expected) and not (tmp_path / "runs").exists()


def test_a_session_knob_spelt_as_before_issue_57_works_with_a_note_and_the_same_hash(caplog) -> None:
    """``method.window=16`` (the spelling before every knob was ``method.params.<knob>``) composes to the same config
    as ``method.params.window=16``, with a one-line note, and hashes as a run of before did (its config then had
    ``method.window: 16``): the same folder resumes."""
    from kvbench.eviction.base import build_method
    from kvbench.storage.writers import canonical_config, config_hash

    old = compose_config("snapkv", "64L", overrides=["method.window=16", "method.gqa_agg=max"])
    assert "note: method.window is spelt method.params.window now" in caplog.text
    new = compose_config("snapkv", "64L", overrides=["method.params.window=16", "method.params.gqa_agg=max"])
    assert old.method.params.window == new.method.params.window == 16 and config_hash(old) == config_hash(new)
    layout_of_before = canonical_config({"method": {"family": "snapkv", "params": {"window": 16}}})["method"]
    assert layout_of_before["window"] == 16 and "window" not in layout_of_before["params"]
    mapping = build_method({"name": "s", "family": "snapkv", "window": 8, "params": {"kernel_size": 5}})
    assert (mapping.window, mapping.scorer.kernel_size) == (8, 5)
