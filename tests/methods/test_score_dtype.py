"""Scores in the model's dtype and eviction on appended tokens, against small re-implementations of the reference
code's op order (kvbench issue #28).

* Prefill, every scorer family (SnapKV / Ada-KV / CAKE window statistics, H2O column sums, TOVA, AhaKV), on the
  torch and Triton (interpreter) paths: ``score_dtype=model`` equals the bf16 reference bit for bit (logits of
  ``matmul(q, k^T) / sqrt(d)`` in bf16, float32 softmax cast back, bf16 reductions), ``score_dtype=float32`` the
  float32 one -- on inputs where the two references pick different tokens.
* Decoding, step by step: H2O's running scores (kept in bf16 by ``H2OKVCache_LayerWise``), TOVA's head mean,
  CAKE's pooled step attention, AhaKV's accumulated SG-softmax.
* A multi-token append after the prefill: H2O adds every row's attention and evicts at once, StreamingLLM cuts
  back to sinks + recent, CAKE ranks by the last rows' unmasked mean; ``params.evict_on_append: false`` keeps the
  appended tokens.

``head_dim`` 16: ``/ sqrt(16)`` and ``* 16 ** -0.5`` round alike, so the CPU references are exact.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from kvbench import kernels
from kvbench.budget import parse_budget
from kvbench.cache.kv_cache import KVBenchCache
from kvbench.eviction.base import WindowObservation
from kvbench.inference.eviction import EvictionSession
from kvbench.methods.ahakv import sg_multiplier, value_prior
from tests.methods.helpers import LayerIndex, method_from_yaml

IMPLS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(not kernels.triton_available(), reason="no triton"))]
DIM = 16


# ------------------------------------------------------------------------------------------ reference op order
def ref_attention(
    queries: torch.Tensor, keys: torch.Tensor, rows: int, *, causal: bool = True, row_factor: torch.Tensor | None = None
) -> torch.Tensor:
    """``[H_q, rows, S]`` as the reference code: ``matmul(q[-rows:], repeat_kv(k)^T) / sqrt(d)`` in the inputs'
    dtype (times AhaKV's per-row factor), ``finfo.min`` added on the future, float32 softmax cast back."""
    num_q, _, dim = queries.shape
    expanded = keys.repeat_interleave(num_q // keys.shape[0], dim=0)
    logits = torch.matmul(queries[:, -rows:], expanded.transpose(1, 2)) / math.sqrt(dim)
    if row_factor is not None:  # float32 factors: the product rounded back to the logits' dtype
        logits = (logits * row_factor[None, :, None]).to(queries.dtype)
    if causal:
        future = torch.triu(torch.full((rows, rows), torch.finfo(logits.dtype).min, dtype=logits.dtype), diagonal=1)
        logits[:, :, -rows:] += future
    return torch.softmax(logits, dim=-1, dtype=torch.float32).to(queries.dtype)


def group_mean(scores: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``[H_q, S]`` -> ``[H, S]`` (``view(H, g, S).mean(1)``, in the scores' dtype)."""
    return scores.reshape(num_heads, scores.shape[0] // num_heads, -1).mean(dim=1)


def pool(scores: torch.Tensor, kernel: int, how: str) -> torch.Tensor:
    layer = F.max_pool1d if how == "max" else F.avg_pool1d
    return layer(scores[:, None], kernel_size=kernel, padding=kernel // 2, stride=1)[:, 0]


def ref_prefill_scores(family: str, queries: torch.Tensor, keys: torch.Tensor, window: int, budget: int):
    """Candidate (``[H, S - W]``) or all-token (``[H, S]``) scores of each family's reference, in the inputs' dtype."""
    heads = keys.shape[0]
    if family == "snapkv":  # KVCache-Factory SnapKVCluster (kv_head mode): sum, group mean, max pool 7
        probs = ref_attention(queries, keys, window)
        return pool(group_mean(probs.sum(dim=-2)[:, :-window], heads), 7, "max")
    if family == "ada_snapkv":  # AdaKV calcul_attn_sore: mean, group mean, max pool 7
        probs = ref_attention(queries, keys, window)
        return pool(group_mean(probs[:, :, :-window].mean(dim=-2), heads), 7, "max")
    if family == "cake":  # llama_attn_forward_cake: mean + gamma var, candidates, avg pool 5, then group mean
        probs = ref_attention(queries, keys, window)
        indicator = (probs.mean(dim=-2) + 200.0 * probs.var(dim=-2))[:, :-window]
        return group_mean(pool(indicator, 5, "avg"), heads)
    if family == "h2o":  # H2OKVCache_LayerWise / H2OKVCluster: column sums of every causal row
        return ref_attention(queries, keys, queries.shape[1]).sum(dim=-2)
    if family == "tova":  # TOVACache.reduce: the last row, mean over every query head
        return ref_attention(queries, keys, 1)[:, -1].mean(dim=0, keepdim=True).expand(heads, -1)
    # AhaKV (paper-only; kvbench's reading, rounded as H2O's code): RA rows with the step gain, group mean, VPE
    length = keys.shape[1]
    factor = sg_multiplier(torch.arange(length - window, length) + 1, budget, DIM, "unscaled", 1e-3)
    sums = ref_attention(queries, keys, window, row_factor=factor).sum(dim=-2)
    return (group_mean(sums, heads).float() * value_prior(keys, 7)).to(queries.dtype)


def is_top(kept: set[int], scores: torch.Tensor, count: int) -> bool:
    """Whether ``kept`` (``count`` indices into 1-D ``scores``) is a top-``count`` of ``scores`` (ties allowed)."""
    if len(kept) != count:
        return False
    inside = scores[sorted(kept)]
    outside = scores[[i for i in range(scores.numel()) if i not in kept]]
    return outside.numel() == 0 or bool(inside.min() >= outside.max())


def top_set(scores: torch.Tensor, count: int) -> set[int]:
    return set(torch.topk(scores.float(), count).indices.tolist())


def _inputs(seed: int, heads: int, groups: int, length: int, sharp: float = 2.0):
    gen = torch.Generator().manual_seed(seed)
    keys = torch.randn(heads, length, DIM, generator=gen).bfloat16()
    queries = (torch.randn(heads * groups, length, DIM, generator=gen) * sharp).bfloat16()
    return keys, queries


# ------------------------------------------------------------------------------------------ prefill
PREFILL_FAMILIES = {
    # family: (method config, GQA groups, budget per head, input seed, query scale) -- seeds whose float32 and bf16
    # selections differ (a few in 40 for the max-pooled and single-row scores, more for the others)
    "snapkv": ("snapkv", 2, 40, 0, 2.0),
    "ada_snapkv": ("ada_snapkv", 2, 40, 0, 2.0),
    "cake": ("cake", 2, 40, 8, 2.0),
    "h2o": ("h2o", 1, 40, 32, 2.0),
    "tova": ("tova", 2, 24, 31, 2.0),
    "ahakv": ("ahakv", 2, 40, 4, 2.0),
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("family", list(PREFILL_FAMILIES))
def test_prefill_scores_round_as_each_reference(family: str, impl: str) -> None:
    """bf16 inputs where the bf16 and float32 references select different tokens: ``score_dtype=model`` gives the
    bf16 reference's scores exactly, ``float32`` the float32 reference's."""
    name, groups, budget, seed, sharp = PREFILL_FAMILIES[family]
    window, heads, length = 16, 2, 96
    keys, queries = _inputs(seed, heads, groups, length, sharp)
    bf16_ref = ref_prefill_scores(family, queries, keys, window, budget).float()
    f32_ref = ref_prefill_scores(family, queries.float(), keys.float(), window, budget)
    candidates = bf16_ref.shape[1]
    count = budget - (window if candidates < length else 0)
    # The case matters: some head's float32 selection is not a top-k of the bf16 scores.
    assert any(not is_top(top_set(f32_ref[h], count), bf16_ref[h], count) for h in range(heads))
    for score_dtype, expected in (("model", bf16_ref), ("float32", f32_ref)):
        method = method_from_yaml(name, window=window, score_dtype=score_dtype, gqa_granularity="kv_head")
        observation = WindowObservation(
            0, 1, queries[:, -window:], keys, keys, DIM**-0.5, prompt_queries=queries, layer_budget=budget, impl=impl
        )
        got = method.scorer.score(observation).float()
        got = group_mean(got, heads) if got.shape[0] != heads else got  # TOVA: [H_q, S], every head the mean
        if score_dtype == "model":
            torch.testing.assert_close(got[:, :candidates], expected, rtol=0, atol=0)
        else:
            torch.testing.assert_close(got[:, :candidates], expected, rtol=2e-5, atol=1e-7)


# ------------------------------------------------------------------------------------------ decoding
def _session(method, budget: str, keys: torch.Tensor, queries: torch.Tensor, scoring_impl: str = "auto"):
    cache = KVBenchCache(1)
    cache.update(keys[None], keys[None].clone(), 0)
    session = EvictionSession(method, parse_budget(budget), cache, scoring_impl=scoring_impl)
    session.begin_prefill(keys.shape[1])
    session.after_attention(LayerIndex(0), queries[None], DIM**-0.5)
    session.begin_decode()
    return cache, session


def _decode(session, cache, new_key: torch.Tensor, query: torch.Tensor) -> None:
    """One decoding step: store ``new_key`` ``[H, 1, D]``, then the attention callback with ``query``."""
    cache.update(new_key[None], new_key[None].clone(), 0)
    session.after_attention(LayerIndex(0), query[None], DIM**-0.5)


class RefH2O:
    """``H2OKVCache_LayerWise`` for one head (MHA): ``hh_score`` kept in the attention's dtype; above ``cap`` it
    keeps the top ``cap - recent`` of ``[:S - recent]`` plus the recent tokens."""

    def __init__(self, positions: list[int], keys: torch.Tensor, scores: torch.Tensor, recent: int) -> None:
        self.positions, self.keys, self.scores, self.recent = positions, keys, scores, recent

    def forward(
        self, new_positions: list[int], new_keys: torch.Tensor, queries: torch.Tensor, factor: torch.Tensor | None
    ) -> None:
        """A forward of ``q`` rows ``[q, D]`` with their keys: ``_update_hh_score`` (column sums added); AhaKV's
        ``[q]`` step gains multiply the rows' logits."""
        self.positions = self.positions + new_positions
        self.keys = torch.cat([self.keys, new_keys])
        rows = queries.shape[0]
        sums = ref_attention(queries[None], self.keys[None], rows, row_factor=factor)[0].sum(dim=0)  # [S]
        sums[: -queries.shape[0]] += self.scores
        self.scores = sums

    def check_and_follow(self, kept_positions: list[int], cap: int) -> None:
        """kvbench's eviction must be a top-k of the reference's candidates; then keep what kvbench kept."""
        if len(self.positions) > cap:
            candidates = len(self.positions) - self.recent
            chosen = {i for i, p in enumerate(self.positions) if p in set(kept_positions) and i < candidates}
            assert len(kept_positions) == cap and set(self.positions[candidates:]) <= set(kept_positions)
            assert is_top(chosen, self.scores[:candidates].float(), cap - self.recent)
        index = [i for i, p in enumerate(self.positions) if p in set(kept_positions)]
        self.positions, self.keys, self.scores = (
            [self.positions[i] for i in index],
            self.keys[index],
            self.scores[index],
        )


def _random_steps(seed: int, count: int, heads: int = 1, groups: int = 1, sharp: float = 1.0):
    """``count`` decoding steps: (new key ``[H, 1, D]``, query ``[H_q, 1, D]``), bf16."""
    gen = torch.Generator().manual_seed(seed)
    steps = []
    for _ in range(count):
        key = torch.randn(heads, 1, DIM, generator=gen).bfloat16()
        steps.append((key, (torch.randn(heads * groups, 1, DIM, generator=gen) * sharp).bfloat16()))
    return steps


def _h2o_run(score_dtype: str, keys, queries, steps, question=None, family: str = "h2o"):
    """kvbench's H2O (or AhaKV) session next to :class:`RefH2O` (in bf16 or float32), checked after every
    forward: budget 40, recent window 8, MHA."""
    method = method_from_yaml(family, window=8, score_dtype=score_dtype)
    cache, session = _session(method, "40L", keys, queries)
    layer = cache.headwise_layers[0]
    cast = (lambda t: t) if score_dtype == "model" else (lambda t: t.float())
    length = keys.shape[1]
    if family == "h2o":
        prefill = ref_attention(cast(queries), cast(keys), length).sum(dim=-2)[0]

        def factor(seen: torch.Tensor) -> torch.Tensor | None:
            return None
    else:  # AhaKV: RA + SGS + VPE at prefill, then accumulated SG-softmax with i = the tokens each row sees
        prefill = ref_prefill_scores("ahakv", cast(queries), cast(keys), 8, 40)[0]

        def factor(seen: torch.Tensor) -> torch.Tensor | None:
            return sg_multiplier(seen, 40, DIM, "unscaled", 1e-3)

    kept = layer.positions[0].tolist()
    ref = RefH2O(kept, cast(keys)[0][kept], prefill[kept], recent=8)
    if question is not None:  # a multi-token append after the prefill
        session.begin_append()
        new_keys, rows = question
        cache.update(new_keys[None], new_keys[None].clone(), 0)
        session.after_attention(LayerIndex(0), rows[None], DIM**-0.5)
        appended = torch.arange(length, length + new_keys.shape[1])
        ref.forward(appended.tolist(), cast(new_keys[0]), cast(rows[0]), factor(appended + 1))
        ref.check_and_follow(layer.positions[0].tolist(), 40)
        session.begin_decode()
    history = []
    for new_key, query in steps:
        _decode(session, cache, new_key, query)
        seen = torch.tensor([layer.seen_tokens])
        ref.forward([layer.seen_tokens - 1], cast(new_key[0]), cast(query[0]), factor(seen))
        now = sorted(layer.positions[0].tolist())
        ref.check_and_follow(now, 40)
        # kvbench's slots leave position order once decoding evicts in place (#32): compare in position order.
        order = torch.argsort(layer.positions[0])
        running = session.method.decode_policy.head_scores(session.decode_state, 0)[0][order]
        if score_dtype == "model":
            assert torch.equal(running, ref.scores.float())  # bit for bit: bf16 sums, each addition rounded
        else:
            torch.testing.assert_close(running, ref.scores, rtol=1e-5, atol=1e-6)
        history.append(now)
    return history, layer


def test_h2o_decoding_keeps_bf16_running_scores_as_the_reference() -> None:
    """30 steps after a prefill at budget 40 (recent 8): every eviction is a top-k of the reference's scores, the
    running scores equal the reference's (bf16: bit for bit), and the float32 and bf16 runs keep different tokens."""
    keys, queries = _inputs(10, 1, 1, 64, sharp=3.0)  # a seed whose float32 and bf16 runs part ways (1 in ~12)
    steps = _random_steps(110, 30, sharp=3.0)
    model, _ = _h2o_run("model", keys, queries, steps)
    exact, _ = _h2o_run("float32", keys, queries, steps)
    assert model != exact


def test_ahakv_decoding_accumulates_bf16_sg_softmax_as_h2o_code() -> None:
    """AhaKV's decoding (Algorithm 1 on H2O's code): the running scores equal the bf16 reference bit for bit, every
    eviction is its top-k, after a 12-token append cut to the budget at once."""
    keys, queries = _inputs(12, 1, 1, 64, sharp=2.0)
    gen = torch.Generator().manual_seed(13)
    question = (torch.randn(1, 12, DIM, generator=gen).bfloat16(), torch.randn(1, 12, DIM, generator=gen).bfloat16())
    steps = _random_steps(14, 20, sharp=2.0)
    for score_dtype in ("model", "float32"):
        _, layer = _h2o_run(score_dtype, keys, queries, steps, question, family="ahakv")
        assert layer.head_lengths() == [40]


def test_h2o_append_adds_every_row_and_evicts_at_once() -> None:
    """A 12-token question after a prefill compressed to 40: the reference adds its rows' attention and cuts back
    to 40 right away (kvbench before issue #28: 52, the question scored 0); decoding then goes on alike."""
    keys, queries = _inputs(7, 1, 1, 64, sharp=1.0)
    gen = torch.Generator().manual_seed(8)
    question = (torch.randn(1, 12, DIM, generator=gen).bfloat16(), torch.randn(1, 12, DIM, generator=gen).bfloat16())
    _, layer = _h2o_run("model", keys, queries, _random_steps(9, 5), question)
    assert layer.head_lengths() == [40]
    method = method_from_yaml("h2o", window=8, params={"evict_on_append": False})
    cache, session = _session(method, "40L", keys, queries)
    session.begin_append()
    cache.update(question[0][None], question[0][None].clone(), 0)
    session.after_attention(LayerIndex(0), question[1][None], DIM**-0.5)
    assert cache.headwise_layers[0].head_lengths() == [52]  # the switch keeps the earlier behaviour


# ------------------------------------------------------------------------------------------ TOVA / CAKE / AhaKV steps
def ref_tova_ranking(keys: list[torch.Tensor], query: torch.Tensor) -> list[torch.Tensor]:
    """``TOVACache.reduce``: the step's attention ``[H_q, S]`` averaged over every query head (one ranking)."""
    mean = ref_attention(query, torch.stack(keys), 1)[:, 0].mean(dim=0)
    return [mean for _ in keys]


def ref_cake_ranking(keys: list[torch.Tensor], query: torch.Tensor, window: int) -> list[torch.Tensor]:
    """``CakeDecodingKVCache_LayerWise``: per KV head, the step's attention over ``[:-window]`` (mean over rows),
    average-pooled (kernel 5) per query head, then the group mean."""
    groups = query.shape[0] // len(keys)
    rankings = []
    for head, head_keys in enumerate(keys):
        rows = query[head * groups : (head + 1) * groups]
        probs = ref_attention(rows, head_keys[None], rows.shape[1], causal=False).mean(dim=1)  # [g, S]
        rankings.append(pool(probs[:, :-window], 5, "avg").mean(dim=0))
    return rankings


def _follow_steps(method, keys, queries, steps, budget: int, protected: int, ranking, cast) -> int:
    """Decode ``steps`` with ``method``; before each step compute the reference ranking from the cache's keys plus
    the new key; after it, every head over the cap must keep a top-k of that ranking (and its last ``protected``
    tokens).  Returns how many evictions the other precision's ranking would have made differently."""
    cache, session = _session(method, f"{budget}L", keys, queries)
    layer = cache.headwise_layers[0]
    differ = 0
    for new_key, query in steps:
        # The reference keeps its cache in position order; kvbench's slots leave it once decoding evicts in place.
        orders = [torch.argsort(p) for p in layer.positions]
        before = [torch.cat([layer.head_kv(h)[0][orders[h]], new_key[h]]) for h in range(layer.num_heads)]
        old_positions = [[*p[orders[h]].tolist(), layer.seen_tokens] for h, p in enumerate(layer.positions)]
        rankings = ranking([cast(k) for k in before], cast(query))
        others = ranking([k.float() for k in before], query.float()) if cast(query).dtype != torch.float32 else None
        _decode(session, cache, new_key, query)
        for head, ranks in enumerate(rankings):
            if len(old_positions[head]) <= budget:
                continue
            now = set(layer.positions[head].tolist())
            candidates = len(old_positions[head]) - protected
            assert set(old_positions[head][candidates:]) <= now
            chosen = {i for i, p in enumerate(old_positions[head][:candidates]) if p in now}
            assert is_top(chosen, ranks[:candidates].float(), budget - protected)
            if others is not None:
                float32_choice = top_set(others[head][:candidates], budget - protected)
                differ += not is_top(float32_choice, ranks[:candidates].float(), budget - protected)
    return differ


@pytest.mark.parametrize(("family", "seed"), [("tova", 8), ("cake", 2)])
def test_decode_steps_rank_as_the_bf16_reference(family: str, seed: int) -> None:
    """30 steps past the budget (GQA 2, near-uniform attention): every eviction is a top-k of the reference's bf16
    ranking under ``score_dtype=model`` and of its float32 ranking under ``float32``; on these inputs (seeds where
    it happens) the float32 ranking would have evicted differently from the bf16 one at some step."""
    keys, queries = _inputs(seed, 2, 2, 48, sharp=0.05)
    steps = _random_steps(seed + 50, 30, heads=2, groups=2, sharp=0.05)
    budget, window = (24, 0) if family == "tova" else (40, 8)

    def ranking(keys_now: list[torch.Tensor], query: torch.Tensor) -> list[torch.Tensor]:
        return ref_tova_ranking(keys_now, query) if family == "tova" else ref_cake_ranking(keys_now, query, window)

    for score_dtype, cast in (("model", lambda t: t), ("float32", lambda t: t.float())):
        method = method_from_yaml(family, window=max(window, 1), score_dtype=score_dtype, gqa_granularity="kv_head")
        differ = _follow_steps(method, keys, queries, steps, budget, window, ranking, cast)
        if score_dtype == "model":
            assert differ > 0


# ------------------------------------------------------------------------------------------ appends
def _append(session, cache, new_keys: torch.Tensor, rows: torch.Tensor) -> None:
    """Question-agnostic mode's question: ``q`` new keys ``[H, q, D]`` and their queries ``[H_q, q, D]``."""
    session.begin_append()
    cache.update(new_keys[None], new_keys[None].clone(), 0)
    session.after_attention(LayerIndex(0), rows[None], DIM**-0.5)
    session.begin_decode()


@pytest.mark.parametrize("evict_on_append", [True, False])
def test_streamingllm_append_cuts_back_to_sinks_and_recent(evict_on_append: bool) -> None:
    """``StartRecentKVCache.__call__`` after the question's forward: 4 sinks + the 36 newest of 52 tokens (the
    switch off: all 52 stay until decoding)."""
    keys, queries = _inputs(15, 2, 1, 64)
    method = method_from_yaml("streamingllm", sink_tokens=4, params={"evict_on_append": evict_on_append})
    cache, session = _session(method, "40L", keys, queries)
    gen = torch.Generator().manual_seed(16)
    _append(session, cache, torch.randn(2, 12, DIM, generator=gen), torch.randn(2, 12, DIM, generator=gen))
    positions = [p.tolist() for p in cache.headwise_layers[0].positions]
    if evict_on_append:
        assert positions == [[0, 1, 2, 3, *range(40, 76)]] * 2
    else:
        assert positions == [[0, 1, 2, 3, *range(28, 76)]] * 2


@pytest.mark.parametrize("score_dtype", ["model", "float32"])
def test_cake_append_ranks_by_its_last_rows_unmasked(score_dtype: str) -> None:
    """CAKE's decoding branch on the question's forward: its last ``window`` rows' mean attention (no causal mask,
    as the code), pooled per query head, group mean; cut to the layer budget at once."""
    keys, queries = _inputs(17, 2, 2, 64, sharp=2.0)
    method = method_from_yaml("cake", window=8, score_dtype=score_dtype, gqa_granularity="kv_head")
    cache, session = _session(method, "40L", keys, queries)
    layer = cache.headwise_layers[0]
    cap = session.record.decode_cap_per_layer[0]
    gen = torch.Generator().manual_seed(18)
    new_keys = torch.randn(2, 12, DIM, generator=gen).bfloat16()
    rows = (torch.randn(4, 12, DIM, generator=gen) * 2).bfloat16()
    before = [torch.cat([layer.head_kv(h)[0], new_keys[h]]) for h in range(2)]
    old_positions = [[*p.tolist(), *range(64, 76)] for p in layer.positions]
    cast = (lambda t: t) if score_dtype == "model" else (lambda t: t.float())
    rankings = ref_cake_ranking([cast(k) for k in before], cast(rows[:, -8:]), 8)
    _append(session, cache, new_keys, rows)
    assert layer.head_lengths() == [cap, cap] and len(old_positions[0]) > cap
    for head, ranks in enumerate(rankings):
        now = set(layer.positions[head].tolist())
        candidates = len(old_positions[head]) - 8
        assert set(range(68, 76)) <= now
        chosen = {i for i, p in enumerate(old_positions[head][:candidates]) if p in now}
        assert is_top(chosen, ranks.float(), cap - 8)
