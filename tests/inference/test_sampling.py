"""Seeded sampling (kvbench.sampling.Sampling, kvbench.inference.generate.sample_token / GreedyStream): settings are
checked, draws are reproducible per seed, top-p keeps the smallest nucleus, temperature sharpens towards greedy."""

from __future__ import annotations

import pytest
import torch

from kvbench.inference.generate import GreedyStream, sample_token
from kvbench.sampling import Sampling


def test_settings_are_checked():
    with pytest.raises(ValueError, match="temperature must be > 0, got 0"):
        Sampling(0)
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\], got 1.5"):
        Sampling(1.0, top_p=1.5)


def _draws(sampling: Sampling, logits: torch.Tensor, n: int = 200) -> list[int]:
    generator = torch.Generator().manual_seed(sampling.seed)
    return [sample_token(logits, sampling, generator) for _ in range(n)]


def test_draws_are_reproducible_and_top_p_keeps_the_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    sampling = Sampling(1.0, top_p=1.0, seed=3)
    assert _draws(sampling, logits) == _draws(sampling, logits)
    assert set(_draws(sampling, logits)) == {0, 1, 2, 3}
    # top-p 0.8: tokens whose more-likely mass is below 0.8 (0.5 and 0.3 reach 0.8): {0, 1}
    assert set(_draws(Sampling(1.0, top_p=0.8, seed=3), logits)) == {0, 1}
    assert set(_draws(Sampling(1.0, top_p=0.01, seed=3), logits)) == {0}  # the most likely token always stays
    # a low temperature (LongBench v2's 0.1) is nearly greedy on these logits
    assert _draws(Sampling(0.1, seed=3), logits).count(0) > 190


def test_stream_samples_with_its_own_seed(tiny_llama):
    _, tokenizer = tiny_llama
    logits = torch.zeros(64)
    streams = [GreedyStream(tokenizer, 5, set(), sampling=Sampling(1.0, seed=seed)) for seed in (1, 1, 2)]
    for stream in streams:
        while not stream.done:
            stream.push(logits)
    assert streams[0].generated == streams[1].generated != streams[2].generated
    assert Sampling(1.0, seed=1).for_sample("x") == Sampling(1.0, seed=1).for_sample("x")


def test_batched_sampling_draws_what_batch_one_draws(tiny_llama):
    """Each sample keeps its own seeded generator: the batched decoder draws the same tokens as batch 1."""
    from kvbench.bench.random_models import load_method
    from kvbench.budget import parse_budget
    from kvbench.inference.batched_decode import DecodeRequest, generate_batched
    from kvbench.inference.generate import generate

    model, tokenizer = tiny_llama
    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(5, 250, (40 + 9 * i,), generator=generator).tolist() for i in range(3)]
    samplings = [Sampling(1.0, top_p=0.9, seed=11).for_sample(f"s{i}") for i in range(3)]
    budget = parse_budget("16L")
    alone = [
        generate(model, tokenizer, p[:-5], p[-5:], method=load_method("snapkv"), budget=budget, question_mode="aware",
                 max_new_tokens=6, stop_token_ids=set(), sampling=s)
        for p, s in zip(prompts, samplings, strict=True)
    ]  # fmt: skip
    requests = [DecodeRequest(p[:-5], p[-5:], 6, set(), sampling=s) for p, s in zip(prompts, samplings, strict=True)]
    batched = dict(generate_batched(model, tokenizer, requests, method=load_method("snapkv"), budget=budget,
                                    question_mode="aware", decode_batch=3))  # fmt: skip
    assert [batched[i].token_ids for i in range(3)] == [a.token_ids for a in alone]
    greedy = generate(model, tokenizer, prompts[0][:-5], prompts[0][-5:], method=load_method("snapkv"), budget=budget,
                      question_mode="aware", max_new_tokens=6, stop_token_ids=set())  # fmt: skip
    assert greedy.token_ids != alone[0].token_ids  # temperature 1 on a random model: the draws leave the argmax
