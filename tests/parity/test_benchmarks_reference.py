"""The benchmarks' samples as their official generators make them (issue #27): small cases worked out by hand from
the official code's semantics (NVIDIA/RULER ``scripts/data``, OpenCompass NeedleBench v1, the papers' LongBench
``pred.py``), and byte-level checks on the shipped inputs with the real Llama-3.1 tokenizer against digests of the
official code's own output."""

from __future__ import annotations

import hashlib
import json
import random
import string
from types import SimpleNamespace

import numpy as np
import pytest

from kvbench.errors import KVBenchError
from kvbench.prompting import encode_sample, render_prompt
from kvbench.tasks.base import Sample, build_task
from kvbench.tasks.ruler import build_ruler
from kvbench.tasks.ruler.datasets import RulerGenerator
from kvbench.tasks.ruler.inputs import RulerInputs, pseudo_words
from kvbench.tasks.ruler.niah import join_at_depths
from kvbench.tasks.ruler.sizing import Generated
from kvbench.tasks.ruler.spec import TASKS
from kvbench.tasks.ruler.templates import RULER_TEMPLATES, auto_ruler_template, ruler_template
from kvbench.tasks.text_inputs import TextTokenizer
from tests.task_config import task_config


@pytest.fixture(scope="module")
def llama31(real_tokenizer):
    return real_tokenizer("llama3", "llama3.1")


def _generator(task: str, length: int = 4096, tokenizer=None, template: str = "base") -> RulerGenerator:
    return RulerGenerator(
        TASKS[task], length, TextTokenizer(tokenizer), 42, 0, RulerInputs(None),
        ruler_template=RULER_TEMPLATES[template],
    )  # fmt: skip


# ---- RULER, item 1: one probe, then the binary search (no extra draw before the search) ----------------------


def test_size_search_builds_one_probe_then_bisects():
    generator = _generator("niah_single_1", length=100)
    calls: list[int] = []

    def build(units: int) -> Generated:
        calls.append(units)
        return Generated(context=" a" * units, question="", answer_prefix="", answers=[])

    incremental, best = generator.search(build, 10)
    # RULER: probe(10) -> 1 token per unit -> upper = max(int(100 / 1 * 3), 20) = 300; bisect [10, 300].
    assert calls[:3] == [10, 155, 82]
    assert (incremental, best) == (10, 100)


# ---- RULER, items 2 and 5: essay words, empty pieces at the insertion points ------------------------------------


def test_essay_words_keep_the_trailing_empty_word(tmp_path):
    (tmp_path / "PaulGrahamEssays.json").write_text(json.dumps({"text": "One  two.\nThree four.\n"}))
    # re.sub(r"\s+", " ", text).split(" "): the text ends in whitespace, so the last word is empty
    assert RulerInputs(tmp_path).essay_words == ["One", "two.", "Three", "four.", ""]


def test_needles_at_depth_0_and_100_leave_empty_pieces():
    # insertion points [0, 0, 2, 2]: "" N1 "A. B." N2 "" joined by spaces
    assert join_at_depths(["A.", "B."], [0, 2], ["N1", "N2"]) == " N1 A. B. N2 "
    # two needles at one point: an empty run between them, a double space
    assert join_at_depths(["A.", "B."], [1, 1], ["N1", "N2"]) == "A. N1  N2 B."


# ---- RULER, item 3: CWE's word pool -----------------------------------------------------------------------------


def test_cwe_pool_is_the_sorted_words_shuffled_by_the_seed():
    generator = _generator("cwe")
    inputs = generator.inputs
    expected = sorted(set(inputs.words["nouns"] + inputs.words["adjectives"] + inputs.words["verbs"]))
    random.Random(42).shuffle(expected)
    assert generator.cwe_pool(40) == expected


def test_cwe_pool_beyond_the_word_lists_is_rulers_english_words(tmp_path):
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / "english_words.json").write_text(json.dumps({"a": "alpha", "b": "beta", "c": "gamma"}))
    generator = RulerGenerator(TASKS["cwe"], 4096, TextTokenizer(None), 42, 0, RulerInputs(tmp_path))
    # RULER: random.sample(randle_words, n) with randle_words = list(json.load(f).values()) once n > len(words)
    assert generator.cwe_pool(10**6) == ["alpha", "beta", "gamma"]
    assert "english_words" in generator.inputs.used_by(TASKS["cwe"])


# ---- RULER, item 4: variable tracking ---------------------------------------------------------------------------


def test_vt_names_from_random_values_from_numpy():
    generator = _generator("vt")
    names, chains = generator.chains(is_icl=False)
    rng = random.Random(42)
    expected_names = ["".join(rng.choices(string.ascii_uppercase, k=5)) for _ in range(5)]
    value = np.random.RandomState(42).randint(10000, 99999)
    assert names == [expected_names]
    assert chains[0][0] == f"VAR {expected_names[0]} = {value}"
    assert chains[0][1] == f"VAR {expected_names[1]} = VAR {expected_names[0]} "  # RULER's trailing space


def test_vt_example_is_randomised_by_string_replacement():
    generator = _generator("vt")
    example = "VAR ABC = 12345\nVAR ABD = VAR ABC \n they are: ABC ABD ABE ABF ABG\n"
    rng = random.Random(42)
    out = example
    for name in ["ABC", "ABD", "ABE", "ABF", "ABG"]:
        out = out.replace(name, "".join(rng.choices(string.ascii_uppercase, k=3)))
    out = out.replace("12345", str(np.random.RandomState(42).randint(10000, 99999)))
    assert generator.randomized_icl(example) == out


def test_vt_example_precedes_the_instruction_inside_the_template(tokenizer):
    cfg = task_config("ruler", datasets=["vt"], length=1024, num_samples=1, options={"ruler_template": "meta-chat"})
    (ds,) = build_ruler(cfg, tokenizer)
    sample = ds.samples()[0]
    instruction = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
    assert sample.context.startswith("[INST] " + instruction)  # the example: raw task template, no model template
    assert sample.context.count(instruction) == 2 and "\n\n" + instruction in sample.context
    assert sample.question.endswith(" [/INST]") and "[INST]" not in sample.context[1:]


# ---- RULER, item 6: RULER's per-model templates ------------------------------------------------------------------


def test_ruler_template_chosen_from_the_model(llama31):
    assert auto_ruler_template(llama31, True) == "meta-llama3"  # from its published template (no hub name)
    assert auto_ruler_template(llama31, False) == "base"  # model.chat_template=false: the task text alone
    mistral = SimpleNamespace(name_or_path="mistralai/Mistral-7B-Instruct-v0.2", chat_template="[INST] ... [/INST]")
    assert auto_ruler_template(mistral, True) == "base"  # RULER has no template for it
    llama2 = SimpleNamespace(name_or_path="meta-llama/Llama-2-7b-chat-hf", chat_template="")
    assert auto_ruler_template(llama2, True) == "meta-chat"
    with pytest.raises(KVBenchError, match=r"ruler_template='llama3' is not a RULER template; valid: auto, base"):
        ruler_template("llama3", llama31, True)


def test_singular_rewrite_covers_the_model_template(tokenizer):
    # RULER rewrites the whole template ("are" -> "is") when one value is asked: lwm-chat's text too.
    options = {"ruler_template": "lwm-chat"}
    cfg = task_config("ruler", datasets=["niah_single_1"], length=1024, num_samples=1, options=options)
    (ds,) = build_ruler(cfg, tokenizer)
    sample = ds.samples()[0]
    assert sample.context.startswith("You is a helpful assistant. USER: A special magic number is hidden")
    assert sample.question.endswith("mentioned in the provided text? ASSISTANT: ")
    assert sample.answer_prefix.startswith(" The special magic number for ")
    assert ds.chat_template is False  # the model's own template is not applied on top


def test_chat_model_without_a_ruler_template_gets_base_with_a_warning(caplog):
    mistral = SimpleNamespace(name_or_path="mistralai/Mistral-7B-Instruct-v0.2", chat_template="[INST] ... [/INST]")
    with caplog.at_level("WARNING"):
        (ds,) = build_ruler(task_config("ruler", datasets=["vt"]), mistral, chat_template=True)
    assert ds.ruler_template == "base" and "task.options.chat_template=model" in caplog.text


def test_chat_template_option_is_validated(tokenizer):
    with pytest.raises(ValueError, match=r"task.options.chat_template='jinja' is not valid; valid: ruler, model"):
        build_ruler(task_config("ruler", datasets=["vt"], options={"chat_template": "jinja"}), tokenizer)
    (ds,) = build_ruler(task_config("ruler", datasets=["vt"], options={"chat_template": "model"}), tokenizer, True)
    assert ds.chat_template is True and ds.ruler_template is None


# ---- LongBench, item 10: the papers' double BOS ------------------------------------------------------------------


@pytest.mark.parametrize(("bos", "expected"), [("single", 1), ("reference_double", 2)])
def test_longbench_bos_modes(llama31, bos, expected):
    tokenizer = llama31
    sample = Sample(id="s", context="Read this.\n\n", question="Question: why?\nAnswer:", answers=["x"])
    encoded = encode_sample(tokenizer, sample, max_input_length=1000, use_chat_template=True, bos=bos)
    ids = encoded.input_ids
    assert ids[:expected] == [tokenizer.bos_token_id] * expected and ids[expected] != tokenizer.bos_token_id
    # AdaKV pred.py: tokenizer(apply_chat_template(..., tokenize=False)) with the tokenizer's special tokens
    templated = tokenizer.apply_chat_template(
        [{"role": "user", "content": sample.context + sample.question}], tokenize=False, add_generation_prompt=True
    )
    if bos == "reference_double":
        assert ids == tokenizer(templated).input_ids
    untemplated = encode_sample(tokenizer, sample, max_input_length=1000, use_chat_template=False, bos=bos)
    assert untemplated.input_ids[:2] == [tokenizer.bos_token_id, tokenizer("Read").input_ids[1]]


def test_longbench_bos_is_recorded_and_validated():
    (ds,) = build_task(task_config("longbench", datasets=["qasper"], options={"bos": "reference_double"}), None)
    assert ds.describe()["bos"] == "reference_double"


# ---- byte level: the official generators' output on the shipped inputs ---------------------------------------
# sha256 of RULER's ``input + answer_prefix`` (first sample, seed 42), produced by NVIDIA/RULER c3f5e3b
# ``scripts/data/prepare.py --tokenizer_type hf`` with the Llama-3.1 tokenizer of kvbench.models.tokenizers, fed the
# shipped word lists, essays and QA fixtures (nltk's sentence splitter replaced by kvbench's, which agrees on them).
# CWE's 4096-word size probe needs more words than the shipped lists hold, so RULER reads english_words.json: both
# sides were given the same one (kvbench's 30,000 pseudo-words as its values, in the test's input folder).
OFFICIAL_RULER = {
    "niah_single_1:4096:meta-llama3": "71fdaaf26fe75e2ed2d7570ae92b6f385a014e11bd1f14e72985250d95e4e9e2",
    "niah_single_2:4096:base": "1693a68e97c7e5c23cad3c2c72ea6ed54ba37490e2f72c759de2ce8d5a022ee6",
    "vt:4096:base": "3b69ba2cb3b69e37cb5a838f4dd8ad6a641a637a3f4a81d612968c5e8526afcd",
    "cwe:4096:base": "77563be74c158bd60e69c5abba3440490418692ecbaa2e30cbd3d3c96ee2aa2a",
}


@pytest.mark.parametrize("case", sorted(OFFICIAL_RULER))
def test_ruler_bytes_match_the_official_generator(llama31, case, tmp_path):
    task, length, template = case.split(":")
    tokenizer = llama31
    (tmp_path / "json").mkdir()
    english = {str(i): word for i, word in enumerate(pseudo_words(30000, set()))}
    (tmp_path / "json" / "english_words.json").write_text(json.dumps(english))
    options = {"ruler_template": template}
    cfg = task_config("ruler", datasets=[task], length=int(length), num_samples=1, data_dir=str(tmp_path),
                      options=options)  # fmt: skip
    (ds,) = build_ruler(cfg, tokenizer, chat_template=True)
    (sample,) = ds.generate_samples(1)
    text = render_prompt(tokenizer, sample.context, sample.question, answer_prefix=sample.answer_prefix,
                         shots=sample.shots, use_chat_template=False).text  # fmt: skip
    assert hashlib.sha256(text.encode()).hexdigest() == OFFICIAL_RULER[case]


# sha256 of the prompt OpenCompass a5acc4bb ``NeedleBenchOriginDataset.load`` / ``NeedleBenchParallelDataset.load``
# builds from the shipped needles and Chinese haystack (as ``needles.jsonl`` / ``zh_finance.jsonl``), tiktoken
# replaced by the Llama-3.1 tokenizer; the parallel load after ``random.seed(42)`` (see README: its needle draw).
# Chinese 3000: the corpus ends before the target (no cycling); 1000: the prompt overshoots (no trimming).
OFFICIAL_NEEDLEBENCH = {
    ("single_retrieval_zh", 3000, (50,)): "b8f3448470b2b9c5d8edf4d4a8e1a42aea34260bcb35f30a614b1a988e4dc991",
    ("multi_retrieval_zh", 1000, (0, 25, 50, 75)): "29fa3e293ac236ab5610e93c2c8f4cd4f2249e024c89389cbc3b5bae77f46a62",
}


@pytest.mark.parametrize("case", sorted(OFFICIAL_NEEDLEBENCH))
def test_needlebench_bytes_match_opencompass(llama31, case):
    name, length, depths = case
    options = {"size": "4k", "repeats": 1, "source": "shipped"}
    cfg = task_config("needlebench", datasets=[name], lengths=[length], depths=list(depths), options=options)
    (ds,) = build_task(cfg, llama31)
    sample = ds.samples()[0]
    prompt = sample.context + sample.question
    assert hashlib.sha256(prompt.encode()).hexdigest() == OFFICIAL_NEEDLEBENCH[case]
