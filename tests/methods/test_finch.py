"""Finch against NVIDIA/kvpress 0.5.5's ``FinchPress`` (recorded by ``scripts/reference/record_kvzip_finch.py``):
the recorded tiny Llama (float32 and bfloat16) prefills context + question (kvpress: ``context + delimiter +
question``); every layer and head keeps kvpress's positions (or another valid top-k of its scores where they tie),
the cache stores kvpress's re-rotated keys, and the tokens after the prompt continue from kvpress's position."""

from __future__ import annotations

import pytest
import torch

from kvbench.budget import parse_budget
from kvbench.eviction.base import build_method
from kvbench.inference.generate import generate
from kvbench.inference.prefill import prefill
from kvbench.methods.finch import rerotate_keys
from tests.methods.reference_models import (
    Tally,
    assert_batched_equals_batch_one,
    recorded_tensors,
    recording,
    tiny_llama,
    tokenizer,
    valid_topk,
)

#: Largest difference allowed between kvbench's and kvpress's re-rotated keys (same kept tokens).
KEY_TOLERANCE = {"float32": 1e-5, "bfloat16": 0.0}


def finch(**params):
    return build_method({"name": "finch", "family": "finch", "params": params})


def test_finch_keeps_and_rerotates_as_kvpress_on_the_recorded_tiny_llama() -> None:
    data = recording("finch/FinchPress")
    tally, models = Tally(), {}
    for case in data["cases"]:
        dtype = case["dtype"]
        model = models.setdefault(dtype, tiny_llama(dtype, data["model_config"]))
        settings = case["settings"]
        method = finch(normalize_scores=settings["normalize_scores"], rerotate_keys=settings["rerotate_keys"])
        n_kept = len(case["kept"][0][0])
        with torch.no_grad():
            state = prefill(
                model, case["context_ids"], case["question_ids"], method=method,
                budget=parse_budget(f"{n_kept}/layer"), question_mode="aware",
            )  # fmt: skip
        tally.cases += 1
        for layer, cache_layer in enumerate(state.cache.headwise_layers):
            scores = torch.tensor(case["scores"][layer])  # [H, S]
            if settings["rerotate_keys"]:
                kept = state.session.rerotated_from[layer]
                assert all(torch.equal(p.long(), torch.arange(n_kept)) for p in cache_layer.positions)
            else:
                kept = torch.stack(cache_layer.positions)
            keys = cache_layer.dense_kv()[0].float()
            for head in range(scores.shape[0]):
                ours = sorted(kept[head].tolist())
                if ours == case["kept"][layer][head]:
                    tally.same += 1
                    # [n, D]; in top-k order without re-rotation
                    expected = recorded_tensors()[f"{case['tensors']}/layer{layer}/keys"][head].float()
                    if not settings["rerotate_keys"]:
                        nearest = (keys[head][:, None] - expected[None]).abs().amax(-1).argmin(dim=1)
                        expected = expected[nearest]
                    assert float((keys[head] - expected).abs().max()) <= KEY_TOLERANCE[dtype], (case["dtype"], layer)
                    continue
                mask = torch.zeros(scores.shape[1], dtype=torch.bool)
                mask[ours] = True
                tally.tied += valid_topk(scores[head], mask)
                tally.differ += not valid_topk(scores[head], mask)
        expected_position = (
            case["next_position"] if settings["rerotate_keys"] else len(case["context_ids"]) + len(case["question_ids"])
        )
        assert state.position == expected_position
        record = state.session.finish()
        assert record.key_positions == ("rerotated" if settings["rerotate_keys"] else "original")
    print("finch parity:", tally.summary())
    assert tally.cases == 10 and tally.differ == 0, tally.summary()
    assert tally.same >= 36, tally.summary()  # 10 cases x 2 layers x 2 heads = 40 selections


def test_generated_tokens_continue_from_the_rerotated_position() -> None:
    """Decoding feeds the tokens after the kept ones (question-agnostic mode: the question too)."""
    data = recording("finch/FinchPress")
    model = tiny_llama("float32", data["model_config"])
    ids = data["cases"][1]["context_ids"]
    for mode, expected_start in (("aware", 20), ("agnostic", 20)):
        output = generate(
            model, tokenizer("tokenizer"), ids[:-10], ids[-10:], method=finch(), budget=parse_budget("20/layer"),
            question_mode=mode, max_new_tokens=3, stop_token_ids=set(),
        )  # fmt: skip
        assert output.record.next_position == expected_start
        assert output.record.key_positions == "rerotated"
        # every layer ends with contiguous positions: the kept ones, the question (agnostic) and the generated tokens
        assert output.record.final_per_layer == [20 + (10 if mode == "agnostic" else 0) + 2] * 2


def test_rerotation_needs_equal_counts_per_head() -> None:
    with pytest.raises(ValueError, match="allocation='ada': key re-rotation needs every head"):
        finch(allocation="ada")
    with pytest.raises(ValueError, match="layers='pyramid'"):
        finch(layers="pyramid")
    model = tiny_llama("float32", recording("finch/FinchPress")["model_config"])
    with torch.no_grad():  # without re-rotation the wrappers run, and the positions stay the prompt's
        state = prefill(
            model, list(range(60)), list(range(5)), method=finch(allocation="ada", rerotate_keys=False),
            budget=parse_budget("16L"),
        )  # fmt: skip
    assert state.position == 65 and state.session.finish().key_positions == "original"


def test_batched_decoding_gives_batch_one_tokens() -> None:
    """``run.decode_batch``: every sample decodes from its own re-rotated position, in the batch as alone."""
    assert_batched_equals_batch_one("finch", "aware", 4, 3)
    assert_batched_equals_batch_one("finch", "agnostic", 3, 2)


@pytest.mark.parametrize("family", ["finch", "kvzip"])
def test_paged_backend_keeps_and_stores_what_the_torch_backend_does(family: str) -> None:
    """The paged storage (page size 8, torch kernels) re-rotates (``rewrite_keys``) and replays (``keep``) alike."""
    from kvbench.cache.kv_cache import KVBenchCache

    data = recording("finch/FinchPress")
    model = tiny_llama("bfloat16", data["model_config"])
    case = data["cases"][3]
    method = build_method({"name": family, "family": family, "params": {"chunk_size": 64} if family == "kvzip" else {}})
    caches = []
    for backend in ("torch", "paged"):
        with torch.no_grad():
            state = prefill(
                model, case["context_ids"], case["question_ids"], method=method, budget=parse_budget("30L"),
                cache=KVBenchCache(2, backend=backend, page_size=8), tokenizer=tokenizer("tokenizer"),
            )  # fmt: skip
        caches.append((state.position, state.session.finish().to_json(), state.cache))
    (position, record, torch_cache), (paged_position, paged_record, paged_cache) = caches
    assert (paged_position, paged_record["achieved_per_head"]) == (position, record["achieved_per_head"])
    for ours, paged in zip(torch_cache.headwise_layers, paged_cache.headwise_layers, strict=True):
        assert type(ours).__name__ != type(paged).__name__
        for head in range(ours.num_heads):
            assert torch.equal(ours.positions[head], paged.positions[head])
            assert torch.equal(ours.head_kv(head)[0], paged.head_kv(head)[0])


def test_rerotation_of_seeded_keys_equals_kvpress() -> None:
    """``KeyRerotationPress.rerotate_keys`` on seeded random keys and kept positions (the tiny Llama's rotary):
    bitwise equal in float32 and bfloat16."""
    from kvbench.inference.prefill import rotary_tables

    data = recording("finch/KeyRerotationPress")
    rotary = rotary_tables(tiny_llama("float32", recording("finch/FinchPress")["model_config"]))
    assert rotary is not None
    for case in data["cases"]:
        kept_keys = recorded_tensors()[f"{case['tensors']}/kept_keys"]
        expected = recorded_tensors()[f"{case['tensors']}/rotated"]
        got = rerotate_keys(kept_keys, torch.tensor(case["positions"]), rotary)
        assert got.dtype == expected.dtype and torch.equal(got, expected), case["tensors"]
    assert len(data["cases"]) == 6
