"""A built method is a frozen recipe; what a sample accumulates lives in its session (issue #41 item 4)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvbench.eviction.base import AllocatorState, DecodeState, EvictionMethod, ReadOnlyAfterBuild, build_method
from kvbench.inference.eviction import EvictionSession
from tests.methods.helpers import method_from_yaml, run_method

#: Presets covering every stateful piece: allocators (CAKE's cascade, XKV's sampled calibration, NACL's trigger),
#: every decode policy, Ada-KV's head allocator and a one-class method with both wrappers.
PRESETS = [
    "snapkv", "ada_pyramidkv", "cake", "xkv_sampled", "nacl", "h2o", "tova", "streamingllm", "ahakv", "knorm",
    "knorm_decoding",
]  # fmt: skip


def _build(name: str) -> EvictionMethod:
    if name == "knorm":  # a one-class method (no YAML), with Ada-KV head allocation and the pyramid schedule
        return build_method({"name": "knorm", "family": "knorm", "params": {"allocation": "ada", "layers": "pyramid"}})
    if name == "knorm_decoding":  # kvpress's DecodingPress over KNorm: a decode policy with counters and queries
        return build_method({"name": "knorm", "family": "knorm", "params": {"decode_interval": 2}})
    return method_from_yaml(name)


def _pieces(method: EvictionMethod) -> list[ReadOnlyAfterBuild]:
    pieces = [method.scorer, method.layer_allocator, method.head_allocator, method.decode_policy]
    return [piece for piece in pieces if piece is not None]


def _describe(value: object) -> object:
    """A value as plain data, recursively: pieces by their type and attributes, tensors by their contents."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, value.tolist())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = [(f.name, _describe(getattr(value, f.name))) for f in dataclasses.fields(value)]
        return (type(value).__name__, fields)
    if isinstance(value, dict):
        return sorted((str(key), _describe(item)) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return [_describe(item) for item in value]
    if hasattr(value, "__dict__") and not callable(value):
        return (type(value).__name__, sorted((name, _describe(item)) for name, item in vars(value).items()))
    return repr(value)


def _snapshot(method: EvictionMethod) -> object:
    """Every field of the method and every attribute of its pieces, as plain data."""
    return _describe(method)


@pytest.mark.parametrize("name", PRESETS)
def test_setting_an_attribute_of_a_built_method_or_its_pieces_raises(name: str) -> None:
    method = _build(name)
    with pytest.raises(dataclasses.FrozenInstanceError):
        method.window = 3  # type: ignore[misc]
    for piece in _pieces(method):
        with pytest.raises(AttributeError, match=r"frozen recipe|cannot assign"):
            piece.anything = 1
    # Variants are new recipes; the original is untouched.
    variant = dataclasses.replace(method, window=method.window + 1)
    assert variant.window == method.window + 1 and variant.scorer is method.scorer


@pytest.mark.parametrize("name", PRESETS)
def test_two_samples_leave_the_recipe_unchanged_and_keep_their_state_in_their_sessions(tiny_llama, name: str) -> None:
    """Building twice gives equal recipes; running two samples (decoding too) leaves every field as built."""
    model, tokenizer = tiny_llama
    method = _build(name)
    before = _snapshot(method)
    assert before == _snapshot(_build(name))
    first = run_method(model, tokenizer, method, "64L", context=200, new=6)
    second = run_method(model, tokenizer, method, "64L", context=260, new=6)
    assert _snapshot(method) == before
    assert first.record.context_tokens != second.record.context_tokens  # two different samples ran


def test_the_session_owns_the_sample_state(tiny_llama) -> None:
    """Caps and running scores are the session's tensors, per layer, ready to stack over samples."""
    from kvbench.budget import parse_budget
    from kvbench.inference.prefill import prefill

    model, _ = tiny_llama
    method = method_from_yaml("h2o")
    ids = torch.randint(3, 250, (200,), generator=torch.Generator().manual_seed(1)).tolist()
    sessions: list[EvictionSession] = []
    for _ in range(2):
        with torch.no_grad():
            state = prefill(model, ids, method=method, budget=parse_budget("64L"))
        state.session.begin_decode()
        sessions.append(state.session)
    first, second = (session.decode_state for session in sessions)
    assert isinstance(first, DecodeState) and first is not second
    assert isinstance(sessions[0].allocator_state, AllocatorState)
    for layer_idx, caps in first.caps.items():
        assert caps.dtype == torch.int64 and caps.shape == (sessions[0].record.stored_heads,)
        stacked = torch.stack([first.caps[layer_idx], second.caps[layer_idx]])  # [B, H]
        assert stacked.tolist() == [[64] * caps.shape[0]] * 2
        assert first.scores[layer_idx].shape == second.scores[layer_idx].shape
