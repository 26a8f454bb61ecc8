"""Replay kvpress's recorded cases (``tests/fixtures/reference/kvpress/``, kvpress 0.5.5) through a kvbench method.

Per case and layer: the recorded inputs (keys and values ``[H_kv, S, D]`` in the case's dtype) go through the
method's scorer, whose scores are compared with kvpress's recorded ``score()`` output, then through kvbench's
eviction session at kvpress's budget (``<max(1, int(S (1 - ratio)))>/layer``, how a kvpress compression ratio is
spelled in kvbench).  Each head must keep kvpress's positions, or, where the recorded scores tie at the cut, another
valid top-k of the recorded scores (``tests/reference_recordings.py``: ``is_valid_topk``, ``boundary_tie``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

import torch

from kvbench.budget import parse_budget
from kvbench.cache.kv_cache import KVBenchCache
from kvbench.eviction.base import EvictionMethod, WindowObservation
from kvbench.inference.eviction import EvictionSession
from tests.methods.helpers import LayerIndex
from tests.reference_recordings import (
    RecordedCase,
    boundary_tie,
    case_inputs,
    is_valid_topk,
    kvpress_n_kept,
    load_recording,
)

#: ``(case, layer, inputs of that layer) -> observation``: how a family's scorer sees a recorded layer.
ObservationOf = Callable[[RecordedCase, int, dict[str, torch.Tensor]], WindowObservation]


def keys_values_observation(case: RecordedCase, layer: int, inputs: dict[str, torch.Tensor]) -> WindowObservation:
    """The observation of a scorer that reads stored keys and values only (one dummy window query per KV head)."""
    keys, values = inputs["keys"][0], inputs["values"][0]
    query = torch.zeros(keys.shape[0], 1, keys.shape[-1], dtype=keys.dtype)
    return WindowObservation(layer, 2 if case.kind == "model" else 1, query, keys, values, keys.shape[-1] ** -0.5)


@dataclass
class ReplayTally:
    """Selections compared: per (case, layer, head), kept positions equal to kvpress's, or another valid top-k of
    kvpress's scores where they tie at the cut."""

    cases: int = 0
    selections: int = 0
    same: int = 0
    tied_valid: int = 0
    max_score_error: float = 0.0
    kinds: dict[str, int] = field(default_factory=dict)


def keep_one_layer(
    method: EvictionMethod, observation: WindowObservation, n_kept: int, budget: str | None = None
) -> list[list[int]]:
    """kvbench's session on one layer holding ``observation``'s keys and values: kept positions per head, under
    ``budget`` (default ``<n_kept>/layer``; ``<c>cr`` is kvpress's compression ratio as kvbench spells it)."""
    keys, values = observation.keys, observation.values
    cache = KVBenchCache(1)
    cache.update(keys[None], values[None], 0)
    session = EvictionSession(method, parse_budget(budget or f"{n_kept}/layer"), cache)
    session.begin_prefill(keys.shape[1])
    scorer = method.scorer

    class Fixed:  # the scorer as it is, seeing the case's observation instead of the session's
        def prompt_rows(self, dtype: torch.dtype):
            return scorer.prompt_rows(dtype)

        def score(self, seen: WindowObservation) -> torch.Tensor:  # the layer budget (and ratio) are the session's
            budget = {"layer_budget": seen.layer_budget, "compression_ratio": seen.compression_ratio}
            return scorer.score(dataclasses.replace(observation, **budget))

    method_for_case = EvictionMethod(**{**method.__dict__, "scorer": Fixed()})
    session.method = method_for_case
    session.after_attention(LayerIndex(0), observation.queries[None], observation.scaling)
    session.begin_decode()
    return [sorted(p.tolist()) for p in cache.headwise_layers[0].positions]


def replay(
    method: EvictionMethod | Callable[[RecordedCase], EvictionMethod],
    press: str,
    observation_of: ObservationOf = keys_values_observation,
    *,
    score_atol: float = 0.0,
    score_press: str | None = None,
    before_case: Callable[[RecordedCase], None] | None = None,
    dtypes: tuple[str, ...] = ("float32", "bfloat16"),
    strict: bool = True,
) -> ReplayTally:
    """Replay the cases of ``press``'s recording in ``dtypes``; asserts scores (to ``score_atol``) and, when
    ``strict``, selections per head (else counts them: ``same``, ``tied_valid``, the rest differ).  ``method`` may
    be a function of the case (settings that follow the case's compression ratio)."""
    tally = ReplayTally()
    method_of = method if callable(method) else (lambda _: method)
    for case in load_recording(press).cases:
        if case.dtype not in dtypes:
            continue
        method = method_of(case)
        tally.cases += 1
        tally.kinds[f"{case.kind}/{case.dtype}"] = tally.kinds.get(f"{case.kind}/{case.dtype}", 0) + 1
        n_kept = kvpress_n_kept(case.length, case.compression_ratio)
        if before_case is not None:
            before_case(case)  # e.g. the recorder's torch.manual_seed(1234): layer 0 then layer 1 draw from it
        for layer, inputs in enumerate(case_inputs(case)):
            reference = case.layer_scores(layer, score_press)
            observation = observation_of(case, layer, inputs)
            draws = torch.random.get_rng_state()
            ours = method.scorer.score(observation).float()
            error = float((ours - reference).abs().max())
            tally.max_score_error = max(tally.max_score_error, error)
            where = (case.inputs, case.dtype, case.compression_ratio, layer)
            assert error <= score_atol, (*where, error)
            torch.random.set_rng_state(draws)  # the session's score call draws what the first one drew
            kept = keep_one_layer(method, observation, n_kept)
            for head, positions in enumerate(kept):
                tally.selections += 1
                recorded = case.kept[layer][head]
                if positions == sorted(recorded):
                    tally.same += 1
                    continue
                if not strict:
                    if boundary_tie(reference[head], n_kept) and is_valid_topk(reference[head], positions):
                        tally.tied_valid += 1
                    continue
                assert len(positions) == len(recorded) == n_kept, (*where, head)
                assert boundary_tie(reference[head], n_kept), (*where, head, positions, sorted(recorded))
                assert is_valid_topk(reference[head], positions), (*where, head)
                tally.tied_valid += 1
    return tally


def model_queries(case: RecordedCase, layer: int, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """``[H_q, S, D]`` post-RoPE queries of every prompt token of a recorded model case, in the case's dtype, as the
    tiny Llama computed them (``q_proj`` of the recorded attention input, then transformers' RoPE)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    from tests.reference_recordings import DTYPES, inputs_meta, tiny_llama_weights

    config = LlamaConfig(**inputs_meta()["model_config"])
    dtype = DTYPES[case.dtype]
    weight = tiny_llama_weights(dtype)[f"model.layers.{layer}.self_attn.q_proj.weight"]
    hidden = inputs["hidden_states"].to(dtype)
    length = hidden.shape[1]
    queries = torch.nn.functional.linear(hidden, weight).view(1, length, -1, config.head_dim).transpose(1, 2)
    # The recorder cast its model with .to(dtype), which casts RoPE's inv_freq buffer too (bfloat16 frequencies).
    cos, sin = LlamaRotaryEmbedding(config).to(dtype)(queries, torch.arange(length)[None])
    rotated, _ = apply_rotary_pos_emb(queries, queries, cos, sin)
    return rotated[0]


def prompt_queries_observation(case: RecordedCase, layer: int, inputs: dict[str, torch.Tensor]) -> WindowObservation:
    """The observation of a scorer that reads every prompt query (and the stored keys and values)."""
    keys, values = inputs["keys"][0], inputs["values"][0]
    queries = model_queries(case, layer, inputs)
    return WindowObservation(layer, 2, queries[:, -1:], keys, values, keys.shape[-1] ** -0.5, prompt_queries=queries)


def rotary_observation(case: RecordedCase, layer: int, inputs: dict[str, torch.Tensor]) -> WindowObservation:
    """:func:`prompt_queries_observation` plus the tiny Llama's rotary tables (as the recorder's model held them)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from tests.reference_recordings import DTYPES, inputs_meta

    rotary = LlamaRotaryEmbedding(LlamaConfig(**inputs_meta()["model_config"])).to(DTYPES[case.dtype])

    def tables(positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = rotary(torch.empty(0, dtype=dtype), positions[None])
        return cos[0], sin[0]

    observation = prompt_queries_observation(case, layer, inputs)
    observation.rotary = tables
    return observation


@cache
def recorded_attention(dtype: str, layer: int) -> torch.nn.Module:
    """The tiny Llama's ``self_attn`` module of ``layer`` in ``dtype`` (the recorder's weights, no gradients; built
    without touching the global generator, which the leverage sketch draws from)."""
    from tests.methods.reference_models import tiny_llama
    from tests.reference_recordings import inputs_meta

    with torch.random.fork_rng():
        model = tiny_llama(dtype, inputs_meta()["model_config"]).requires_grad_(False)
    return model.model.layers[layer].self_attn


def hidden_states_observation(case: RecordedCase, layer: int, inputs: dict[str, torch.Tensor]) -> WindowObservation:
    """:func:`rotary_observation` plus the pre-RoPE states a model path gives: the layer's recorded input hidden
    states through the tiny Llama's attention module (``k_proj`` / ``q_proj``, as kvpress)."""
    from kvbench.inference.hidden_states import ProjectedStates
    from tests.reference_recordings import DTYPES

    observation = rotary_observation(case, layer, inputs)
    hidden = inputs["hidden_states"][0].to(DTYPES[case.dtype])
    observation.prerope = ProjectedStates(recorded_attention(case.dtype, layer), hidden)
    return observation
