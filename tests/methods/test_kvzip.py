"""KVzip against NVIDIA/kvpress 0.5.5's ``KVzipPress`` (recorded by ``scripts/reference/record_kvzip_finch.py``):
the recorded tiny Llama (float32 and bfloat16) prefills seeded prompts through kvbench's prefill, which replays the
context (repeat prompt, chunks) through kvbench's own forward, cache and attention; every layer and head keeps
kvpress's positions, or another valid top-k of kvpress's scores where they tie."""

from __future__ import annotations

import pytest
import torch

from kvbench.budget import parse_budget
from kvbench.eviction.base import build_method
from kvbench.inference.prefill import prefill
from kvbench.methods.kvzip import FIRST_PROMPT, NEXT_PROMPT, chat_template_parts
from tests.methods.reference_models import (
    Tally,
    assert_batched_equals_batch_one,
    exact_total,
    recording,
    tally_global_selection,
    tiny_llama,
    tokenizer,
    valid_topk,
)
from tests.methods.wrapper_replay import KeptTally
from tests.parity.kvpress_claims import Claim, claim_of


def kvzip(**params):
    return build_method({"name": "kvzip", "family": "kvzip", "params": params})


def run_case(case: dict, config: dict, models: dict, method=None):
    """The case at kvpress's ratio spelled ``budget=<c>cr`` (issue #54: kvpress's global ``L H S - int(L H S c)``,
    150 tokens at S 150, c 0.75, where ``L H int(S (1 - c))`` would be 148); every head's count checked below."""
    model = models.setdefault(case["dtype"], tiny_llama(case["dtype"], config))
    kept_total = sum(len(head) for layer in case["kept"] for head in layer)
    with torch.no_grad():
        state = prefill(
            model,
            case["input_ids"],
            method=method or kvzip(**case["settings"]),
            budget=parse_budget(f"{case['compression_ratio']}cr"),
            tokenizer=tokenizer(case["tokenizer"]),
        )
    assert sum(len(p) for layer in state.cache.headwise_layers for p in layer.positions) == kept_total
    return state


def replay_kvzip(claim: Claim, form: str, dtype: str) -> KeptTally:
    """Every case of the claim's recording (``kvzip/KVzipPress``) in ``dtype`` at ``budget=<c>cr`` (``form``: only
    ``cr``): kvpress's total kept (asserted), per layer and head kvpress's positions, another valid top-k of its scores
    (over all layers, or per layer when ``layerwise``), or different."""
    assert form == "cr", form
    data = recording(claim.recording)
    tally, models = KeptTally(), {}
    for case in data["cases"]:
        if case["dtype"] != dtype:
            continue
        state = run_case(case, data["model_config"], models, claim.build(**case["settings"]))
        tally_global_selection(tally, state.cache.headwise_layers, case, case["settings"]["layerwise"])
        length, chunk = len(case["input_ids"]), case["settings"]["chunk_size"]
        prefix, _ = chat_template_parts(tokenizer(case["tokenizer"]))
        assert state.session.record.extra_forwards == -(-(length - prefix) // chunk)
        assert state.position == length  # positions are not moved
    return tally


def test_kvzip_keeps_kvpress_tokens_on_the_recorded_tiny_llama() -> None:
    tallies = [replay_kvzip(claim_of("kvzip/KVzipPress"), "cr", dtype) for dtype in ("float32", "bfloat16")]
    print("kvzip parity:", tallies)
    assert sum(t.cases for t in tallies) == 12 and all(t.differ == 0 for t in tallies), tallies
    assert sum(t.same for t in tallies) >= 40, tallies  # 12 cases x 2 layers x 2 heads = 48 selections


def test_replay_passes_follow_kvpress_prompts_and_chat_template() -> None:
    chat = tokenizer("tokenizer_chat")
    prefix, suffix = chat_template_parts(chat)
    assert (prefix, suffix) == (len("[user]"), chat.encode("[assistant]"))
    assert chat_template_parts(tokenizer("tokenizer")) == (0, tokenizer("tokenizer").encode("\n"))
    ids = list(range(10, 60))
    passes = kvzip(chunk_size=20).scorer.replay_passes(ids, chat)
    assert [(start, end) for _, start, end in passes] == [(6, 26), (26, 46), (46, 50)]
    first, second = passes[0][0], passes[1][0]
    assert first == chat.encode(FIRST_PROMPT) + suffix + ids[6:26]
    assert second == chat.encode(NEXT_PROMPT) + ids[18:26] + suffix + ids[26:46]


def test_kvzip_per_layer_budget_keeps_the_same_count_per_layer_and_varies_heads() -> None:
    data = recording("kvzip/KVzipPress")
    case = data["cases"][2]
    model = tiny_llama("float32", data["model_config"])
    with torch.no_grad():
        state = prefill(
            model, case["input_ids"], method=kvzip(chunk_size=64), budget=parse_budget("30/layer"),
            tokenizer=tokenizer("tokenizer"),
        )  # fmt: skip
    record = state.session.finish()
    assert [sum(heads) for heads in record.achieved_per_head] == [60, 60]
    assert record.extra_forwards == 3 and record.evicted


def test_kvzip_refuses_wrappers_and_a_missing_tokenizer() -> None:
    with pytest.raises(ValueError, match="allocation"):
        kvzip(allocation="ada")
    model = tiny_llama("float32", recording("kvzip/KVzipPress")["model_config"])
    with pytest.raises(ValueError, match="tokenizer"), torch.no_grad():
        prefill(model, list(range(40)), method=kvzip(), budget=parse_budget("8L"))


def test_batched_decoding_gives_batch_one_tokens() -> None:
    """``run.decode_batch``: each sample replays its context alone, then decodes in the batch (tokens, records)."""
    assert_batched_equals_batch_one("kvzip", "aware", 4, 3)
    assert_batched_equals_batch_one("kvzip", "agnostic", 3, 2)


def test_selection_on_seeded_scores_equals_kvpress() -> None:
    """``KVzipPress.compress_post`` alone on seeded random scores, some rounded to a few values (many ties): the
    same kept positions per layer and head, or another valid top-k of the scores (over all layers, or per layer)."""
    data = recording("kvzip/KVzipPress_select")
    tally = Tally()
    for case in data["cases"]:
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[case["dtype"]]
        scores = torch.tensor(case["scores"]).to(dtype)  # [L, H, S]
        final = torch.tensor(case["final_scores"])  # after the sinks' max + 1
        theirs = torch.zeros(final.shape, dtype=torch.bool)
        for layer, heads in enumerate(case["kept"]):
            for head, positions in enumerate(heads):
                theirs[layer, head, positions] = True
        layers, heads, _ = scores.shape
        layerwise = case["settings"]["layerwise"]
        method = kvzip(layerwise=layerwise)
        kept = method.scorer.select(list(scores.unbind(0)), int(theirs.sum()), None)
        ours = torch.zeros_like(theirs)
        for layer, per_head in enumerate(kept):
            for head, positions in enumerate(per_head):
                ours[layer, head, positions] = True
        tally.cases += 1
        scope = list(zip(final.unbind(0), ours.unbind(0), strict=True)) if layerwise else [(final, ours)]
        valid = all(valid_topk(s, m) for s, m in scope)
        for layer in range(layers):
            for head in range(heads):
                if torch.equal(ours[layer, head], theirs[layer, head]):
                    tally.same += 1
                elif valid and int(ours.sum()) == int(theirs.sum()):
                    tally.tied += 1
                else:
                    tally.differ += 1
    print("kvzip selection parity:", tally.summary())
    assert tally.cases == 10 and tally.differ == 0, tally.summary()


@pytest.mark.parametrize("family", ["kvzip", "finch"])
def test_press_onto_a_users_generate_is_refused_by_name(family: str) -> None:
    """``kvbench.press`` runs the prompt's last segment through the model's own forward: a method that replays the
    context or moves positions after the prefill cannot, and says so."""
    import kvbench

    model = tiny_llama("float32", recording("kvzip/KVzipPress")["model_config"])
    method = build_method({"name": family, "family": family})
    ids = torch.tensor([list(range(1, 60))])
    refused = pytest.raises(ValueError, match=f"method '{family}' runs forwards of its own")
    with refused, torch.no_grad(), kvbench.press(model, method, parse_budget("8L")):
        model.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=0)


def test_keep_prefix_protects_the_chat_template_prefix_that_kvpress_evicts_first() -> None:
    """kvpress never scores the chat template's prefix past ``n_sink`` (0: evicted first, as recorded); the switch
    ``keep_prefix`` protects it, as the original KVzip protects its system prompt."""
    data = recording("kvzip/KVzipPress")
    case = data["cases"][1]  # the chat tokenizer: a 6-token prefix, n_sink 4
    assert all(4 not in head and 5 not in head for layer in case["kept"] for head in layer)
    model = tiny_llama("float32", data["model_config"])
    with torch.no_grad():
        state = prefill(
            model, case["input_ids"], method=kvzip(keep_prefix=True), budget=exact_total(24),
            tokenizer=tokenizer("tokenizer_chat"),
        )  # fmt: skip
    kept = [set(p.tolist()) for layer in state.cache.headwise_layers for p in layer.positions]
    assert all(set(range(6)) <= head for head in kept)
    assert sum(map(len, kept)) == sum(len(head) for layer in case["kept"] for head in layer)


def test_lm_eval_bridge_replays_with_its_tokenizer_and_scores_after_rerotated_keys() -> None:
    """``kvbench.lmeval``: KVzip replays the context with the harness's tokenizer; after Finch's re-rotation the
    continuation is fed from the kept tokens' next position (question-agnostic: the context's last token first)."""
    from kvbench.lmeval.loglikelihood import compress_context

    model = tiny_llama("float32", recording("kvzip/KVzipPress")["model_config"])
    ids = list(range(1, 90))
    for family, position, forwards in (("kvzip", 88, 1), ("finch", 10, 0)):
        method = build_method({"name": family, "family": family})
        context = compress_context(
            model, ids, method=method, budget=parse_budget("10L"), question_mode="agnostic",
            tokenizer=tokenizer("tokenizer"),
        )  # fmt: skip
        assert (context.position, context.record.extra_forwards) == (position, forwards), family
        assert context.record.evicted


def test_no_observation_window_warning_for_a_method_without_a_window(caplog) -> None:
    """KVzip has no observation window: layers below ``method.window`` tokens are not warned about (a method that
    protects one still is: ``tests/faults/test_sweeps_and_budgets.py``)."""
    import logging

    import kvbench
    from kvbench.run.records import keeps_window, warn_if_not_as_asked

    cfg = kvbench.compose_config(method="kvzip", budget="64L")
    assert not keeps_window(cfg) and keeps_window(kvbench.compose_config(method="snapkv"))
    assert keeps_window(kvbench.compose_config(method="knorm", overrides=["method.params.keep_window=true"]))
    with caplog.at_level(logging.WARNING):
        warn_if_not_as_asked({"requested_per_layer": [90, 12], "evicted": True, "context_tokens": 500}, cfg)
    assert "is wider than the per-layer budget" not in caplog.text
