"""LongBench samsum's stop rule (official pred.py): the newline's *token id* ends generation like an EOS, and
``min_length = context_length + 1`` forbids it (and EOS) at the first step.  Cost: about 3 s."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from kvbench.budget import parse_budget
from kvbench.config import MethodConfig
from kvbench.eviction.base import build_method
from kvbench.inference.generate import generate, last_token_ids
from kvbench.models.loading import build_builtin
from kvbench.tasks.base import build_task
from tests.task_config import task_config


def _rig(model, preferred: list[int]):
    """Make ``model``'s logits rank ``preferred`` first, second, ... at every step (its output layer is replaced by a
    constant bias; the transformer still runs)."""
    head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        for rank, token_id in enumerate(preferred):
            head.bias[token_id] = 100.0 - rank
    model.lm_head = head


@pytest.mark.parametrize(("name", "newline_id"), [("random-llama3", 198), ("random-mistral-v0.2", 13)])
def test_samsum_stops_on_the_newline_id_but_not_at_the_first_step(name, newline_id):
    (samsum,) = build_task(task_config("longbench", kind="longbench", data_dir="fixtures", datasets=["samsum"]), None)
    model, tokenizer = build_builtin(name, seed=0)
    model.set_attn_implementation("kvbench")
    stops = {tokenizer.eos_token_id} | last_token_ids(tokenizer, samsum.stop_token_texts)
    assert newline_id in stops and samsum.min_new_tokens == 1
    word = tokenizer.encode(" Hi", add_special_tokens=False)[-1]
    _rig(model, [newline_id, word])  # the newline is the model's favourite token
    method = build_method(OmegaConf.structured(MethodConfig(name="full", family="full")))
    prompt = tokenizer.encode("Dialogue: A: hello B: hi\nSummary:")
    output = generate(
        model,
        tokenizer,
        prompt,
        [],
        method=method,
        budget=parse_budget("full"),
        question_mode="aware",
        max_new_tokens=samsum.max_new_tokens,
        stop_token_ids=stops,
        stop_strings=samsum.stop_strings,
        min_new_tokens=samsum.min_new_tokens,
    )
    # Step 0: the newline is masked, the next best token is chosen; step 1: the newline stops generation and, as in
    # pred.py's decoded output, ends the text.
    assert output.token_ids == [word, newline_id] and output.stop_reason == "stop_token"
    assert output.text == tokenizer.decode([word]) + "\n"
    scored = samsum.postprocess(output.text)
    assert scored.strip() == tokenizer.decode([word]).strip()  # not the empty answer a first newline used to give
