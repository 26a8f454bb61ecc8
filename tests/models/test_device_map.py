"""``model.device_map`` (kvbench/models/loading.py): a model spread over two placements gives the same tokens and cache
record as the same model on one device, for every method family.

A CPU-only machine has one compute device, so the two placements are the ones accelerate offers there: the first
layers resident on ``cpu``, the others offloaded to ``disk`` (their weights on the meta device, loaded by
accelerate's hooks for each forward).  This runs accelerate's whole dispatch path (hooks moving inputs, offloaded
parameters, the embedding's execution device) with kvbench's cache and session passed through it; layers on
different GPUs were not available here (docs/devices.md).  About 25 s on 2 shared cores."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from kvbench.api import compose_config
from kvbench.budget import parse_budget
from kvbench.errors import KVBenchError
from kvbench.eviction.base import build_method
from kvbench.inference.generate import generate
from kvbench.models.loading import check_device_map, input_device, load_model
from kvbench.models.tiny import FILLER_WORDS

pytest.importorskip("accelerate")

#: One preset per method family (conf/method/).
FAMILY_PRESETS = ["snapkv", "pyramidkv", "ada_snapkv", "cake", "h2o", "tova", "ahakv", "xkv", "nacl", "streamingllm"]
#: NACL compresses prompts over 2048 tokens only, unless the budget is per layer (kvbench/methods/nacl.py).
BUDGETS = {"nacl": "64/layer"}
#: models/tiny-niah (3 layers): layer 0 and the ends resident, layers 1-2 offloaded to disk.
TWO_PLACEMENTS = {
    "model.embed_tokens": "cpu",
    "model.rotary_emb": "cpu",
    "model.layers.0": "cpu",
    "model.layers.1": "disk",
    "model.layers.2": "disk",
    "model.norm": "cpu",
    "lm_head": "cpu",
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    cfg = compose_config(model="tiny")
    single = load_model(cfg.model)
    cfg.model.device_map = TWO_PLACEMENTS
    cfg.model.offload_folder = str(tmp_path_factory.mktemp("offload"))
    spread = load_model(cfg.model)
    return single, spread


def prompt(tokenizer: object) -> tuple[list[int], list[int]]:
    """Context and question ids of a tiny_niah-style prompt (~400 tokens, the needle mid-way)."""
    rng = random.Random(7)
    sentences = [" ".join(rng.choices(FILLER_WORDS, k=8)) + " ." for _ in range(40)]
    context = (
        "a special magic number is hidden within the following text . make sure to memorize it . "
        + " ".join(sentences[:20])
        + " one of the special magic numbers is bababa 57 83 . "
        + " ".join(sentences[20:])
        + "\n"
    )
    question = "what is the special magic number for bababa ? the special magic number is bababa"
    return tokenizer.encode(context), tokenizer.encode(question)


def generate_on_both(loadeds: tuple, context: list[int], question: list[int], method_name: str, budget: str,
                     question_mode: str, max_new_tokens: int) -> list:  # fmt: skip
    """Greedy generation of the same prompt with ``method_name`` at ``budget`` on each loaded model."""
    method_cfg = compose_config(method=method_name).method
    return [
        generate(
            loaded.model,
            loaded.tokenizer,
            context,
            question,
            method=build_method(method_cfg),
            budget=parse_budget(budget),
            question_mode=question_mode,
            max_new_tokens=max_new_tokens,
            stop_token_ids=set(),
        )
        for loaded in loadeds
    ]


def test_the_map_places_layers_on_two_placements(models: tuple) -> None:
    _, spread = models
    assert spread.model.hf_device_map == TWO_PLACEMENTS
    offloaded = {name.split(".")[2] for name, p in spread.model.named_parameters() if p.device.type == "meta"}
    assert offloaded == {"1", "2"}
    assert spread.device == torch.device("cpu") and spread.model.config._attn_implementation == "kvbench"


@pytest.mark.parametrize("preset", FAMILY_PRESETS)
def test_two_placements_give_the_single_device_tokens(models: tuple, preset: str) -> None:
    single, spread = models
    context, question = prompt(single.tokenizer)
    outputs = generate_on_both((single, spread), context, question, preset, BUDGETS.get(preset, "64L"), "aware", 4)
    assert outputs[0].token_ids == outputs[1].token_ids
    assert outputs[0].record.achieved_per_head == outputs[1].record.achieved_per_head
    assert outputs[0].record.evicted  # the budget really cut the cache


def test_named_strategies_dispatch_builtin_models() -> None:
    cfg = compose_config(model="tiny-random-llama")
    single = load_model(cfg.model)
    cfg.model.device_map = "auto"
    spread = load_model(cfg.model)
    assert set(spread.model.hf_device_map.values()) <= {"cpu", "disk"}
    ids = single.tokenizer.encode("kvbench " * 40)
    outputs = generate_on_both((single, spread), ids, [], "snapkv", "16L", "aware", 3)
    assert outputs[0].token_ids == outputs[1].token_ids


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("everywhere", "model.device_map='everywhere'; valid: null, auto, balanced"),
        ({"model.layers.0": "tpu"}, "model.device_map['model.layers.0']='tpu'; valid devices"),
        ({"model.layers.0": 3}, "this machine has 0 CUDA device"),
        ({}, "valid: null, auto"),
    ],
)
def test_bad_device_maps_are_named(value: object, message: str) -> None:
    if torch.cuda.is_available():
        pytest.skip("the CUDA-count message depends on the machine")
    with pytest.raises(KVBenchError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        check_device_map(value)
    assert check_device_map(None) is None and check_device_map("balanced") == "balanced"


def test_offloaded_embedding_takes_inputs_on_its_execution_device(models: tuple, tmp_path: Path) -> None:
    """With the embedding itself offloaded (its weight on the meta device), inputs go to accelerate's execution
    device for it."""
    single, _ = models
    cfg = compose_config(model="tiny")
    cfg.model.device_map = {**TWO_PLACEMENTS, "model.embed_tokens": "disk", "lm_head": "disk"}
    cfg.model.offload_folder = str(tmp_path)
    spread = load_model(cfg.model)
    assert spread.model.get_input_embeddings().weight.device.type == "meta"
    assert input_device(spread.model) == torch.device("cpu")
    context, question = prompt(single.tokenizer)
    outputs = generate_on_both((single, spread), context, question, "snapkv", "64L", "agnostic", 4)
    assert outputs[0].token_ids == outputs[1].token_ids
