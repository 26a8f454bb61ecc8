"""The decode batch's shared page pool (issue #46), counted from outside: a pooled step runs one attention call per
layer and the same operations at any batch size (no per-sample work), with no host synchronisation; pages come back
to the pool when a sample leaves; key and value head dims may differ.  That pooled decoding gives batch 1's tokens and
cache records is ``tests/inference/test_batch_decode.py``'s business (generate_batched pools there).
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest
import torch

import kvbench.attention  # noqa: F401  (registers the "kvbench" attention)
import kvbench.attention.pooled as pooled_module
from kvbench import kernels
from kvbench.bench.random_models import load_method
from kvbench.budget import parse_budget
from kvbench.cache.kv_cache import HeadwiseLayer
from kvbench.cache.pool import PooledLayer, grown_capacities
from kvbench.inference.batched_decode import DecodeRequest, generate_batched
from kvbench.inference.decode_pool import DECODE_PATHS, PooledBatch, decode_path, pool_supported
from kvbench.inference.prefill import prefill
from kvbench.kernels.paths import AttentionPlan
from kvbench.models.loading import build_builtin, byte_level_tokenizer
from kvbench.run.generation import decode_path_settings
from tests.inference.test_decode_cost import OpCounter

CPU = torch.device("cpu")
#: Every decode policy that steps a pool's rows, and the full cache (no policy).
METHODS = ["full", "streamingllm", "h2o", "tova", "cake", "ahakv"]
HOST_READS = ("item", "tolist", "cpu", "numpy")


@pytest.fixture(scope="module")
def tiny_gqa():
    model, _ = build_builtin("tiny-random-llama", seed=3)
    model.set_attn_implementation("kvbench")
    return model.eval()


PROMPT = torch.randint(5, 250, (70,), generator=torch.Generator().manual_seed(0)).tolist()


def _session(model, method, budget):
    """One prefilled sample of :data:`PROMPT`, ready to decode, and its prefill's state."""
    state = prefill(model, PROMPT[:-8], PROMPT[-8:], method=method, budget=budget)
    state.session.begin_decode()
    return state


def _batch(model, name: str, size: int) -> tuple[PooledBatch, int, int]:
    """``size`` samples of one prompt (so every sample crosses pages at the same steps) in a pooled batch."""
    method, budget = load_method(name), parse_budget("40L")  # caps above the windows (CAKE: 32)
    batch = PooledBatch()
    for _ in range(size):
        state = _session(model, method, budget)
        batch.join(state.session)
    assert state.logits is not None
    return batch, int(state.logits.argmax()), state.position


class HostReads:
    """Counts ``Tensor.item/tolist/cpu/numpy`` calls (what reads a device value back to the host)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: Counter[str] = Counter()
        for name in HOST_READS:
            original = getattr(torch.Tensor, name)

            def counted(tensor, *args, _name=name, _original=original, **kwargs):
                self.calls[_name] += 1
                return _original(tensor, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)


def _counted_step(model, name: str, size: int, monkeypatch: pytest.MonkeyPatch):
    """Three warm-up steps, then one counted step: its aten ops, host reads and attention calls."""
    batch, token, position = _batch(model, name, size)
    with torch.inference_mode():
        for step in range(3):
            batch.step(model, [token] * size, [position + step] * size, CPU)
        calls = []
        original = pooled_module.padded_rows_attention
        with monkeypatch.context() as patch:
            patch.setattr(pooled_module, "padded_rows_attention", lambda *a: calls.append(1) or original(*a))
            reads = HostReads(patch)
            with OpCounter() as counter:
                batch.step(model, [token] * size, [position + 3] * size, CPU)
    return counter, reads.calls, len(calls), batch


@pytest.mark.parametrize("name", METHODS)
def test_a_pooled_step_is_one_attention_call_per_layer_and_does_not_grow_with_the_batch(tiny_gqa, name, monkeypatch):
    """At 2 and at 4 samples: one attention call per layer, no host read or sync op, and exactly the same aten
    operations (attention, the policy's step, the appends: nothing runs per sample)."""
    layers = tiny_gqa.config.num_hidden_layers
    two, reads_two, attention_two, batch = _counted_step(tiny_gqa, name, 2, monkeypatch)
    four, reads_four, attention_four, _ = _counted_step(tiny_gqa, name, 4, monkeypatch)
    assert attention_two == attention_four == layers
    assert two.syncs == four.syncs == []
    assert reads_two == reads_four == Counter()
    assert two.ops == four.ops
    if name != "full":  # the policy did evict: each sample's heads stay at their caps
        state = batch.state
        assert all(batch.pools[idx].head_lengths() == state.layer_caps(idx) for idx in batch.sessions[0].compressible)


def test_pages_return_to_the_pool_when_a_sample_leaves(tiny_gqa) -> None:
    """A sample leaving frees its pages; the next sample to join reuses them (the pool does not grow), and the leaving
    sample's own cache holds its rows again, slot for slot."""
    batch, token, position = _batch(tiny_gqa, "h2o", 3)
    with torch.inference_mode():
        batch.step(tiny_gqa, [token] * 3, [position] * 3, CPU)
        pool = batch.pools[0]
        rows = pool.heads_per_sample
        keys, _, positions = pool.padded_kv()
        lengths = pool.head_lengths()[rows : 2 * rows]
        leaving = batch.sessions[1]
        pages, free = pool.num_pages, len(pool.free_pages)
        batch.leave(leaving)
        assert len(pool.free_pages) > free and pool.num_pages == pages
        own = leaving.cache.headwise_layers[0]
        assert own.head_lengths() == lengths
        for head in range(rows):
            stored = own.head_kv(head)[0]
            assert torch.equal(stored, keys[rows + head, : lengths[head]])
            assert torch.equal(own.positions[head], positions[rows + head, : lengths[head]])
        batch.join(_session(tiny_gqa, leaving.method, leaving.budget).session)
        assert pool.num_pages == pages and pool.num_samples == 3


def test_key_and_value_head_dims_may_differ() -> None:
    """A layer storing fewer key channels than value channels pools, attends and goes back unchanged."""
    gen = torch.Generator().manual_seed(0)
    layers = []
    for length in (5, 9):
        layer = HeadwiseLayer()
        layer.update(torch.randn(1, 2, length, 8, generator=gen), torch.randn(1, 2, length, 16, generator=gen))
        layers.append(layer)
    expected = [(layer.head_kv(0)[0].clone(), layer.head_kv(1)[1].clone()) for layer in layers]
    pool = PooledLayer(2, 8, 16, torch.float32, CPU)
    for layer in layers:
        pool.admit(layer)
    query = torch.randn(4, 3, 8, generator=gen)  # 2 samples x 2 heads, 3 query heads each
    out = pooled_module.padded_rows_attention(query, pool, 0.5)
    assert out.shape == (4, 3, 16)
    row = 2  # sample 1, head 0: its 9 tokens
    keys, values, _ = pool.padded_kv()
    reference = torch.softmax(query[row] @ keys[row, :9].T * 0.5, dim=-1) @ values[row, :9]
    torch.testing.assert_close(out[row], reference)
    pool.release(1, layers[1])
    pool.release(0, layers[0])
    for layer, (key0, value1) in zip(layers, expected, strict=True):
        assert torch.equal(layer.head_kv(0)[0], key0) and torch.equal(layer.head_kv(1)[1], value1)
    assert pool.num_heads == 0 and pool.num_pages == len(pool.free_pages)


def test_capacity_follows_batch_ones_growth() -> None:
    """A torch layer's capacity grows to max(tokens, C + ceil(C / 8)) when full: the pool tracks it per sample."""
    capacities = torch.tensor([16, 16, 9])
    grown = grown_capacities(capacities, torch.tensor([16, 17, 10]))
    assert grown.tolist() == [16, 18, 11]


def test_pooling_is_refused_where_a_step_is_per_sample(tiny_gqa) -> None:
    """Sliding windows, soft-capping or a policy that does not step rows: the batch keeps per-sample rows."""
    batch, _, _ = _batch(tiny_gqa, "h2o", 1)
    session = batch.sessions[0]
    assert pool_supported(tiny_gqa, session)
    config = tiny_gqa.config
    windowed = SimpleNamespace(config=SimpleNamespace(get_text_config=lambda decoder: SimpleNamespace(
        model_type="mistral", sliding_window=64, use_sliding_window=True)))  # fmt: skip
    assert not pool_supported(windowed, session)
    capped = SimpleNamespace(config=SimpleNamespace(get_text_config=lambda decoder: SimpleNamespace(
        model_type="gemma2", attn_logit_softcapping=50.0)))  # fmt: skip
    assert not pool_supported(capped, session)
    per_sample_policy = SimpleNamespace(cache=session.cache, budget=session.budget,
                                        method=SimpleNamespace(decode_policy=object()))  # fmt: skip
    assert not pool_supported(tiny_gqa, per_sample_policy)
    assert config.model_type == "llama"
    # The reason each is per sample, as the run records it (metrics.json settings.decode_path_reason).
    assert decode_path(tiny_gqa, session) == ("pooled", None)
    assert decode_path(windowed, session) == ("per_sample", "sliding-window model (config.sliding_window)")
    assert decode_path(capped, session)[1] == "attention logit soft-capping (config.attn_logit_softcapping)"
    assert decode_path(tiny_gqa, per_sample_policy) == (
        "per_sample", "decode policy object does not step sample rows (steps_sample_rows)"
    )  # fmt: skip


def test_generation_notes_its_decode_path_and_the_run_records_it(tiny_gqa) -> None:
    """generate_batched notes the path it chose (``DECODE_PATHS``); ``decode_path_settings`` turns it into the
    dataset's ``metrics.json`` settings, and says ``batch1`` where samples decode one at a time (and why)."""
    requests = [DecodeRequest(PROMPT[:-8], PROMPT[-8:], 3, {2}) for _ in range(2)]
    job = SimpleNamespace(decode_batch=2)
    dataset = SimpleNamespace(context_groups=None, multi_pass=False)
    budget = parse_budget("40L")
    for name, expected in (
        ("h2o", {"decode_path": "pooled", "decode_path_reason": None}),
        ("rkv", {"decode_path": "per_sample",
                 "decode_path_reason": "decode policy RKVPolicy does not step sample rows (steps_sample_rows)"}),
    ):  # fmt: skip
        DECODE_PATHS.reset()
        method = load_method(name)
        tokenizer = byte_level_tokenizer()
        list(generate_batched(tiny_gqa, tokenizer, requests, method=method, budget=budget, question_mode="aware",
                              decode_batch=2))  # fmt: skip
        assert decode_path_settings(job, dataset, decoded=True) == expected
    assert decode_path_settings(job, dataset, decoded=False)["decode_path"] is None  # a resumed, finished dataset
    one = decode_path_settings(SimpleNamespace(decode_batch=1), dataset, decoded=True)
    assert one == {"decode_path": "batch1", "decode_path_reason": "run.decode_batch=1"}
    multi_pass = SimpleNamespace(context_groups=None, multi_pass=True)
    assert decode_path_settings(job, multi_pass, decoded=True)["decode_path"] == "batch1"


def test_a_bf16_pool_scores_page_by_page_with_float32_keys() -> None:
    """A bfloat16 pool's products for the decode policies (``row_products``): each row's queries against its
    stored keys in float32, computed page by page from a float32 copy of the pool that is kept between steps, follows
    a step's append and in-place eviction row by row, and is converted again after any other change."""
    gen = torch.Generator().manual_seed(2)
    pool = PooledLayer(2, 16, 16, torch.bfloat16, CPU, page_size=4)

    def join(longest: int) -> None:
        layer = HeadwiseLayer()
        layer.update(*(torch.randn(1, 2, longest, 16, generator=gen).bfloat16() for _ in "kv"))
        layer.keep([torch.arange(longest), torch.arange(2, longest)])  # ragged heads
        pool.admit(layer)

    join(6)
    join(11)

    def check() -> None:
        queries = torch.randn(pool.num_heads, 3, 16, generator=gen)
        keys, _, _ = pool.padded_kv()
        expected = torch.bmm(queries, keys.float().transpose(1, 2))  # [R, 3, S_max]
        stored = (torch.arange(keys.shape[1]) < pool.lengths[:, None])[:, None].expand_as(expected)
        got = pool.row_products(queries)
        assert got.shape == expected.shape and got.dtype == torch.float32
        torch.testing.assert_close(got[stored], expected[stored], rtol=1e-6, atol=1e-6)
        assert pool.k_pool is not None and torch.equal(pool.float_key_pages().flatten(), pool.k_pool.float().flatten())

    check()
    copy = pool._float_keys
    check()
    assert pool._float_keys is copy  # kept, not converted into a new buffer
    for _ in range(3):  # appends (the second crosses into new pages) and in-place evictions, each a step's
        pool.append_rows(*(torch.randn(2, 2, 1, 16, generator=gen).bfloat16() for _ in "kv"))
        check()
        pool.evict_slots(torch.tensor([0, 1, 2, 3]))  # every row's last token moves into an early slot
        check()
        pool.evict_slots(torch.tensor([2, 0]), [1, 3])  # some rows only
        check()
    pool.keep([torch.arange(length - 1) for length in pool.head_lengths()])  # the general path
    check()
    join(3)
    check()


def _ragged_pool(gen: torch.Generator, lengths: list[list[int]], dim: int = 16) -> PooledLayer:
    """A pool of ``len(lengths)`` samples whose heads hold ``lengths[b][h]`` tokens (page size 4: several pages)."""
    pool = PooledLayer(len(lengths[0]), dim, dim, torch.float32, CPU, page_size=4)
    for heads in lengths:
        layer = HeadwiseLayer()
        longest = max(heads)
        layer.update(torch.randn(1, len(heads), longest, dim, generator=gen), torch.randn(1, len(heads), longest, dim))
        layer.keep([torch.arange(longest - length, longest) for length in heads])
        pool.admit(layer)
    return pool


@pytest.mark.parametrize(
    "impl",
    ["torch", pytest.param("triton", marks=pytest.mark.skipif(not kernels.triton_available(), reason="no triton"))],
)
def test_the_paged_decode_kernel_reads_every_row_of_the_pool(impl: str) -> None:
    """The GPU path of a pooled step (the split-K decode kernel over the pool's block table; on CPU the Triton
    interpreter) gives the CPU path's output for every (sample, head) row, GQA groups unpadded."""
    gen = torch.Generator().manual_seed(1)
    pool = _ragged_pool(gen, [[5, 7], [9, 3], [2, 11]])
    query = torch.randn(pool.num_heads, 3, 16, generator=gen)
    expected = pooled_module.padded_rows_attention(query, pool, 0.25)
    assert pool.k_pool is not None and pool.v_pool is not None and pool.block_table is not None
    got = kernels.paged_decode_attention(
        query, pool._flat(pool.k_pool), pool._flat(pool.v_pool), pool.block_table, pool.lengths, 0.25,
        pool.page_size, max(pool.host_lengths), impl=impl,
    )  # fmt: skip
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    # The same through pooled_attention when the pool's plan is the decode kernel (a CUDA pool's).
    pool.attention_plan = AttentionPlan("triton_decode", "torch_gather")
    batch_query = query.reshape(3, 2 * 3, 1, 16)  # [B, H_q, 1, D]: each sample's rows' groups in order
    kv = pooled_module.PooledKV(pool, 0, None)
    output = pooled_module.pooled_attention(torch.nn.Module(), batch_query, kv, 0.25, {})
    torch.testing.assert_close(output.reshape(pool.num_heads, 3, 16), expected, rtol=1e-4, atol=1e-5)
