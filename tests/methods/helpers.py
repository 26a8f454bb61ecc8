"""Shared helpers of the method tests: a method built from its preset YAML, one layer's prefill compression on
hand-built tensors, a planted dominant key, and a short greedy run on a tiny model."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from omegaconf import OmegaConf

from kvbench.budget import parse_budget
from kvbench.cache.kv_cache import KVBenchCache
from kvbench.config import MethodConfig
from kvbench.eviction.base import DecodePolicy, DecodeState, build_method
from kvbench.inference.eviction import EvictionSession
from kvbench.inference.generate import generate

CONF = Path(__file__).resolve().parents[2] / "conf"


def method_from_yaml(name: str, removed: tuple[str, ...] = (), **overrides):
    """Build a method exactly as its conf/method/<name>.yaml describes it, less the ``removed`` params (Hydra's
    ``~method.params.<k>``), with ``overrides``."""
    raw = OmegaConf.load(CONF / "method" / f"{name}.yaml")
    raw.pop("defaults", None)
    for key in removed:
        raw.params.pop(key)
    node = OmegaConf.merge(OmegaConf.structured(MethodConfig), raw)
    session = {field.name for field in dataclasses.fields(MethodConfig)}
    for key, value in overrides.items():  # a session knob, or one of the family's own (method.params)
        if key == "params":
            node.params = OmegaConf.merge(node.params, value)
        elif key in session:
            node[key] = value
        else:
            node.params[key] = value
    return build_method(node)


class StepHook(DecodePolicy):
    """A decode policy that runs ``policy`` and then ``after(layer_idx, layer, state)`` after every step (the method
    is a frozen recipe: a test observes its steps through a wrapped policy, ``dataclasses.replace(method,
    decode_policy=StepHook(...))``, not by patching the shared one)."""

    def __init__(self, policy: DecodePolicy, after) -> None:
        self.policy = policy
        self.after = after
        self.evicts_on_append = policy.evicts_on_append

    def new_state(self) -> DecodeState:
        return self.policy.new_state()

    def start_layer(self, state, layer_idx, layer, head_budgets, scores=None) -> None:
        self.policy.start_layer(state, layer_idx, layer, head_budgets, scores)

    def step(self, state, layer_idx, layer, query, scaling) -> None:
        self.policy.step(state, layer_idx, layer, query, scaling)
        self.after(layer_idx, layer, state)

    def append(self, state, layer_idx, layer, query, scaling) -> None:
        self.policy.append(state, layer_idx, layer, query, scaling)


def with_step_hook(method, after):
    """``method`` with ``after(layer_idx, layer, state)`` called after each decoding step of its policy (``state``:
    the sample's :class:`~kvbench.eviction.base.DecodeState`)."""
    return dataclasses.replace(method, decode_policy=StepHook(method.decode_policy, after))


class LayerIndex(torch.nn.Module):
    """A stand-in for a model layer: only its ``layer_idx``, which the eviction session reads."""

    def __init__(self, idx: int) -> None:
        super().__init__()
        self.layer_idx = idx


def prefill_one_layer(method, budget: str, keys: torch.Tensor, query: torch.Tensor) -> KVBenchCache:
    """Store ``keys`` ([H, S, D]) in a one-layer cache and run the method's prefill compression with ``query``."""
    cache = KVBenchCache(1)
    cache.update(keys[None], keys[None].clone(), 0)
    session = EvictionSession(method, parse_budget(budget), cache)
    session.begin_prefill(keys.shape[1])
    session.after_attention(LayerIndex(0), query[None], keys.shape[-1] ** -0.5)
    session.begin_decode()
    return cache


def dominant_case(seed: int = 0, context: int = 200, dominant: int = 57):
    """Keys ``[2, context, 16]`` and queries ``[4, context, 16]`` where every query of the last 32 points at key
    ``dominant``."""
    gen = torch.Generator().manual_seed(seed)
    keys = torch.randn(2, context, 16, generator=gen) * 0.1
    query = torch.randn(4, context, 16, generator=gen) * 0.1
    direction = torch.randn(16, generator=gen)
    keys[:, dominant] = direction * 4  # every window query points at this key
    query[:, -32:] += direction
    return keys, query


def run_method(model, tokenizer, method, budget: str, mode: str = "aware", context: int = 300, new: int = 12):
    """Greedy generation of ``new`` tokens after a seeded random prompt: ``context`` tokens, then a 20-token
    question."""
    ids = torch.randint(3, 250, (context + 20,), generator=torch.Generator().manual_seed(3)).tolist()
    return generate(
        model,
        tokenizer,
        ids[:context],
        ids[context:],
        method=method,
        budget=parse_budget(budget),
        question_mode=mode,
        max_new_tokens=new,
        stop_token_ids=set(),
    )
