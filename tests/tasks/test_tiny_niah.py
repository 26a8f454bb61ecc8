"""tiny_niah: generator sizing and needle placement, determinism, scoring, the shipped tiny model, its accuracy,
and the reproducibility of scripts/train_tiny.py."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest
import torch

from kvbench.models.tiny import DEFAULT_MODEL_DIR, KEY_WORDS, VALUE_WORDS, build_tokenizer, vocabulary
from kvbench.tasks.base import build_task
from kvbench.tasks.tiny_niah import (
    HEADER_SINGULAR,
    MAX_NEW_TOKENS,
    MULTIKEY_NEEDLES,
    NUM_MULTI_VALUES,
    ORDINALS,
    VALUE_TOKENS,
    VARIANTS,
    TinyNiahDataset,
    build_instance,
    evaluate_dataset,
    multivalue_answer,
    string_match_all,
)
from kvbench.tasks.tiny_niah_training import training_example
from tests.task_config import task_config

REPO = Path(__file__).resolve().parents[2]
MODEL_DIR = DEFAULT_MODEL_DIR
HAS_MODEL = (MODEL_DIR / "model.safetensors").exists()


@pytest.fixture(scope="module")
def tokenizer():
    """The shipped tokenizer when present (what users load), else the one built in code."""
    if HAS_MODEL:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(MODEL_DIR)
    return build_tokenizer()


@pytest.fixture(scope="module")
def model():
    if not HAS_MODEL:
        pytest.skip("models/tiny-niah is not trained yet")
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(MODEL_DIR)
    loaded.eval()
    return loaded


def task_cfg(**overrides):
    """A task config with TaskConfig's defaults."""
    return task_config("tiny_niah", **{"num_samples": 2, **overrides})


# ----------------------------------------------------------------------------------------------- tokenizer


def test_tokenizer_is_word_level_and_round_trips(tokenizer):
    text = "one of the special magic numbers is " + KEY_WORDS[7] + " 51 ."
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text.split())
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids) == text
    # no BOS/EOS inserted on encode, so context and question can be encoded separately
    assert tokenizer(text)["input_ids"] == ids
    assert tokenizer.eos_token == "</s>"
    assert len(tokenizer) == len(vocabulary())


def test_shipped_tokenizer_matches_code(tokenizer):
    built = build_tokenizer()
    sample = TinyNiahDataset("niah_multivalue", 1024, 1, 3, built, None).samples()[0]
    assert tokenizer(sample.prompt)["input_ids"] == built(sample.prompt)["input_ids"]


# ----------------------------------------------------------------------------------------------- generator


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("length", [1024, 2048, 4096])
def test_samples_fit_target_length(tokenizer, variant, length):
    dataset = TinyNiahDataset(variant, length, 2, 42, tokenizer, None)
    for sample in dataset.samples():
        ids = tokenizer(sample.prompt, add_special_tokens=False)["input_ids"]
        assert tokenizer.unk_token_id not in ids
        assert len(ids) == sample.extra["prompt_tokens"] == sample.length
        # RULER rule: prompt + tokens to generate fit the target, and the haystack fills it (one unit of slack)
        assert length - 16 <= len(ids) + MAX_NEW_TOKENS[variant] <= length
        # the context/question split is at a token boundary
        context_ids = tokenizer(sample.context, add_special_tokens=False)["input_ids"]
        question_ids = tokenizer(sample.question, add_special_tokens=False)["input_ids"]
        assert context_ids + question_ids == ids


@pytest.mark.parametrize("variant", ["niah_single", "niah_multikey"])
@pytest.mark.parametrize("depth", [0.0, 25.0, 50.0, 90.0, 100.0])
def test_needle_at_requested_depth(tokenizer, variant, depth):
    dataset = TinyNiahDataset(variant, 2048, 1, 7, tokenizer, [depth])
    sample = dataset.samples()[0]
    words = sample.context.split()
    needle = f"numbers is {sample.extra['key']} {sample.answers[0]}".split()
    starts = [i for i in range(len(words)) if words[i : i + len(needle)] == needle]
    assert len(starts) == 1
    header = len(HEADER_SINGULAR.split())
    fraction = (starts[0] - header) / (len(words) - header)
    # other needles of niah_multikey (9 tokens each) shift word positions a little
    assert abs(fraction - depth / 100) < (0.03 if variant == "niah_single" else 0.08)
    assert sample.extra["depth"] == depth
    assert sample.question.split()[-3:] == ["number", "is", sample.extra["key"]]


@pytest.mark.parametrize("seed", [5, 6, 7])
def test_multivalue_has_four_needles_of_one_key_labelled_in_order(tokenizer, seed):
    """Four needles of the asked key, labelled first..fourth in order of appearance; answers in that order."""
    sample = TinyNiahDataset("niah_multivalue", 2048, 1, seed, tokenizer, [30.0]).samples()[0]
    key = sample.extra["key"]
    assert len(set(sample.answers)) == NUM_MULTI_VALUES
    starts = [
        sample.context.index(f"numbers is {key} {o} {v} .") for o, v in zip(ORDINALS, sample.answers, strict=True)
    ]
    assert starts == sorted(starts)
    assert sample.context.count(f" {key} ") == NUM_MULTI_VALUES
    depths = sample.extra["needle_depths"]
    assert len(depths) == NUM_MULTI_VALUES and depths == sorted(depths) and 30.0 in depths
    assert sample.question.split()[-2:] == [key, ORDINALS[0]]


@pytest.mark.parametrize("variant", VARIANTS)
def test_values_are_multi_token_and_no_number_repeats(tokenizer, variant):
    """Values are VALUE_TOKENS number tokens, and a number token occurs once per context (so copying is unique)."""
    for sample in TinyNiahDataset(variant, 1024, 3, 11, tokenizer, None).samples():
        numbers = [w for w in sample.context.split() if w in VALUE_WORDS]
        assert len(numbers) == len(set(numbers))
        for value in sample.answers:
            assert len(value.split()) == VALUE_TOKENS and all(w in VALUE_WORDS for w in value.split())
            assert f" {value} ." in sample.context and sample.extra["key"] in sample.context


def test_max_new_tokens_is_the_length_of_a_full_answer(tokenizer):
    """The generation budget holds exactly one complete answer in the training format."""
    key = KEY_WORDS[0]
    single = "57 83 ."
    multi = f"10 11 , {key} second 12 13 , {key} third 14 15 , {key} fourth 16 17"
    assert multi.split() == multivalue_answer(key, ["10 11", "12 13", "14 15", "16 17"])
    assert len(tokenizer(single)["input_ids"]) == MAX_NEW_TOKENS["niah_single"] == MAX_NEW_TOKENS["niah_multikey"]
    assert len(tokenizer(multi)["input_ids"]) == MAX_NEW_TOKENS["niah_multivalue"]
    assert string_match_all(multi, ["10 11", "12 13", "14 15", "16 17"]) == 1.0


def test_multikey_context_gives_no_hint_of_the_asked_key(tokenizer):
    sample = TinyNiahDataset("niah_multikey", 1024, 1, 5, tokenizer, [40.0]).samples()[0]
    lines = sample.context.split(" . ")
    needles = [line for line in lines if "magic numbers is" in line]
    # the asked needle looks like all the others and appears exactly once
    assert len(needles) == MULTIKEY_NEEDLES
    keys = [line.split(" numbers is ")[1].split()[0] for line in needles]
    assert len(keys) == len(set(keys))
    assert sample.extra["key"] in keys


def test_generation_is_deterministic_and_seeded(tokenizer):
    def prompts(seed):
        datasets = build_task(task_cfg(seed=seed, lengths=[1024]), tokenizer)
        return [(s.prompt, s.answers) for d in datasets for s in d.samples()]

    assert prompts(42) == prompts(42)
    assert prompts(42) != prompts(43)
    assert build_instance("niah_single", 30, 50.0, "x") == build_instance("niah_single", 30, 50.0, "x")


def test_builder_names_selection_and_errors(tokenizer):
    names = [d.name for d in build_task(task_cfg(lengths=[1024, 4096], num_samples=1), tokenizer)]
    assert names == [f"{v}_{k}" for k in ("1k", "4k") for v in VARIANTS]
    chosen = build_task(task_cfg(length=2048, datasets=["niah_multivalue_2k"]), tokenizer)
    assert [d.name for d in chosen] == ["niah_multivalue_2k"]
    assert chosen[0].chat_template is False and chosen[0].max_new_tokens == MAX_NEW_TOKENS["niah_multivalue"]
    with pytest.raises(ValueError, match="valid datasets"):
        build_task(task_cfg(length=2048, datasets=["niah_single_4k"]), tokenizer)
    with pytest.raises(ValueError, match=r"unknown task\.options"):
        build_task(task_cfg(options={"haystack": "essay"}), tokenizer)


def test_task_yaml_defaults_compose(tokenizer):
    from omegaconf import OmegaConf

    from kvbench.config import TaskConfig

    raw = OmegaConf.load(REPO / "conf" / "task" / "tiny_niah.yaml")
    raw.pop("defaults")
    cfg = OmegaConf.merge(OmegaConf.structured(TaskConfig), raw)
    datasets = build_task(cfg, tokenizer)
    assert {d.name for d in datasets} == {f"{v}_2k" for v in VARIANTS}
    assert all(len(d.samples()) == cfg.num_samples for d in datasets)


# ----------------------------------------------------------------------------------------------- scoring


def test_scorer_golden_cases(tokenizer):
    assert string_match_all("123 .", ["123"]) == 1.0
    assert string_match_all("124 .", ["123"]) == 0.0
    assert string_match_all("101 202 999 .", ["202", "101", "303", "999"]) == 0.75
    dataset = TinyNiahDataset("niah_multivalue", 1024, 3, 1, tokenizer, None)
    samples = dataset.samples()
    all_values = " ".join(samples[0].answers)
    two_values = " ".join(samples[1].answers[:2])
    predictions = [dataset.postprocess(f"  {all_values} .\n"), dataset.postprocess(two_values), ""]
    result = dataset.score(predictions, samples)
    assert result["score"] == round(100 * (1 + 0.5 + 0) / 3, 2)
    assert result["nulls"] == 1.0
    assert dataset.postprocess(" 123\t456 \x01") == "123\n456"


# ----------------------------------------------------------------------------------------------- training data


def test_training_example_supervision_matches_tokens():
    vocab = {w: i for i, w in enumerate(vocabulary())}
    for seed, length in [(0, 256), (1, 1024), (2, 4096)]:
        example = training_example(random.Random(seed), length, vocab.__getitem__)
        assert len(example.input_ids) == length
        assert example.positions, "every training sequence supervises answers"
        answer_tokens = {vocab[w] for w in (*VALUE_WORDS, *KEY_WORDS, *ORDINALS[1:], ".", ",")}
        assert set(example.targets()) <= answer_tokens  # only answer tokens are supervised
        assert all(0 <= position < length - 1 for position in example.positions)
        again = training_example(random.Random(seed), length, vocab.__getitem__)
        assert again == example


def test_training_multivalue_answers_enumerate_the_labelled_needles():
    """In drill sequences every multi-value answer lists the key's needles first..fourth, as the eval prompts do."""
    vocab = {w: i for i, w in enumerate(vocabulary())}
    words_of = {i: w for w, i in vocab.items()}
    checked = 0
    for seed in range(6):
        example = training_example(random.Random(seed), 2048, vocab.__getitem__, multi_focus=1.0)
        words = [words_of[i] for i in example.input_ids]
        needles: dict[str, list[str]] = {}
        for i in range(len(words) - 5):
            if words[i] == "is" and words[i + 2] in ORDINALS and words[i + 5] == ".":
                key, ordinal = words[i + 1], words[i + 2]
                assert ORDINALS.index(ordinal) == len(needles.setdefault(key, []))  # labelled in order
                needles[key].append(" ".join(words[i + 3 : i + 5]))
        for i in range(len(words) - 2):
            if words[i] == "are" and words[i + 2] == ORDINALS[0]:
                key = words[i + 1]
                answer = multivalue_answer(key, needles[key])
                assert words[i + 3 : i + 3 + len(answer)] == answer[: len(words) - i - 3]
                checked += 1
    assert checked >= 6


def _load_train_script():
    spec = importlib.util.spec_from_file_location("train_tiny", REPO / "scripts" / "train_tiny.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def test_training_is_reproducible(tmp_path):
    """Same seed -> bit-identical weights (a few steps of a miniature configuration)."""
    from safetensors.torch import load_file

    train = _load_train_script()
    threads = torch.get_num_threads()

    def run(name: str, seed: int) -> dict[str, torch.Tensor]:
        out = tmp_path / name
        args = ["--out", str(out), "--seed", str(seed), "--hidden", "32", "--layers", "2", "--heads", "2"]
        args += ["--kv-heads", "1", "--intermediate", "64", "--tokens-per-step", "256"]
        # two guided steps (eager attention + guidance loss), then one plain step (sdpa)
        args += ["--schedule", "128:2:0.5,256:1:0.0", "--guide-steps", "2"]
        args += ["--eval-every", "3", "--eval-samples", "1", "--final-lengths", "256"]
        args += ["--ckpt-dir", str(tmp_path / f"{name}_ckpt"), "--log-file", str(tmp_path / f"{name}.log")]
        assert train.main(args) == 0
        return load_file(out / "model.safetensors")

    try:
        first, second, other = run("a", 0), run("b", 0), run("c", 1)
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(False)
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert any(not torch.equal(first[k], other[k]) for k in first)


# ----------------------------------------------------------------------------------------------- shipped model


def test_model_loads_via_from_pretrained(model, tokenizer):
    config = model.config
    assert config.model_type == "llama"
    assert config.num_key_value_heads < config.num_attention_heads
    assert config.eos_token_id == tokenizer.eos_token_id is not None
    assert config.vocab_size == len(tokenizer)
    assert next(model.parameters()).dtype == torch.float32
    total = sum(f.stat().st_size for f in MODEL_DIR.rglob("*") if f.is_file())
    assert total <= 20 * 1024 * 1024


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("length", [1024, 4096])
def test_full_cache_accuracy_target(model, tokenizer, variant, length):
    """Greedy full-cache retrieval >= 95 % on fresh samples (task seed 2024, 20 needle depths 0-100 %; measured
    100/100/98.75 at 1K and 100/95/97.5 at 4K: the one multi-key miss has its needle at depth 0 of 4K)."""
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    depths = [round(100.0 * index / 19, 2) for index in range(20)]  # 20 evenly spaced depths, as measured
    dataset = TinyNiahDataset(variant, length, 20, 2024, tokenizer, depths)
    assert evaluate_dataset(model, tokenizer, dataset)["score"] >= 95.0
