"""ThinK (``method=think``): kvpress ThinKPress's channels, stored for real on both cache backends.

Parity: ``tests/fixtures/reference/think/ThinKPress.json`` (recorded by ``scripts/reference/record_think.py`` in
kvpress 0.5.5's own venv): per case, layer and KV head the key channels ThinKPress kept, on seeded tensors and on the
tiny random Llama (alone and after SnapKVPress), float32 and bfloat16.  kvbench must keep the same channels (and,
composed, the same tokens).  Then the storage: fewer key channels are stored (``stored_bytes`` below the token
method's on the torch and paged backends), attention over them equals attention over kvpress's keys (the context's
pruned channels zeroed, later keys whole; zeroed too with ``prune_appended``), the tiny Llama decodes as over
kvpress's keys on both backends, and batched decoding gives the batch-1 tokens.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from kvbench.attention.function import kvbench_attention_forward
from kvbench.budget import parse_budget
from kvbench.cache.kv_cache import KVBenchCache
from kvbench.config import MethodConfig
from kvbench.eviction.base import build_method
from kvbench.inference.eviction import EvictionSession
from kvbench.methods.think import think_kept_channels
from tests.methods.helpers import CONF, LayerIndex, method_from_yaml
from tests.methods.kvpress_replay import model_queries
from tests.reference_recordings import DTYPES, stored_input

#: SnapKV's knobs in the think preset (a token method that does not declare them gets them removed).
VOTE_KNOB_NAMES = ("kernel_size", "pooling", "pool_padding", "gqa_reduce", "score_dtype")

RECORDING = Path(__file__).resolve().parents[1] / "fixtures" / "reference" / "think"


@cache
def recording() -> dict:
    return json.loads((RECORDING / "ThinKPress.json").read_text())


def case_id(case: dict) -> str:
    composed = "+snapkv" if case["token_press"] else ""
    return f"{case['inputs']}/{case['dtype']}/r{case['key_channel_compression_ratio']}{composed}"


def layer_inputs(case: dict, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keys, values ``[H_kv, S, D]`` and queries ``[H_q, R, D]`` (tensor cases: the 32 seeded window queries; model
    cases: every prompt query, as the tiny Llama computed them) in the case's dtype."""
    dtype = DTYPES[case["dtype"]]
    if case["kind"] == "tensor":
        length = case["inputs"].split("/S")[1]
        keys = stored_input(f"tensor/keys_S{length}").to(dtype)[0]
        values = stored_input(f"tensor/values_S{length}").to(dtype)[0]
        queries = load_file(RECORDING / "queries.safetensors")[case["queries"]].to(dtype)[0]
        return keys, values, queries
    prefix = f"{case['inputs']}/layer{layer}/"
    inputs = {name: stored_input(prefix + name) for name in ("hidden_states", "keys", "values")}
    queries = model_queries(SimpleNamespace(dtype=case["dtype"]), layer, inputs)
    return inputs["keys"].to(dtype)[0], inputs["values"].to(dtype)[0], queries


def prefill_layer(method, budget: str, keys, values, queries, backend: str = "torch") -> KVBenchCache:
    """One layer's prompt stored and compressed by ``method`` (the queries as the prompt's last chunk)."""
    cache = KVBenchCache(1, backend=backend)
    cache.update(keys[None], values[None], 0)
    session = EvictionSession(method, parse_budget(budget), cache)
    session.begin_prefill(keys.shape[1])
    session.after_attention(LayerIndex(0), queries[None], keys.shape[-1] ** -0.5)
    session.begin_decode()
    return cache


def think_method(ratio: float, tokens: str = "knorm"):
    """The think preset over ``tokens`` (other than snapkv: without the SnapKV knobs the token method does not
    declare)."""
    if tokens == "snapkv":
        return method_from_yaml("think", params={"tokens": tokens, "key_channel_compression_ratio": ratio})
    raw = OmegaConf.load(CONF / "method" / "think.yaml")
    raw.pop("defaults", None)
    node = OmegaConf.merge(OmegaConf.structured(MethodConfig), raw)
    node.params = {k: v for k, v in node.params.items() if k not in VOTE_KNOB_NAMES}
    node.params.update({"tokens": tokens, "key_channel_compression_ratio": ratio})
    return build_method(node)


def test_kvbench_keeps_kvpress_channels_on_every_recorded_case() -> None:
    """Every case, layer and KV head: the channels kvbench stores are ThinKPress's (tensor and model cases alone:
    the token method keeps every token; composed: snapkv_kvpress's tokens at kvpress's budget, then the channels)."""
    cases = recording()["cases"]
    compared = agree = 0
    for case in cases:
        ratio = case["key_channel_compression_ratio"]
        for layer, expected in enumerate(case["kept_channels"]):
            keys, values, queries = layer_inputs(case, layer)
            length = keys.shape[1]
            if case["token_press"] is None:
                method, budget = think_method(ratio), f"{length}/layer"  # ThinKPress alone: every token kept
                direct = think_kept_channels(queries[:, -32:], list(keys), ratio)
                assert direct is not None and direct.tolist() == expected, case_id(case)
            else:
                kept = max(1, int(length * (1 - case["token_press"]["compression_ratio"])))
                method, budget = think_method(ratio, tokens="snapkv"), f"{kept}/layer"
            stored = prefill_layer(method, budget, keys, values, queries).layers[0]
            assert stored.key_channels is not None
            got = stored.key_channels.tolist()
            compared += len(expected)
            agree += sum(g == e for g, e in zip(got, expected, strict=True))
            assert got == expected, f"{case_id(case)} layer {layer}"
            if case["token_press"] is not None:
                positions = [sorted(p.tolist()) for p in stored.positions]
                assert positions == [sorted(p) for p in case["kept_tokens"][layer]], f"{case_id(case)} layer {layer}"
    assert {c["dtype"] for c in cases} == {"float32", "bfloat16"} and {c["kind"] for c in cases} == {"tensor", "model"}
    assert compared == agree and compared >= 100  # (head, layer) selections compared


def test_a_ratio_that_prunes_nothing_keeps_every_channel() -> None:
    keys = torch.randn(2, 40, 16)
    queries = torch.randn(4, 40, 16)
    assert think_kept_channels(queries, list(keys), 0.05) is None  # int(16 * 0.05) = 0, as kvpress returns early
    stored = prefill_layer(think_method(0.05), "20/layer", keys, keys.clone(), queries).layers[0]
    assert stored.key_channels is None and stored.head_kv(0)[0].shape == (20, 16)


@pytest.mark.parametrize("backend", ["torch", "paged"])
def test_stored_bytes_are_below_the_token_methods_on_both_backends(backend: str) -> None:
    """Same tokens as the token method alone, half the key channels: ``(D/2 + D)`` bytes per token and head instead
    of ``2 D``; both backends report the same number; the full-cache reference still counts every channel."""
    generator = torch.Generator().manual_seed(5)
    keys, values = torch.randn(2, 200, 16, generator=generator), torch.randn(2, 200, 16, generator=generator)
    queries = torch.randn(4, 200, 16, generator=generator)
    plain = prefill_layer(method_from_yaml("snapkv_kvpress"), "64/layer", keys, values, queries, backend)
    think = prefill_layer(method_from_yaml("think"), "64/layer", keys, values, queries, backend)
    assert [p.tolist() for p in think.layers[0].positions] == [p.tolist() for p in plain.layers[0].positions]
    assert plain.stored_bytes() == 2 * 64 * (16 + 16) * 4
    assert think.stored_bytes() == 2 * 64 * (8 + 16) * 4 < plain.stored_bytes()
    assert think.full_cache_bytes() == plain.full_cache_bytes() == 2 * 200 * 32 * 4
    assert think.allocated_bytes() < plain.allocated_bytes()


@pytest.mark.parametrize("prune_appended", [False, True])
@pytest.mark.parametrize("backend", ["torch", "paged"])
def test_attention_over_pruned_keys_equals_attention_over_zeroed_keys(backend: str, prune_appended: bool) -> None:
    """After pruning, a question chunk, a decoding step, a one-token eviction and another step: attention equals SDPA
    over kvpress's keys (the context's dropped channels zeroed; later keys whole by default, zeroed too with
    ``prune_appended``) at the model's scale, ragged heads included; the bytes count each part's real width."""
    generator = torch.Generator().manual_seed(9)
    keys, values = torch.randn(1, 2, 30, 16, generator=generator), torch.randn(1, 2, 30, 16, generator=generator)
    cache = KVBenchCache(1, backend=backend)
    cache.update(keys, values, 0)
    layer = cache.layers[0]
    kept_tokens = [torch.arange(0, 30, 2), torch.arange(0, 30, 3)]  # ragged: 15 and 10 tokens
    layer.keep(kept_tokens)
    channels = torch.stack([torch.randperm(16, generator=generator)[:6] for _ in range(2)])
    layer.prune_key_channels(channels, prune_appended=prune_appended)
    mask = torch.zeros(2, 16).scatter(1, channels, 1.0)
    later_mask = mask if prune_appended else torch.ones(2, 16)
    stored_k = [keys[0, h, kept_tokens[h]] * mask[h] for h in range(2)]
    stored_v = [values[0, h, kept_tokens[h]] for h in range(2)]
    for new in (3, 1, 0, 1):  # a question chunk, a decoding step, an eviction (0), another step
        if new == 0:  # head 0 evicts a context slot, head 1 an appended one: each last token moves there
            slots, heads = torch.tensor([2, 11]), [0, 1]
            layer.evict_slots(slots, heads)
            for h, slot in zip(heads, slots.tolist(), strict=True):
                for stored in (stored_k, stored_v):
                    stored[h][slot] = stored[h][-1]
                    stored[h] = stored[h][:-1]
            continue
        new_k, new_v = torch.randn(1, 2, new, 16, generator=generator), torch.randn(1, 2, new, 16, generator=generator)
        query = torch.randn(1, 4, new, 16, generator=generator)
        key_out, value_out = cache.update(new_k, new_v, 0)
        output, _ = kvbench_attention_forward(LayerIndex(0), query, key_out, value_out, None, 0.25, kvbench_cache=cache)
        for h in range(2):
            stored_k[h] = torch.cat([stored_k[h], new_k[0, h] * later_mask[h]])
            stored_v[h] = torch.cat([stored_v[h], new_v[0, h]])
            causal = torch.ones(new, stored_k[h].shape[0], dtype=torch.bool).tril(stored_k[h].shape[0] - new)
            expected = torch.nn.functional.scaled_dot_product_attention(
                query[0, 2 * h : 2 * h + 2], stored_k[h][None].expand(2, -1, -1), stored_v[h][None].expand(2, -1, -1),
                attn_mask=causal, scale=0.25,
            )  # fmt: skip
            torch.testing.assert_close(output[0, :, 2 * h : 2 * h + 2], expected.transpose(0, 1))
    # 15 + 5 - 1 and 10 + 5 - 1 tokens; head 0 evicted a context token, head 1 an appended one
    if prune_appended:
        assert layer.head_kv(0)[0].shape == (19, 6) and cache.stored_bytes() == (19 + 14) * (6 + 16) * 4
    else:
        torch.testing.assert_close(layer.head_kv(0)[0], stored_k[0], rtol=0, atol=0)
        assert cache.stored_bytes() == (19 + 14) * (6 + 16) * 4 + (5 + 4) * (16 - 6) * 4
        kept = [torch.tensor([2, 5, 17, 18]), torch.tensor([0, 9, 12])]  # appended tokens follow their slots
        layer.keep(kept)
        for h in range(2):
            torch.testing.assert_close(layer.head_kv(h)[0], stored_k[h][kept[h]], rtol=0, atol=0)
        assert cache.stored_bytes() == 7 * (6 + 16) * 4 + (3 + 1) * (16 - 6) * 4


def test_a_layer_is_pruned_once_and_bad_channels_are_refused() -> None:
    cache = KVBenchCache(1)
    cache.update(torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8), 0)
    layer = cache.layers[0]
    with pytest.raises(IndexError, match="out of range"):
        layer.prune_key_channels(torch.tensor([[0, 8], [1, 2]]))
    with pytest.raises(ValueError, match="duplicate"):
        layer.prune_key_channels(torch.tensor([[1, 1], [1, 2]]))
    layer.prune_key_channels(torch.tensor([[3, 0], [1, 2]]))
    assert layer.key_channels.tolist() == [[0, 3], [1, 2]]
    with pytest.raises(ValueError, match="already pruned"):
        layer.prune_key_channels(torch.tensor([[0], [1]]))


def test_bad_think_knobs_name_the_valid_choices() -> None:
    with pytest.raises(ValueError, match="key_channel_compression_ratio"):
        think_method(1.5)
    with pytest.raises(ValueError, match="tokens='think'"):
        think_method(0.5, tokens="think")
    with pytest.raises(Exception, match="snapkv"):  # the registry lists the families
        think_method(0.5, tokens="no_such_family")


@pytest.mark.parametrize("mode", ["aware", "agnostic"])
def test_think_batched_decoding_gives_the_batch_one_tokens(mode: str) -> None:
    """Batch 3 gives batch 1's tokens and cache records (agnostic: the question is appended whole after the pruning)."""
    from tests.inference.test_batch_decode import _compare, _model, _requests

    model, tokenizer = _model("tiny-random-llama")
    _compare(model, tokenizer, "think", _requests(model.config.vocab_size, 3, set()), 3, mode)


def _greedy_after_prefill(model, context, question, method, cache, steps: int, zero_channels=None):
    """Prefill ``context`` (compressed) with ``question`` appended on top, then ``steps`` greedy steps; returns the
    logits ``[steps + 1, vocab]`` (after the question, then after each generated token).  ``zero_channels``: per
    layer ``[H, D_k]`` channels; the stored context keys' other channels are zeroed before the question (kvpress)."""
    from kvbench.inference.prefill import forward_logits, prefill

    state = prefill(model, context, (), method=method, budget=parse_budget("24L"), cache=cache)
    if zero_channels is not None:
        for layer, channels in zip(cache.layers, zero_channels, strict=True):
            keys, _ = layer.dense_kv()
            mask = torch.zeros(keys.shape[0], keys.shape[-1]).scatter(1, channels, 1.0)
            layer.rewrite_keys(keys * mask[:, None, :], torch.stack(layer.positions))
    state.session.begin_append()
    logits = [forward_logits(model, question, len(context), cache, state.session, torch.device("cpu"))[-1]]
    state.session.begin_decode()
    for step in range(steps):
        token = int(logits[-1].argmax())
        logits.append(
            forward_logits(model, [token], len(context) + len(question) + step, cache, state.session, "cpu")[-1]
        )
    return torch.stack(logits)


def test_think_decodes_as_kvpress_over_zeroed_context_keys_on_both_backends() -> None:
    """The tiny Llama, question-agnostic: ThinK (default) gives the logits of SnapKV's kept tokens with the context
    keys' pruned channels zeroed and the question's and generated keys whole (kvpress's ThinKPress), on the torch and
    paged backends; ``prune_appended`` (kvbench's switch) differs from it."""
    from tests.inference.test_batch_decode import _model

    model, _ = _model("tiny-random-llama")
    layers = model.config.num_hidden_layers
    ids = torch.randint(5, 250, (90,), generator=torch.Generator().manual_seed(4)).tolist()
    context, question = ids[:-8], ids[-8:]
    with torch.no_grad():
        think_cache = KVBenchCache(layers, backend="torch")
        think = _greedy_after_prefill(model, context, question, method_from_yaml("think"), think_cache, 4)
        channels = [layer.key_channels for layer in think_cache.layers]
        assert all(c is not None and c.shape[1] == model.config.head_dim // 2 for c in channels)
        reference_cache = KVBenchCache(layers)
        reference = _greedy_after_prefill(
            model, context, question, method_from_yaml("snapkv_kvpress"), reference_cache, 4, channels
        )
        paged = _greedy_after_prefill(
            model, context, question, method_from_yaml("think"), KVBenchCache(layers, backend="paged"), 4
        )
        pruned_later = _greedy_after_prefill(
            model, context, question, method_from_yaml("think", prune_appended=True), KVBenchCache(layers), 4
        )
    torch.testing.assert_close(think, reference, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(paged, think, rtol=1e-5, atol=1e-5)
    assert think.argmax(-1).tolist() == reference.argmax(-1).tolist()
    assert not torch.allclose(pruned_later, think, rtol=1e-4, atol=1e-4)
    assert think_cache.stored_bytes() < reference_cache.stored_bytes()  # the question and answer stored whole


@pytest.mark.parametrize("backend", ["torch", "paged"])
def test_appended_whole_keys_follow_random_appends_evictions_and_keeps(backend: str) -> None:
    """60 decoding steps with one-token evictions on random heads and a ``keep``: every head's keys read back are
    kvpress's (pruned context channels zero, appended keys whole) while the rows of evicted tokens are dropped."""
    generator = torch.Generator().manual_seed(0)
    cache = KVBenchCache(1, backend=backend)
    keys = torch.randn(1, 3, 20, 8, generator=generator)
    cache.update(keys, torch.randn(1, 3, 20, 8, generator=generator), 0)
    layer = cache.layers[0]
    channels = torch.stack([torch.randperm(8, generator=generator)[:3] for _ in range(3)])
    layer.prune_key_channels(channels)
    mask = torch.zeros(3, 8).scatter(1, channels, 1.0)
    expected = [keys[0, h] * mask[h] for h in range(3)]
    for step in range(60):
        new = torch.randn(1, 3, 1, 8, generator=generator)
        cache.update(new, torch.randn(1, 3, 1, 8, generator=generator), 0)
        expected = [torch.cat([expected[h], new[0, h]]) for h in range(3)]
        heads = [h for h in range(3) if float(torch.rand(1, generator=generator)) < 0.7]
        slots = [int(torch.randint(0, expected[h].shape[0], (1,), generator=generator)) for h in heads]
        if heads:
            layer.evict_slots(torch.tensor(slots), heads)
        for h, slot in zip(heads, slots, strict=True):
            expected[h][slot] = expected[h][-1]
            expected[h] = expected[h][:-1]
        if step == 30:
            kept = [torch.randperm(len(e), generator=generator)[: len(e) - 3].sort().values for e in expected]
            layer.keep(kept)
            expected = [e[k] for e, k in zip(expected, kept, strict=True)]
        for h in range(3):
            torch.testing.assert_close(layer.head_kv(h)[0], expected[h], rtol=0, atol=0)
    assert layer.appended_keys.rows.shape[0] < 60  # the rows of evicted tokens were dropped when the store grew
