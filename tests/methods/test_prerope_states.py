"""Pre-RoPE states from the layers' hidden states (:mod:`kvbench.inference.hidden_states`): the recorded tiny Llama
run through kvbench's own prefill keeps kvpress's tokens for Expected Attention, leverage and Compactor in float32
and bfloat16 (the cases of ``tests/fixtures/reference/kvpress/``, kvpress 0.5.5); the hooks live only during the
compressing prefill, chunked prefill and the press API use them too, and a layout kvbench does not know falls back
to un-rotation, which the cache record says."""

from __future__ import annotations

from functools import cache

import pytest
import torch

import kvbench
from kvbench.budget import parse_budget
from kvbench.eviction.base import EvictionMethod, PromptRows, TokenScorer, WindowObservation, build_method
from kvbench.eviction.prerope import GatheredStates, UnrotatedStates
from kvbench.inference.prefill import prefill
from tests.methods.reference_models import tiny_llama
from tests.reference_recordings import (
    RecordedCase,
    boundary_tie,
    inputs_meta,
    is_valid_topk,
    kvpress_n_kept,
    load_recording,
    stored_input,
)

#: Press -> (the kvbench method of a case, the score call the selection follows).
PRESSES = {
    "ExpectedAttentionPress": (lambda case: {"family": "expected_attention"}, None),
    "LeverageScorePress": (lambda case: {"family": "leverage"}, None),
    "CompactorPress": (
        lambda case: {"family": "compactor", "params": {"chunk_size": 32, "blending": case.compression_ratio}},
        "CompactorPress",
    ),
}


@cache
def model(dtype: str) -> torch.nn.Module:
    with torch.random.fork_rng():  # the leverage sketch draws from the global generator: leave it as seeded
        return tiny_llama(dtype, inputs_meta()["model_config"])


def run_case(case: RecordedCase, spec: dict, prefill_chunk: int = 0):
    """kvbench's prefill of the case's prompt at kvpress's budget, after the recorder's ``manual_seed(1234)``."""
    method = build_method({"name": spec["family"], **spec})
    ids = stored_input(f"{case.inputs}/input_ids")[0].tolist()
    budget = parse_budget(f"{kvpress_n_kept(case.length, case.compression_ratio)}/layer")
    torch.manual_seed(1234)
    with torch.no_grad():
        state = prefill(model(case.dtype), ids, method=method, budget=budget, prefill_chunk=prefill_chunk)
    state.session.begin_decode()
    return state


@pytest.mark.parametrize("press", sorted(PRESSES))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_model_path_keeps_kvpress_tokens(press: str, dtype: str) -> None:
    """Every recorded model case: each layer and head keeps kvpress's positions (or, where kvpress's scores tie at
    the cut, another valid top-k of them); none differs, bfloat16 included."""
    spec_of, score_press = PRESSES[press]
    cases = [case for case in load_recording(press).cases if case.kind == "model" and case.dtype == dtype]
    same = tied = 0
    for case in cases:
        state = run_case(case, spec_of(case))
        assert state.session.record.prerope_states == "hidden_states"
        n_kept = kvpress_n_kept(case.length, case.compression_ratio)
        for layer, heads in enumerate(case.kept):
            reference = case.layer_scores(layer, score_press)
            for head, recorded in enumerate(heads):
                kept = sorted(state.cache.headwise_layers[layer].positions[head].tolist())
                if kept == sorted(recorded):
                    same += 1
                    continue
                where = (case.inputs, case.compression_ratio, layer, head)
                assert boundary_tie(reference[head], n_kept) and is_valid_topk(reference[head], kept), where
                tied += 1
    assert len(cases) == 8 and same + tied == 32 and same >= 23, (same, tied)


def test_hooks_live_only_during_the_compressing_prefill() -> None:
    """After the prefill no pre-hook is left on the attention modules; a scorer that reads no pre-RoPE states and a
    full budget register none, nor does a prefill that fails leave any."""
    case = next(c for c in load_recording("LeverageScorePress").cases if c.kind == "model")
    attention = [layer.self_attn for layer in model(case.dtype).model.layers]
    state = run_case(case, {"family": "leverage"})
    assert not any(module._forward_pre_hooks for module in attention)
    assert state.session.hooks == [] and state.session._rows == {}
    for spec in ({"family": "knorm"}, {"family": "leverage", "budget": "full"}):
        method = build_method({"name": spec["family"], "family": spec["family"]})
        budget = parse_budget(spec.get("budget", "8/layer"))
        ids = stored_input(f"{case.inputs}/input_ids")[0].tolist()
        with torch.no_grad():
            state = prefill(model(case.dtype), ids, method=method, budget=budget)
        assert state.session.hooks == [] and state.session.record.prerope_states is None
        assert not any(module._forward_pre_hooks for module in attention)
    failing = build_method({"name": "ea", "family": "expected_attention", "params": {"n_sink": 500}})
    with pytest.raises(ValueError, match="n_sink=500"), torch.no_grad():  # a prefill that fails leaves none either
        prefill(model(case.dtype), ids, method=failing, budget=parse_budget("8/layer"))
    assert not any(module._forward_pre_hooks for module in attention)


def test_chunked_prefill_and_the_press_api_use_hidden_states() -> None:
    """``run.prefill_chunk``: the session joins the chunks' hidden states (the scores see every prompt row: in
    float32 the chunked prefill keeps the one-shot tokens); ``kvbench.press`` uses them for its held last segment."""
    case = next(c for c in load_recording("LeverageScorePress").cases if c.kind == "model" and c.dtype == "float32")
    for spec in ({"family": "leverage"}, {"family": "expected_attention"}):
        whole, chunked = run_case(case, spec), run_case(case, spec, prefill_chunk=16)
        assert chunked.session.record.prefill_chunk == 16
        assert chunked.session.record.prerope_states == "hidden_states"
        for one, other in zip(whole.cache.headwise_layers, chunked.cache.headwise_layers, strict=True):
            assert [p.tolist() for p in one.positions] == [p.tolist() for p in other.positions], spec
    llama = model("float32")
    ids = stored_input(f"{case.inputs}/input_ids")
    for chunk in (0, 16):
        with kvbench.press(llama, "leverage", "24/layer", prefill_chunk=chunk) as record, torch.no_grad():
            llama(input_ids=ids)
        assert record.last.prerope_states == "hidden_states" and record.last.evicted
        assert not any(layer.self_attn._forward_pre_hooks for layer in llama.model.layers)


def test_an_unknown_attention_layout_falls_back_to_unrotation() -> None:
    """OLMo-2 normalises all query heads at once (a ``q_norm`` over ``H D``), a layout kvbench does not project:
    its layers get no hook and the scorer un-rotates the stored keys, as the cache record says."""
    from transformers import Olmo2Config, Olmo2ForCausalLM

    from kvbench.inference.hidden_states import attention_modules

    config = Olmo2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2,
    )  # fmt: skip
    torch.manual_seed(0)
    olmo = Olmo2ForCausalLM(config).eval()
    olmo.set_attn_implementation("kvbench")
    assert attention_modules(olmo) == {}
    assert set(attention_modules(model("float32"))) == {0, 1}
    with torch.no_grad():
        state = prefill(olmo, list(range(1, 41)), method=build_method({"name": "l", "family": "leverage"}),
                        budget=parse_budget("8/layer"))  # fmt: skip
    assert state.session.record.prerope_states == "unrotated" and state.session.record.evicted


class Compare(TokenScorer):
    """A scorer that checks the projected pre-RoPE states against the un-rotated ones and scores by key norm."""

    def __init__(self) -> None:
        self.errors: list[float] = []

    def prompt_rows(self, model_dtype: torch.dtype) -> PromptRows:
        return PromptRows(queries=True, prerope_keys=True, prerope_queries=True)

    def score(self, observation: WindowObservation) -> torch.Tensor:
        assert observation.prerope is not None
        unrotated = UnrotatedStates(observation)
        for first, last in ((0, None), (3, observation.context_length - 2)):
            for kind in ("keys", "queries"):
                projected = getattr(observation.prerope, kind)(first, last)
                self.errors.append(float((projected - getattr(unrotated, kind)(first, last)).abs().max()))
        heads, length = observation.keys.shape[:2]
        positions = torch.stack([torch.randperm(length)[:9] for _ in range(heads)])  # a wrapper's candidates
        gathered = GatheredStates(observation.prerope, positions).keys(2)
        self.errors.append(float((gathered - GatheredStates(unrotated, positions).keys(2)).abs().max()))
        return observation.keys.float().norm(dim=-1)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3", "gpt_oss"])
@pytest.mark.parametrize("granularity", ["kv_head", "query_head"])
def test_projected_states_are_the_models_pre_rope_states(arch: str, granularity: str) -> None:
    """In float32 the projection (per-head ``q_norm`` / ``k_norm`` of Qwen3 and Gemma-3, biases and half-width
    rotary tables of gpt-oss) equals the stored states un-rotated: slices, query-head storage and a wrapper's
    candidate tokens (:class:`~kvbench.eviction.prerope.GatheredStates`) included."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    from tests.models.test_sliding_models import COMMON, CONFIGS

    configs = {
        "llama": lambda: LlamaConfig(**COMMON, num_hidden_layers=2),
        "qwen3": lambda: Qwen3Config(**COMMON, num_hidden_layers=2),
        **CONFIGS,
    }
    torch.manual_seed(0)
    built = AutoModelForCausalLM.from_config(configs[arch](), attn_implementation="kvbench").eval()
    for name, parameter in built.named_parameters():
        if name.endswith(("q_norm.weight", "k_norm.weight")):
            parameter.data.normal_(0, 0.5)  # non-trivial norms: their place before RoPE matters
    scorer = Compare()
    method = EvictionMethod("compare", "compare", scorer, window=4, gqa_granularity=granularity)
    with torch.no_grad():
        state = prefill(built, list(range(3, 43)), method=method, budget=parse_budget("8/layer"))
    assert state.session.record.prerope_states == "hidden_states" and scorer.errors
    assert max(scorer.errors) < 1e-5, scorer.errors


@pytest.mark.parametrize("selection", ["chunk", "block"])
def test_selection_wrappers_score_candidates_with_their_own_pre_rope_keys(selection: str) -> None:
    """ChunkPress / BlockPress-style selection over leverage scores: each call scores its candidate tokens' pre-RoPE
    keys (gathered from the layer's), and the layer keeps its budget."""
    case = next(c for c in load_recording("LeverageScorePress").cases if c.kind == "model" and c.length == 128)
    spec = {"family": "leverage", "params": {"selection": selection, "selection_length": 32}}
    state = run_case(case, spec)
    assert state.session.record.prerope_states == "hidden_states"
    kept = kvpress_n_kept(case.length, case.compression_ratio)
    assert state.session.record.requested_per_layer == [kept, kept]
    assert all(0 < n <= kept + 32 for n in state.session.record.achieved_per_layer)
