"""RestoreKV against NVIDIA/kvpress 0.5.5's ``RestoreKVPress`` with the same weights: kvbench's shipped CPU-trained
weights for the embedded tiny model, loaded into kvpress by PEFT (``scripts/reference/record_restorekv.py``,
``tests/fixtures/reference/learned/RestoreKVPress_tiny-niah.json``).  KVzip's scores bit for bit, kvpress's integer
counts under ``<c>cr`` with the ratio raised by ``n / S`` (one case past 1: every prompt token goes), every layer and
head keeping kvpress's positions or another valid top-k of its scores, and the restore tokens' keys and values (the
LoRA-adapted pass) equal to kvpress's cache's bit for bit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from kvbench.budget import parse_budget
from kvbench.errors import KVBenchError
from kvbench.eviction.base import build_method
from tests.methods.reference_models import selected_scores, tally_global_selection
from tests.methods.test_kvzap import LEARNED, REPO, tiny_niah
from tests.methods.wrapper_replay import KeptTally
from tests.parity.kvpress_claims import Claim, claim_of

RECORDING = "learned/RestoreKVPress_tiny-niah"
SHIPPED = REPO / "models" / "restorekv" / "tiny-niah"


def restorekv(**params):
    return build_method({"name": "restorekv", "family": "restorekv", "params": params})


def replay_restorekv(claim: Claim, form: str, dtype: str) -> KeptTally:
    """Every case of the claim's recording in ``dtype`` at ``budget=<c>cr`` (``form``: only ``cr``) with the recorded
    weights folder: kvpress's total kept, KVzip's scores bit for bit and the restore tokens' keys and values
    (asserted); per layer and head kvpress's positions, another valid top-k of its scores, or different."""
    from kvbench.inference.prefill import prefill
    from kvbench.methods.restorekv import RestoreKV

    assert form == "cr", form
    data = json.loads((LEARNED / f"{claim.recording.removeprefix('learned/')}.json").read_text())
    assert data["versions"]["kvpress"] == "0.5.5"
    tensors = load_file(str(LEARNED / f"{claim.recording.removeprefix('learned/')}.safetensors"))
    tally = KeptTally()
    for case in data["cases"]:
        if case["dtype"] != dtype:
            continue
        model, tokenizer = tiny_niah(case["dtype"])
        settings = case["settings"]
        params = {key: settings[key] for key in ("n_sink", "chunk_size", "layerwise")}
        method = claim.build(checkpoint=str(REPO / case["checkpoint"]), **params)
        length, restored = len(case["input_ids"]), case["restore_tokens"]
        with torch.inference_mode(), selected_scores(RestoreKV) as seen:
            budget = parse_budget(f"{case['compression_ratio']}cr")
            state = prefill(model, case["input_ids"], method=method, budget=budget, tokenizer=tokenizer)
        layers = state.cache.headwise_layers
        kept_prompt = [[p[p < length] for p in layer.positions] for layer in layers]
        assert sum(len(p) for layer in kept_prompt for p in layer) == sum(len(h) for lay in case["kept"] for h in lay)
        scores = seen[-1].to(getattr(torch, dtype)).clone()  # kvpress records score_val after the sinks' max + 1
        scores[..., : params["n_sink"]] = scores.amax() + 1.0
        scores = scores.float()
        assert torch.equal(scores, torch.tensor(case["scores"])), case["input_ids"][:8]
        tally_global_selection(tally, kept_prompt, case, params["layerwise"])
        keys = tensors[f"{case['restore_kv']}/keys"]
        values = tensors[f"{case['restore_kv']}/values"]  # [L, H, n, D]
        for index, layer in enumerate(layers):
            for head, positions in enumerate(layer.positions):  # the restore tokens last in every head
                assert torch.equal(positions[-restored:], torch.arange(length, length + restored))
                stored_keys, stored_values = layer.head_kv(head)  # [kept_h + n, D]
                assert torch.equal(stored_keys[-restored:], keys[index, head]), (index, head)  # bit for bit
                assert torch.equal(stored_values[-restored:], values[index, head]), (index, head)
        record = state.session.record
        assert record.evicted and record.learned_weights["source"] == "folder"
        assert record.next_position == length + restored and state.position == length + restored
    return tally


def test_restorekv_keeps_kvpress_tokens_and_restore_kv_with_the_same_weights() -> None:
    claim = claim_of(RECORDING)
    tallies = [replay_restorekv(claim, "cr", dtype) for dtype in ("float32", "bfloat16")]
    print("restorekv parity:", tallies)
    assert all(t.cases == 6 for t in tallies), tallies
    assert all(t.differ == 0 for t in tallies), tallies
    assert sum(t.same for t in tallies) >= 60, tallies  # 12 cases x 3 layers x 2 heads = 72 selections


def test_budget_sets_the_restore_slots_aside_and_positions_follow_them() -> None:
    """``64L``-style budgets keep ``T H - n L H`` prompt tokens plus the ``n`` restore tokens per layer and head; the
    question (question-agnostic mode) is fed from ``S + n``; the rows record the shipped weights."""
    from kvbench.inference.prefill import prefill

    model, tokenizer = tiny_niah("float32")
    context, question = list(range(4, 124)), list(range(200, 210))
    with torch.inference_mode():
        state = prefill(model, context, question, method=restorekv(), budget=parse_budget("40L"),
                        question_mode="agnostic", tokenizer=tokenizer)  # fmt: skip
    layers = state.cache.headwise_layers
    prompt = sum(int((p < 120).sum()) for layer in layers for p in layer.positions)
    assert prompt == 40 * 3 * 2 - 8 * 3 * 2  # T H - n L H prompt tokens
    assert all(int(((p >= 120) & (p < 128)).sum()) == 8 for layer in layers for p in layer.positions)
    assert all(int(p.max()) == 128 + 9 for layer in layers for p in layer.positions)  # the question at S+n..
    assert state.position == 120 + 8 + 10
    record = state.session.record
    assert record.extra_forwards == 2 and record.learned_weights["source"] == "shipped"
    assert "train_restorekv.py" in record.learned_weights["training"]["command"]


def test_lora_hooks_add_scaling_b_a_x_only_inside_the_block() -> None:
    from kvbench.eviction.restore_weights import load_restore, lora_applied

    model, _ = tiny_niah("float32")
    weights = load_restore.__wrapped__(str(SHIPPED))
    name = "model.layers.1.self_attn.v_proj"
    linear = model.get_submodule(name)
    x = torch.randn(1, 5, linear.in_features, generator=torch.Generator().manual_seed(0))
    a, b = weights.lora[name]
    with torch.no_grad():
        plain = linear(x)
        with lora_applied(model, weights):
            adapted = linear(x)
        after = linear(x)
    assert weights.scaling == 2.0 and float(b.abs().max()) > 0
    torch.testing.assert_close(adapted, plain + (x @ a.T @ b.T) * 2.0)
    assert torch.equal(after, plain)


def test_bad_checkpoints_are_refused_before_the_model_loads(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no-such-folder.*neither a folder"):
        restorekv(checkpoint=str(tmp_path / "no-such-folder"))
    broken = tmp_path / "broken"
    shutil.copytree(SHIPPED, broken)
    (broken / "restore_embeddings.safetensors").unlink()
    with pytest.raises(ValueError, match=r"lacks \['restore_embeddings.safetensors'\]"):
        restorekv(checkpoint=str(broken))
    dora = tmp_path / "dora"
    shutil.copytree(SHIPPED, dora)
    config = json.loads((dora / "adapter_config.json").read_text())
    (dora / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    with pytest.raises(ValueError, match="use_dora=True is not supported"):
        restorekv(checkpoint=str(dora))
    from kvbench.eviction.restore_weights import resolve_restore

    with pytest.raises(KVBenchError, match=r"train_restorekv\.py"):
        resolve_restore.__wrapped__("auto", "some-org/Unknown-7B")
    with pytest.raises(ValueError, match="allocation"):
        restorekv(allocation="ada")


def test_batched_decoding_and_the_lm_eval_bridge() -> None:
    """``run.decode_batch`` gives batch 1's tokens and records (the shipped weights, the question appended after the
    restore tokens); ``kvbench.lmeval`` compresses a context under inference mode with them."""
    from kvbench.lmeval.loglikelihood import compress_context
    from tests.inference.test_batch_decode import _requests, assert_batched_equals_alone

    model, tokenizer = tiny_niah("float32")
    method, budget = restorekv(), parse_budget("0.5cr")
    requests = _requests(model.config.vocab_size, 3, stops={7})
    for expected in assert_batched_equals_alone(model, tokenizer, method, budget, requests, "agnostic", 3):
        assert expected.record.evicted and expected.record.next_position == expected.record.context_tokens + 8
    context = compress_context(model, list(range(4, 120)), method=method, budget=parse_budget("24L"),
                               question_mode="agnostic", tokenizer=tokenizer)  # fmt: skip
    assert context.record.evicted and context.record.extra_forwards == 2
    assert context.position == 115 + 8  # the context's last token is held back, fed at S + n
