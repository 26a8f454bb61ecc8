"""What the KVzip and Finch parity tests share: the recorded tiny Llama in kvbench's attention, the recordings of
``scripts/reference/record_kvzip_finch.py`` (kvpress 0.5.5, outside the project), and a budget of an exact total."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

import kvbench.attention.function as attention
from kvbench.budget import Budget
from tests.methods.wrapper_replay import KeptTally
from tests.reference_recordings import DTYPES, tiny_llama_weights

REFERENCE = Path(__file__).resolve().parents[1] / "fixtures" / "reference"


@cache
def recording(name: str) -> dict:
    """``kvzip/KVzipPress`` or ``finch/FinchPress``: the JSON the recorder wrote."""
    return json.loads((REFERENCE / f"{name}.json").read_text())


@cache
def recorded_tensors() -> dict[str, torch.Tensor]:
    """The tensors the Finch and re-rotation recordings name (``tensors`` keys), in the case's dtype."""
    from safetensors.torch import load_file

    return load_file(REFERENCE / "finch" / "tensors.safetensors")


def tiny_llama(dtype: str, config: dict) -> LlamaForCausalLM:
    """The recorded tiny Llama (the kvpress fixtures' weights) in ``dtype``, on kvbench's attention."""
    model = LlamaForCausalLM(LlamaConfig(**config))
    model.load_state_dict(tiny_llama_weights(DTYPES[dtype]), strict=False)
    model = model.to(DTYPES[dtype]).eval()
    model.set_attn_implementation(attention.ATTENTION_NAME)
    return model


def tokenizer(name: str) -> PreTrainedTokenizerFast:
    """The recorder's character-level tokenizer (``tokenizer`` or ``tokenizer_chat``, with a chat template)."""
    return PreTrainedTokenizerFast.from_pretrained(str(REFERENCE / "kvzip" / name))


@dataclass(frozen=True)
class ExactTotal(Budget):
    """A budget of exactly ``tokens`` per stored head over all layers (kvpress's ratios need totals that ``<n>L``
    cannot spell)."""

    tokens: int = 0

    def total(self, context_length: int, num_layers: int) -> int:
        return self.tokens


def exact_total(tokens: int) -> ExactTotal:
    return ExactTotal(f"{tokens}total", "total_per_layer", 0, tokens)


@dataclass
class Tally:
    """Per (case, layer, head): the reference's kept set, another valid top-k of its scores where they tie, or not."""

    cases: int = 0
    same: int = 0
    tied: int = 0
    differ: int = 0

    def summary(self) -> str:
        return f"{self.cases} cases: {self.same} same, {self.tied} tied, {self.differ} differ"


def valid_topk(scores: torch.Tensor, kept: torch.Tensor) -> bool:
    """Whether the ``kept`` mask (same shape as ``scores``) holds scores all >= every evicted one."""
    if bool(kept.all()) or not bool(kept.any()):
        return True
    return bool(scores[kept].min() >= scores[~kept].max())


def positions_mask(kept: list, shape: torch.Size) -> torch.Tensor:
    """``[L, H, S]`` bool: the kept positions, per layer and head (lists, or a cache's ``headwise_layers``)."""
    mask = torch.zeros(shape, dtype=torch.bool)
    for layer, per_head in enumerate(kept):
        for head, positions in enumerate(getattr(per_head, "positions", per_head)):
            mask[layer, head, torch.as_tensor(positions).long()] = True
    return mask


def tally_global_selection(tally: KeptTally, kept: list, case: dict, layerwise: bool) -> None:
    """Add one case of a global selection (KVzip and its kin: one top-k over every layer and head, or per layer when
    ``layerwise``) to ``tally``: per (layer, head) kvpress's recorded positions (``case["kept"]``), another choice where
    kvbench's whole selection keeps kvpress's total and is a valid top-k of kvpress's scores ``case["scores"]``
    ``[L, H, S]`` (over all layers, or each layer), or different.  ``kept``: kvbench's cache layers."""
    scores = torch.tensor(case["scores"])
    ours, theirs = positions_mask(kept, scores.shape), positions_mask(case["kept"], scores.shape)
    scope = list(zip(scores.unbind(0), ours.unbind(0), strict=True)) if layerwise else [(scores, ours)]
    valid = int(ours.sum()) == int(theirs.sum()) and all(valid_topk(s, m) for s, m in scope)
    tally.cases += 1
    for layer in range(scores.shape[0]):
        for head in range(scores.shape[1]):
            same = torch.equal(ours[layer, head], theirs[layer, head])
            tally.same += same
            tally.tied_valid += not same and valid
            tally.differ += not same and not valid


@contextmanager
def selected_scores(scorer_class: type) -> Iterator[list[torch.Tensor]]:
    """The ``[L, H, S]`` float32 scores each call of ``scorer_class.select`` receives (a replay's scores)."""
    seen: list[torch.Tensor] = []
    select = scorer_class.select

    def recording_select(self, scores, *args, **kwargs):
        seen.append(torch.stack(scores).float().clone())
        return select(self, scores, *args, **kwargs)

    scorer_class.select = recording_select
    try:
        yield seen
    finally:
        scorer_class.select = select


def assert_batched_equals_batch_one(family: str, question_mode: str, count: int, batch: int) -> None:
    """``run.decode_batch``: generation in a batch of ``batch`` gives every sample its batch-1 tokens, text, stop
    reason and cache record (the tiny random GQA Llama, seeded prompts, ``16L``)."""
    from kvbench.budget import parse_budget
    from kvbench.eviction.base import build_method
    from tests.inference.test_batch_decode import _model, _requests, assert_batched_equals_alone

    model, byte_tokenizer = _model("tiny-random-llama")
    method = build_method({"name": family, "family": family})
    budget = parse_budget("16L")
    requests = _requests(model.config.vocab_size, count, stops={7}, seed=1 if question_mode == "aware" else 2)
    alone = assert_batched_equals_alone(model, byte_tokenizer, method, budget, requests, question_mode, batch, family)
    for expected in alone:
        assert expected.record.evicted
