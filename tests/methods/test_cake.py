"""CAKE: preference score, budget split, cascading == one-shot (Theorem 1), peak prefill memory, indicators."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re

import pytest
import torch

from kvbench.budget import parse_budget
from kvbench.cache.kv_cache import KVBenchCache
from kvbench.eviction.base import StaticLayerAllocator, WindowObservation
from kvbench.eviction.token_scores import ScoreOptions, window_attention
from kvbench.inference.eviction import EvictionSession
from kvbench.inference.prefill import prefill
from kvbench.kernels.reference import stats_of_probs
from kvbench.methods.cake import CakeScorer, layer_preference, resolve_tau, split_pool_monotone
from tests.methods.helpers import LayerIndex, method_from_yaml, run_method


def test_layer_preference_matches_eq6() -> None:
    gen = torch.Generator().manual_seed(0)
    attention = torch.softmax(torch.randn(4, 8, 50, generator=gen) * 2, dim=-1)
    past = attention[:, :, :42].double()
    entropy = float(-(past * torch.log(past + 1e-10)).sum())
    variance = float(past.var(dim=1).sum())
    stats = stats_of_probs(attention)
    assert layer_preference(stats, 8, 1.0, 1.0) == pytest.approx(entropy * variance)
    assert layer_preference(stats, 8, 0.5, 2.0) == pytest.approx(entropy**2 * variance**0.5)
    assert layer_preference(stats, 8, 0.5, 2.0, "h") == pytest.approx(entropy**2)
    assert layer_preference(stats, 8, 0.5, 2.0, "v") == pytest.approx(variance**0.5)
    # A dispersed, shifting layer prefers more cache than a concentrated, static one.
    static = torch.zeros(4, 8, 50)
    static[..., 3] = 1.0
    assert layer_preference(stats, 8, 1.0, 1.0) > layer_preference(stats_of_probs(static), 8, 1.0, 1.0)


def test_monotone_split_is_exact_capped_and_never_grows() -> None:
    """kvbench's ``adjust: monotone`` variant (the reference's adjust_budgets is tested in test_reference_parity)."""
    budgets = split_pool_monotone([1.0, 2.0, 3.0], 100, [1000] * 3)
    assert sum(budgets) == 100 and budgets[0] < budgets[1] < budgets[2]
    capped = split_pool_monotone([1.0, 1.0, 10.0], 90, [40, 40, 40])
    # shares 7.5, 7.5, 75 -> 7, 7, 40 (cap); the excess 35 is shared evenly (17 + 17 + 1), the truncation
    # remainder (1) goes to the first open layer.
    assert capped == [26, 24, 40]
    previous = split_pool_monotone([1.0, 1.0], 100, [1000] * 2)
    later = split_pool_monotone([1.0, 1.0, 1.0], 100, [1000] * 3, [*previous, None])
    assert sum(later) == 100 and all(b <= p for b, p in zip(later, previous, strict=False))


def test_tau_presets() -> None:
    assert resolve_tau((None, None), "llama3.1-8b-instruct", 128) == (1.6, 0.6)
    assert resolve_tau((None, None), "mistral-7b-instruct-v0.3", 1024) == (0.8, 0.5)
    assert resolve_tau((None, None), "llama3.1-8b-instruct", 512) == (1.0, 1.0)  # the code's fallback
    assert resolve_tau((2.0, None), "llama2-7b-chat", 128) == (2.0, 2.3)


def test_indicator_mean_plus_gamma_var_and_its_variants() -> None:
    gen = torch.Generator().manual_seed(2)
    keys = torch.randn(2, 120, 8, generator=gen)
    queries = torch.randn(4, 32, 8, generator=gen)
    observation = WindowObservation(0, 1, queries, keys, keys, 8**-0.5)
    attention = window_attention(queries, keys, 8**-0.5)
    raw = attention.mean(dim=1) + 200 * attention.var(dim=1)
    pooled = torch.nn.functional.avg_pool1d(raw[:, None, :88], 5, 1, 2)[:, 0]  # padding counted, as the code
    options = ScoreOptions(kernel_size=5, pooling="avg", gqa_reduce="after_pool")
    torch.testing.assert_close(CakeScorer(200.0, options).score(observation)[:, :88], pooled.reshape(2, 2, 88).mean(1))
    # A token hit hard by a single window query (high variance, low mean) beats one with a slightly larger
    # but steady mean under Mean + 200 Var, and loses under Mean alone.
    attention = torch.full((1, 32, 60), 0.0)
    attention[0, :, 10] = 0.02  # steady
    attention[0, 0, 20] = 0.6  # one shift
    attention[0, :, 28:] = (1 - attention[0].sum(-1, keepdim=True)) / 32
    steady, shifting = 10, 20
    cake_scores = attention.mean(1) + 200 * attention.var(1)
    mean_scores = attention.mean(1)
    assert cake_scores[0, shifting] > cake_scores[0, steady] and mean_scores[0, shifting] < mean_scores[0, steady]


# ------------------------------------------------------------------------------------------ Theorem 1, tensors
def _random_layers(num_layers: int, seed: int = 0, context: int = 160):
    """Per layer (keys [2, S, 16], queries [4, S, 16]) with layer-dependent sharpness, so preferences differ."""
    gen = torch.Generator().manual_seed(seed)
    layers = []
    for layer in range(num_layers):
        keys = torch.randn(2, context, 16, generator=gen)
        queries = torch.randn(4, context, 16, generator=gen) * (0.3 + 0.6 * layer)
        layers.append((keys, queries))
    return layers


def _prefill_layers(
    method, budget: str, layers, observe=None, dataset_state=None
) -> tuple[KVBenchCache, EvictionSession]:
    """Feed layers one at a time, as a model's prefill does (layer l's KV enters the cache at its turn)."""
    cache = KVBenchCache(len(layers))
    session = EvictionSession(method, parse_budget(budget), cache, dataset_state=dataset_state)
    session.begin_prefill(layers[0][0].shape[1])
    for idx, (keys, queries) in enumerate(layers):
        cache.update(keys[None], keys[None].clone() * 0.5, idx)
        session.after_attention(LayerIndex(idx), queries[None], 16**-0.5)
        if observe is not None:
            observe(idx, cache)
    session.begin_decode()
    return cache, session


class _FixedBudgets(StaticLayerAllocator):
    def __init__(self, budgets: list[int]) -> None:
        self.fixed = budgets

    def plan(self, total: int, num_layers: int, context_length: int) -> list[int]:
        return list(self.fixed)


def _positions(cache: KVBenchCache) -> list[list[list[int]]]:
    return [[p.tolist() for p in layer.positions] for layer in cache.headwise_layers]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("budget", ["40L", "64L", "100L"])
def test_cascading_equals_one_shot_eviction_with_final_budgets(seed: int, budget: str) -> None:
    layers = _random_layers(6, seed)
    stage_budgets: list[list[int]] = []
    cascading = method_from_yaml("cake", decode_eviction=False)
    cache, session = _prefill_layers(
        cascading, budget, layers, observe=lambda idx, c: stage_budgets.append(c.layer_lengths()[: idx + 1])
    )
    final = session.record.requested_per_layer
    achieved = session.record.achieved_per_layer
    # adjust_budgets keeps the pool when no layer reaches its cap (S - W = 128 here); capped layers lose the rest.
    assert sum(final) <= int(budget[:-1]) * 6
    assert sum(final) == int(budget[:-1]) * 6 or max(final) == 160
    assert len(set(final)) > 1  # preferences really differ across layers
    # Proposition 1: a layer's cache only shrinks from stage to stage, so a budget that grows keeps what is left.
    for before, after in itertools.pairwise(stage_budgets):
        assert all(a <= b for a, b in zip(after, before, strict=False))
    assert all(a <= f for a, f in zip(achieved, final, strict=True))
    # One-shot: the same indicator, each layer evicted once with what the cascade left it.
    one_shot = dataclasses.replace(
        method_from_yaml("cake", decode_eviction=False), layer_allocator=_FixedBudgets(achieved)
    )
    reference, _ = _prefill_layers(one_shot, budget, layers)
    assert _positions(cache) == _positions(reference)
    # Vanilla P2A (all preferences first, then one eviction per layer) gets the final budgets: the same tokens
    # whenever no budget grew between stages (Theorem 1).
    vanilla, vanilla_session = _prefill_layers(
        method_from_yaml("cake", decode_eviction=False, params={"cascading": False}), budget, layers
    )
    assert vanilla_session.record.requested_per_layer == final
    if achieved == final:
        assert _positions(vanilla) == _positions(cache)


def test_cascading_peak_memory_stays_near_the_total_budget() -> None:
    layers = _random_layers(6, 0)
    per_token = 2 * 16 * 4 * 2  # heads x head_dim x float32 x (keys + values)
    total_bytes = 64 * 6 * per_token
    layer_full = 160 * per_token
    sizes: list[int] = []
    _, session = _prefill_layers(
        method_from_yaml("cake", decode_eviction=False),
        "64L",
        layers,
        observe=lambda i, c: sizes.append(c.stored_bytes()),
    )
    assert max(sizes) <= total_bytes  # after every stage: within the total budget
    assert total_bytes < session.record.peak_prefill_bytes <= total_bytes + layer_full
    _, vanilla = _prefill_layers(
        method_from_yaml("cake", decode_eviction=False, params={"cascading": False}), "64L", layers
    )
    assert vanilla.record.peak_prefill_bytes == 6 * layer_full  # one-shot P2A holds every layer's full cache


# ------------------------------------------------------------------------------------------ tiny model
def _prefill_model(model, method, budget: str, ids: list[int]):
    with torch.no_grad():
        state = prefill(model, ids, method=method, budget=parse_budget(budget))
    return state.cache, state.session.finish()


@pytest.mark.parametrize("budget", ["48L", "96L"])
def test_theorem1_and_peak_bytes_on_the_tiny_model(tiny_llama, budget: str) -> None:
    model, _ = tiny_llama
    ids = torch.randint(3, 250, (400,), generator=torch.Generator().manual_seed(5)).tolist()
    cascade, record = _prefill_model(model, method_from_yaml("cake"), budget, ids)
    vanilla, vanilla_record = _prefill_model(model, method_from_yaml("cake", params={"cascading": False}), budget, ids)
    assert record.requested_per_layer == vanilla_record.requested_per_layer == record.achieved_per_layer
    assert _positions(cascade) == _positions(vanilla)
    one_shot = dataclasses.replace(method_from_yaml("cake"), layer_allocator=_FixedBudgets(record.requested_per_layer))
    reference, _ = _prefill_model(model, one_shot, budget, ids)
    assert _positions(cascade) == _positions(reference)
    config = model.config
    per_token = config.num_key_value_heads * (config.hidden_size // config.num_attention_heads) * 4 * 2
    bound = int(budget[:-1]) * config.num_hidden_layers * per_token + len(ids) * per_token
    assert record.peak_prefill_bytes <= bound
    assert vanilla_record.peak_prefill_bytes == len(ids) * per_token * config.num_hidden_layers


@pytest.mark.parametrize(
    "name",
    [
        "cake",
        "cake_h2o",
        "cake_tova",
        "cake_snapkv",
        "cake_alloc_uniform",
        "cake_alloc_pyramid",
        "cake_alloc_random",
        "cake_ind_mean",
        "cake_ind_var",
        "cake_ind_mean_x_var",
        "cake_uniform_mean",
    ],
)
def test_presets_keep_layer_budgets_through_decoding(tiny_llama, name: str) -> None:
    model, tokenizer = tiny_llama
    out = run_method(model, tokenizer, method_from_yaml(name), "64L", new=12)
    record = out.record
    if name == "cake_alloc_pyramid":  # PyramidKV's integer schedule does not force the total
        assert sum(record.requested_per_layer) <= 64 * 4 + 4
    else:
        assert sum(record.requested_per_layer) == 64 * 4
    assert record.requested_per_layer == record.achieved_per_layer
    assert record.final_per_layer == record.requested_per_layer  # decode eviction keeps the budgets fixed
    if name in ("cake_alloc_uniform", "cake_uniform_mean"):
        assert record.requested_per_layer == [64] * 4
    if name == "cake_alloc_pyramid":
        assert record.requested_per_layer[0] > record.requested_per_layer[-1]


def test_random_allocation_varies_and_sums_to_the_total(tiny_llama) -> None:
    """Per-sample draws: another prompt (or seed) draws other budgets, the same prompt and seed the same ones."""
    model, tokenizer = tiny_llama
    method = method_from_yaml("cake_alloc_random")
    first = run_method(model, tokenizer, method, "64L", new=1).record.requested_per_layer
    again = run_method(model, tokenizer, method, "64L", new=1).record.requested_per_layer
    other_prompt = run_method(model, tokenizer, method, "64L", context=301, new=1).record.requested_per_layer
    other_seed = method_from_yaml("cake_alloc_random", seed=1)
    reseeded = run_method(model, tokenizer, other_seed, "64L", new=1).record.requested_per_layer
    assert sum(first) == sum(other_prompt) == sum(reseeded) == 256
    assert first == again and first != other_prompt and first != reseeded
    assert math.prod(b >= 32 for b in first)  # every layer keeps its window


def test_a_frozen_recipe_holds_no_random_generator() -> None:
    """The random allocator keeps only its seed; a piece that holds a generator is refused when it is frozen."""
    import random as python_random

    from kvbench.methods.cake import RandomLayerAllocator

    allocator = method_from_yaml("cake_alloc_random").layer_allocator
    assert isinstance(allocator, RandomLayerAllocator) and allocator._frozen
    assert set(vars(allocator)) == {"window", "seed", "_frozen"}
    with pytest.raises(AttributeError, match="frozen recipe"):
        allocator.seed = 1

    class Drifting(RandomLayerAllocator):
        def __init__(self) -> None:
            super().__init__(32, 0)
            self.rng = python_random.Random(0)

    with pytest.raises(TypeError, match=r"Drifting\.rng is a Random: a built method is a frozen recipe"):
        Drifting().freeze()


def test_random_allocation_resumed_and_batched_draws_as_the_uninterrupted_run(tmp_path) -> None:
    """``method=cake_alloc_random``: 3 samples straight with ``run.decode_batch=2`` vs 1 sample, stopped, then
    resumed to 3 one at a time: the same predictions.jsonl (budgets, predictions), byte for byte."""
    from hydra import compose, initialize_config_dir

    from kvbench.app.validation import validate_run
    from kvbench.config import register_configs
    from kvbench.run.runner import Runner
    from tests.methods.helpers import CONF

    register_configs()

    def run(root, samples: int, batch: int):
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose("config", overrides=[
                "model=tiny", "method=cake_alloc_random", "budget=64L", "task.lengths=[1024]",
                "task.datasets=[niah_single_1k]", f"task.num_samples={samples}", f"run.decode_batch={batch}",
                f"run.output_root={root}", "run.progress=false", "run.print_table=false",
            ])  # fmt: skip
        runner = Runner(validate_run(cfg))
        runner.run()
        return runner.folder / "niah_single_1k" / "predictions.jsonl"

    straight = run(tmp_path / "straight", 3, 2).read_bytes()
    run(tmp_path / "resumed", 1, 1)
    resumed = run(tmp_path / "resumed", 3, 1).read_bytes()
    rows = [json.loads(line) for line in straight.splitlines()]
    budgets = {tuple(row["cache"]["requested_per_layer"]) for row in rows}
    assert len(rows) == 3 and len(budgets) == 3  # a draw of its own per sample
    # Byte for byte but each row's config_hash (run.decode_batch=2 is its own configuration: issue #55's row stamp).
    unstamped = [re.sub(rb', "config_hash": "[0-9a-f]+"', b"", text) for text in (resumed, straight)]
    assert unstamped[0] == unstamped[1]
