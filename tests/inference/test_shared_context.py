"""Compress once, ask many (kvbench/inference/shared_context.py): one compressed prefill per context group, kept
tokens that do not depend on the group's later queries, multi-request queries each from the same compressed
context (= a fresh generation of context + query in agnostic mode), multi-turn turns accumulating on the shared
state.  Tiny random GQA Llama, float32: a few seconds on 2 CPU cores."""

from __future__ import annotations

import pytest
import torch

import kvbench.inference.shared_context as shared_context
from kvbench.budget import parse_budget
from kvbench.inference.generate import generate
from kvbench.inference.shared_context import GroupTurn, generate_group
from tests.methods.helpers import method_from_yaml


@pytest.fixture(scope="module")
def setup(tiny_llama):
    model, tokenizer = tiny_llama
    gen = torch.Generator().manual_seed(5)
    context = torch.randint(3, 250, (120,), generator=gen).tolist()
    queries = [torch.randint(3, 250, (n,), generator=gen).tolist() for n in (7, 5, 9)]
    return model, tokenizer, context, queries


def _turns(queries, max_new_tokens=4):
    return [GroupTurn(q, max_new_tokens, set()) for q in queries]


def _run(model, tokenizer, context, queries, preset, mode, first_query="aware"):
    return generate_group(
        model,
        tokenizer,
        context,
        _turns(queries),
        method=method_from_yaml(preset),
        budget=parse_budget("32L"),
        mode=mode,
        first_query=first_query,
        keep_positions=True,
    )


@pytest.mark.parametrize("mode", ["multi_request", "multi_turn"])
def test_one_prefill_per_group(setup, monkeypatch, mode):
    model, tokenizer, context, queries = setup
    calls = []
    real_prefill = shared_context.prefill
    monkeypatch.setattr(shared_context, "prefill", lambda *a, **k: calls.append(1) or real_prefill(*a, **k))
    output = _run(model, tokenizer, context, queries, "snapkv", mode)
    assert len(calls) == 1 and output.prefills == 1
    assert len(output.turns) == 3 and all(len(turn.token_ids) == 4 for turn in output.turns)
    assert all(turn.record.evicted for turn in output.turns)


@pytest.mark.parametrize(
    ("preset", "mode"), [("snapkv", "multi_request"), ("snapkv", "multi_turn"), ("h2o", "multi_turn")]
)
def test_kept_tokens_do_not_depend_on_later_queries(setup, preset, mode):
    model, tokenizer, context, queries = setup
    other = [queries[0], list(reversed(queries[2])), queries[1][:2]]
    first = _run(model, tokenizer, context, queries, preset, mode)
    second = _run(model, tokenizer, context, other, preset, mode)
    assert first.kept_positions == second.kept_positions
    assert first.context_fingerprint == second.context_fingerprint
    # The first answer depends on the context and the first query only.
    assert first.turns[0].token_ids == second.turns[0].token_ids
    # Sanity: the compression did keep a subset (the test is not vacuous), and another first query (multi-turn,
    # query-aware) compresses differently.
    assert len(first.kept_positions[0][0]) < len(context)
    if mode == "multi_turn":
        changed = _run(model, tokenizer, context, [queries[2], *queries[1:]], preset, mode)
        assert changed.context_fingerprint != first.context_fingerprint


@pytest.mark.parametrize("preset", ["snapkv", "h2o"])
def test_multi_request_equals_independent_agnostic_generations(setup, preset):
    """Each query answered from the shared compressed context = the same query on a fresh agnostic prefill."""
    model, tokenizer, context, queries = setup
    group = _run(model, tokenizer, context, queries, preset, "multi_request")
    for query, turn in zip(queries, group.turns, strict=True):
        alone = generate(
            model,
            tokenizer,
            context,
            query,
            method=method_from_yaml(preset),
            budget=parse_budget("32L"),
            question_mode="agnostic",
            max_new_tokens=4,
            stop_token_ids=set(),
        )
        assert turn.token_ids == alone.token_ids
        assert turn.record.final_per_layer == alone.record.final_per_layer


def test_multi_turn_accumulates_prompts_not_answers(setup):
    """Turn t sees the context, the earlier turns' prompts and its own, never an earlier answer: with the full cache
    its answer equals one generation of the concatenated prompts."""
    model, tokenizer, context, queries = setup
    group = _run(model, tokenizer, context, queries, "full", "multi_turn")
    for index, turn in enumerate(group.turns):
        prompt = [token for query in queries[: index + 1] for token in query]
        alone = generate(
            model,
            tokenizer,
            context,
            prompt,
            method=method_from_yaml("full"),
            budget=parse_budget("full"),
            question_mode="aware",
            max_new_tokens=4,
            stop_token_ids=set(),
        )
        assert turn.token_ids == alone.token_ids
    assert group.turns[2].record.final_per_layer[0] == len(context) + sum(map(len, queries)) + 3


def test_bad_mode_names_the_choices(setup):
    model, tokenizer, context, queries = setup
    with pytest.raises(ValueError, match="multi_turn"):
        _run(model, tokenizer, context, queries, "snapkv", "both")
