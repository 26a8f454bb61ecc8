"""The public Python API (kvbench/api.py, kvbench/inference/press.py): the docs' example (docs/api.md) runs as
written, ``press`` matches plain ``model.generate`` and kvbench's own generation, records the budget, runs
question-agnostic, and leaves the model as it found it.  About 30 s on 2 shared cores (the example's evaluate: 6
samples)."""

from __future__ import annotations

import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import kvbench
from kvbench.budget import parse_budget
from kvbench.errors import KVBenchError
from kvbench.eviction.base import build_method
from kvbench.inference.generate import generate
from kvbench.inference.press import kvbench_attention
from kvbench.models.tiny import FILLER_WORDS
from kvbench.resources import models_dir

REPO = Path(__file__).resolve().parent.parent


#: The page that shows the API example (the documentation site's Python API page).
API_PAGE = REPO / "docs" / "api.md"


def readme_example() -> str:
    """The fenced Python block after the ``<!-- api-example -->`` marker in docs/api.md."""
    text = API_PAGE.read_text(encoding="utf-8")
    match = re.search(r"<!-- api-example -->\s*```python\n(.*?)```", text, flags=re.DOTALL)
    assert match, "docs/api.md lost its <!-- api-example --> block"
    return match.group(1)


@pytest.fixture(scope="module")
def tiny() -> tuple[torch.nn.Module, object]:
    path = models_dir() / "tiny-niah"
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def niah_prompt(tokenizer: object, seed: int = 0) -> tuple[dict[str, torch.Tensor], int]:
    """A tiny_niah-style prompt (~600 tokens) and the token count of its context."""
    rng = random.Random(seed)
    sentences = [" ".join(rng.choices(FILLER_WORDS, k=8)) + " ." for _ in range(60)]
    context = (
        "a special magic number is hidden within the following text . make sure to memorize it . i will quiz you "
        "about the number afterwards . " + " ".join(sentences[:30]) + " one of the special magic numbers is bababa "
        "57 83 . " + " ".join(sentences[30:]) + "\n"
    )
    question = "what is the special magic number for bababa ? the special magic number is bababa"
    return tokenizer(context + question, return_tensors="pt"), len(tokenizer(context).input_ids)


def model_state(model: torch.nn.Module) -> tuple:
    return (
        model.config._attn_implementation,
        model.training,
        len(model._forward_pre_hooks),
        len(model._forward_hooks),
    )


def test_readme_api_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    namespace: dict[str, object] = {}
    exec(compile(readme_example(), "docs/api.md:api-example", "exec"), namespace)
    out = capsys.readouterr().out
    result = namespace["result"]
    assert sorted(result.scores) == ["niah_multikey_1k", "niah_multivalue_1k", "niah_single_1k"]
    for row in result.summary["datasets"]:
        assert row["n_samples"] == 2 and row["ci95"][0] <= row["score"] <= row["ci95"][1]
        assert len(result.predictions[row["dataset"]]) == 2
    assert result.folder is None  # no output_dir: a temporary folder, removed
    # The press printed what its comments say.
    assert "57 83 ." in out and "[64, 64, 64] [64, 64, 64]" in out
    model = namespace["model"]
    assert model.config._attn_implementation != "kvbench" and not model._forward_pre_hooks


def test_import_kvbench_is_cheap() -> None:
    code = "import sys, kvbench; print('torch' in sys.modules, 'hydra' in sys.modules, callable(kvbench.__getattr__))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False", "True"]


def test_full_press_equals_plain_generate_and_restores_the_model(tiny: tuple) -> None:
    model, tokenizer = tiny
    inputs, _ = niah_prompt(tokenizer)
    before = model_state(model)
    plain = model.generate(**inputs, max_new_tokens=6, do_sample=False)
    with kvbench.press(model, "full", "full") as record:
        pressed = model.generate(**inputs, max_new_tokens=6, do_sample=False)
        assert model.config._attn_implementation == "kvbench"
    assert torch.equal(plain, pressed)
    prompt_length = inputs.input_ids.shape[1]
    assert record.achieved_per_layer == [prompt_length] * model.config.num_hidden_layers
    assert model_state(model) == before
    assert torch.equal(model.generate(**inputs, max_new_tokens=6, do_sample=False), plain)


@pytest.mark.parametrize("question_mode", ["aware", "agnostic"])
def test_press_matches_kvbench_generation_and_keeps_the_budget(tiny: tuple, question_mode: str) -> None:
    """A press gives the tokens and cache record of kvbench's own generation loop (what runs write)."""
    model, tokenizer = tiny
    inputs, context_length = niah_prompt(tokenizer, seed=1)
    ids = inputs.input_ids[0].tolist()
    split = context_length if question_mode == "agnostic" else len(ids)
    extra = {"context_length": context_length} if question_mode == "agnostic" else {}
    with kvbench.press(model, "snapkv", "64L", question_mode, **extra) as record:
        pressed = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    new_tokens = pressed[0, len(ids) :].tolist()
    with kvbench_attention(model):
        reference = generate(
            model,
            tokenizer,
            ids[:split],
            ids[split:],
            method=build_method(kvbench.compose_config(method="snapkv").method),
            budget=parse_budget("64L"),
            question_mode=question_mode,
            max_new_tokens=4,
            stop_token_ids=set(),
        )
    assert new_tokens == reference.token_ids
    layers = model.config.num_hidden_layers
    assert record.requested_per_layer == record.achieved_per_layer == [64] * layers
    assert record.last.context_tokens == split
    for field in ("requested_per_head", "achieved_per_head", "final_per_layer", "evicted"):
        assert getattr(record.last, field) == getattr(reference.record, field), field
    assert 0 < record.kept_fraction < 0.2


def test_question_length_splits_like_context_length_and_each_generate_is_a_new_prompt(tiny: tuple) -> None:
    model, tokenizer = tiny
    inputs, context_length = niah_prompt(tokenizer, seed=2)
    question_length = inputs.input_ids.shape[1] - context_length
    outputs = []
    for split in ({"context_length": context_length}, {"question_length": question_length}):
        with kvbench.press(model, "streamingllm", "64L", "agnostic", **split) as record:
            outputs.append(model.generate(**inputs, max_new_tokens=3, do_sample=False))
            model.generate(**inputs, max_new_tokens=3, do_sample=False)
        assert len(record.prompts) == 2 and record.prompts[0].context_tokens == context_length
    assert torch.equal(outputs[0], outputs[1])


def test_press_refuses_bad_input_clearly(tiny: tuple) -> None:
    model, tokenizer = tiny
    inputs, _ = niah_prompt(tokenizer)
    before = model_state(model)
    with pytest.raises(ValueError, match=r"context_length= .* or question_length="):
        kvbench.press(model, "snapkv", "64L", "agnostic")
    with pytest.raises(ValueError, match="only applies to question_mode='agnostic'"):
        kvbench.press(model, "snapkv", "64L", context_length=10)
    with pytest.raises(ValueError, match="question_mode='sideways'; valid: aware, agnostic"):
        kvbench.press(model, "snapkv", "64L", "sideways")
    with pytest.raises(KVBenchError, match="snapkvv"):
        kvbench.press(model, "snapkvv", "64L")
    with pytest.raises(KVBenchError, match="budget"):
        kvbench.press(model, "snapkv", "64 tokens")
    batch = {key: value.repeat(2, 1) for key, value in inputs.items()}
    with pytest.raises(ValueError, match="batch size 1"), kvbench.press(model, "snapkv", "64L"):
        model.generate(**batch, max_new_tokens=2, do_sample=False)
    with pytest.raises(ValueError, match="use_cache=False"), kvbench.press(model, "snapkv", "64L"):
        model.generate(**inputs, max_new_tokens=2, do_sample=False, use_cache=False)
    too_long = inputs.input_ids.shape[1]
    refused = pytest.raises(ValueError, match=f"context_length={too_long} does not split")
    with refused, kvbench.press(model, "snapkv", "64L", "agnostic", context_length=too_long):
        model.generate(**inputs, max_new_tokens=2, do_sample=False)
    assert model_state(model) == before  # restored after every failure


def test_config_objects_and_budget_strings(tiny: tuple) -> None:
    model, tokenizer = tiny
    inputs, _ = niah_prompt(tokenizer)
    method = {"name": "my_snapkv", "family": "snapkv", "window": 8, "params": {"kernel_size": 5}}
    with kvbench.press(model, method, "48/layer") as record:
        model.generate(**inputs, max_new_tokens=2, do_sample=False)
    assert record.method == "my_snapkv" and record.budget == "48/layer"
    assert kvbench.compose_config(budget="48/layer").budget.name == "48perlayer"
    assert record.achieved_per_layer == [48] * model.config.num_hidden_layers
    with pytest.raises(KVBenchError, match="windoww"):
        kvbench.press(model, {"name": "x", "family": "snapkv", "windoww": 8}, "64L")


def test_compose_config_inside_another_hydra_app_restores_it() -> None:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from kvbench.resources import conf_dir

    with initialize_config_dir(config_dir=str(conf_dir() / "method"), version_base="1.3"):
        cfg = kvbench.compose_config(method="h2o", budget="96L", overrides=["method.window=16"])
        assert (cfg.method.name, cfg.method.params.window, cfg.budget.spec) == ("h2o", 16, "96L")
        assert compose("tova").name == "tova"  # the surrounding app still composes from its own tree
    assert not GlobalHydra.instance().is_initialized()


def test_evaluate_refuses_bad_settings_before_any_work(tiny: tuple, tmp_path: Path) -> None:
    model, tokenizer = tiny
    before = model_state(model)
    with pytest.raises(KVBenchError, match=r"max_input_lenght.*the keys of model are: name, path"):
        kvbench.evaluate(model, tokenizer, overrides=["model.max_input_lenght=5"], output_dir=tmp_path)
    with pytest.raises(KVBenchError, match=r"^question_mode='sideways' is not valid; valid: aware, agnostic"):
        kvbench.evaluate(model, tokenizer, question_mode="sideways", output_dir=tmp_path)
    with pytest.raises(KVBenchError, match="tiny_niahh"):
        kvbench.evaluate(model, tokenizer, task="tiny_niahh", output_dir=tmp_path)
    assert not any(tmp_path.iterdir()) and model_state(model) == before
