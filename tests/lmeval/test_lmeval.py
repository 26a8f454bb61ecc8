"""The lm-eval bridge (kvbench/lmeval/) on tiny local tasks in lm-eval's own task format, offline.

A multiple-choice task and a generate_until task are written as lm-eval task YAMLs reading local JSONL files
(``dataset_path: json``); the model is the byte-level ``builtin:tiny-random-llama`` (any text tokenises).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

lm_eval = pytest.importorskip("lm_eval")

from hydra import compose, initialize_config_dir  # noqa: E402

from kvbench.app.validation import validate_run  # noqa: E402
from kvbench.budget import parse_budget  # noqa: E402
from kvbench.config import register_configs  # noqa: E402
from kvbench.errors import KVBenchError  # noqa: E402
from kvbench.eviction.base import build_method  # noqa: E402
from kvbench.lmeval.loglikelihood import compress_context, score_continuation  # noqa: E402
from kvbench.lmeval.model import KVBenchLM  # noqa: E402
from kvbench.lmeval.presets import method_config  # noqa: E402
from kvbench.lmeval.tasks import load_tasks, task_manager  # noqa: E402
from kvbench.models.loading import build_builtin  # noqa: E402
from kvbench.run.runner import Runner  # noqa: E402

CONF = Path(__file__).resolve().parents[2] / "conf"
MODEL = "builtin:tiny-random-llama"
FILLER = "Some background text that the question does not need, repeated to make the prompt longer. "
MC_DOCS = [
    {"question": FILLER * 2 + "The sun rises in the", "choices": ["east", "west", "north"], "label": 0},
    {"question": FILLER + "Water freezes at zero degrees", "choices": ["Celsius", "Kelvin"], "label": 0},
    {"question": FILLER * 3 + "A cat says", "choices": ["meow", "woof", "moo", "quack"], "label": 0},
]
GEN_DOCS = [{"q": FILLER + "Say hello", "a": "hello"}, {"q": FILLER * 2 + "Count: one two", "a": "three"}]


def _write_tasks(root: Path) -> Path:
    """Two lm-eval tasks (``kv_mc``: multiple choice, ``kv_gen``: generate_until) over local JSONL files."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "mc.jsonl").write_text("".join(json.dumps(d) + "\n" for d in MC_DOCS))
    (root / "gen.jsonl").write_text("".join(json.dumps(d) + "\n" for d in GEN_DOCS))
    (root / "kv_mc.yaml").write_text(
        f"task: kv_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {root / 'mc.jsonl'}\n"
        "test_split: test\noutput_type: multiple_choice\n"
        'doc_to_text: "Question: {{question}}\\nAnswer:"\ndoc_to_choice: "{{choices}}"\ndoc_to_target: label\n'
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n"
    )
    # Stop strings the random model produces within a few tokens (so `until` really cuts), and a token limit.
    (root / "kv_gen.yaml").write_text(
        f"task: kv_gen\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {root / 'gen.jsonl'}\n"
        'test_split: test\noutput_type: generate_until\ndoc_to_text: "Q: {{q}}\\nA:"\ndoc_to_target: a\n'
        'generation_kwargs:\n  until: ["\\r", "*"]\n  max_gen_toks: 12\n  do_sample: false\n'
        "metric_list:\n  - metric: exact_match\n"
    )
    return root


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_tasks(tmp_path_factory.mktemp("lmeval_tasks"))


@pytest.fixture(scope="module")
def manager(task_dir: Path):
    return task_manager(str(task_dir), include_defaults=False)


def _evaluate(model, manager, tasks=("kv_mc", "kv_gen"), **kwargs):
    return lm_eval.simple_evaluate(
        model=model, tasks=list(tasks), task_manager=manager, bootstrap_iters=0, log_samples=True, **kwargs
    )


def _responses(output, task):
    return [sample["resps"] for sample in output["samples"][task]]


def test_full_equals_lm_eval_hf_model(manager) -> None:
    """method=full: every continuation's log-likelihood, greedy flag, accuracy and generated text equal lm-eval's
    own ``hf`` model on the same weights (standard SDPA attention, one forward per request)."""
    from lm_eval.models.huggingface import HFLM

    ours = _evaluate("kvbench", manager, model_args=f"pretrained={MODEL},method=full,budget=full")
    weights, tokenizer = build_builtin("tiny-random-llama", seed=0)
    theirs = _evaluate(HFLM(pretrained=weights.eval(), tokenizer=tokenizer, device="cpu", batch_size=1), manager)
    for ours_doc, their_doc in zip(_responses(ours, "kv_mc"), _responses(theirs, "kv_mc"), strict=True):
        for [(ours_lp, ours_greedy)], [(their_lp, their_greedy)] in zip(ours_doc, their_doc, strict=True):
            assert math.isclose(ours_lp, their_lp, rel_tol=1e-5, abs_tol=1e-4)
            assert ours_greedy == their_greedy
    for metric in ("acc,none", "acc_norm,none"):
        assert ours["results"]["kv_mc"][metric] == theirs["results"]["kv_mc"][metric]
    ours_text, their_text = _responses(ours, "kv_gen"), _responses(theirs, "kv_gen")
    assert ours_text == their_text
    assert any(len(text[0]) < 12 for text in ours_text)  # a stop string cut at least one output


def test_budget_compresses_each_context_once(manager) -> None:
    """With a budget: one compressed prefill per distinct context, fewer tokens kept (recorded), every choice
    scored on the same, unmodified compressed cache; results differ from the full cache."""
    lm = KVBenchLM(pretrained=MODEL, method="snapkv", budget="0.2x", question_mode="agnostic")
    _evaluate(lm, manager, tasks=["kv_mc"])
    records = [r for r in lm.records if r["kind"] == "loglikelihood"]
    assert [r["continuations"] for r in records] == [len(d["choices"]) for d in MC_DOCS]  # one prefill per doc
    for record in records:
        assert record["fingerprint"] == record["fingerprint_after"]  # scoring never wrote to the compressed cache
        cache = record["cache"]
        assert cache["evicted"] and record["compressed_tokens"] == record["context_tokens"] - 1
        assert all(kept < cache["context_tokens"] for kept in cache["achieved_per_layer"])
        assert cache["achieved_per_layer"] == [round(0.2 * cache["context_tokens"])] * 4


def test_generate_until_batched_equals_one_at_a_time(manager) -> None:
    """``decode_batch=3`` (issue #33): the generate_until task's texts and cache records equal one-at-a-time
    generation, in request order, with a decode-time policy and stop strings."""
    outputs, records = [], []
    for batch in (1, 3):
        lm = KVBenchLM(pretrained=MODEL, method="h2o", budget="0.3x", decode_batch=batch)
        outputs.append(_responses(_evaluate(lm, manager, tasks=["kv_gen"]), "kv_gen"))
        records.append([(r["cache"], r["new_tokens"], r["stop_reason"]) for r in lm.records])
        assert {r["decode_batch"] for r in lm.records} == {batch}
    assert outputs[0] == outputs[1] and records[0] == records[1]


@pytest.mark.parametrize("question_mode", ["agnostic", "aware"])
def test_choices_see_the_same_compressed_cache(question_mode: str) -> None:
    """Scoring a choice leaves nothing behind: A, B, A again give A's score twice, equal to A scored on a freshly
    compressed cache; a budget changes the scores (agnostic: even a one-token continuation's)."""
    weights, tokenizer = build_builtin("tiny-random-llama", seed=0)
    weights.set_attn_implementation("kvbench")
    method, budget = build_method(method_config("h2o")), parse_budget("0.25x")
    context = tokenizer.encode(FILLER * 2 + "Question: the sun rises in the\nAnswer:")
    choice_a, choice_b = tokenizer.encode(" east", add_special_tokens=False), [tokenizer.encode("w")[-1]]

    def compress():
        return compress_context(weights, context, method=method, budget=budget, question_mode=question_mode)

    shared = compress()
    first_a = score_continuation(weights, shared, choice_a)
    score_b = score_continuation(weights, shared, choice_b)
    assert score_continuation(weights, shared, choice_a) == first_a
    assert score_continuation(weights, compress(), choice_a) == first_a
    full = compress_context(weights, context, method=build_method(method_config("full")), budget=parse_budget("full"))
    assert score_continuation(weights, full, choice_a)[0] != pytest.approx(first_a[0])
    one_token_full = score_continuation(weights, full, choice_b)[0]
    assert (score_b[0] == pytest.approx(one_token_full)) == (question_mode == "aware")


def test_refusals_and_bad_arguments(manager) -> None:
    lm = KVBenchLM(pretrained=MODEL, method="full")
    with pytest.raises(NotImplementedError, match="loglikelihood_rolling"):
        lm.loglikelihood_rolling([])
    with pytest.raises(KVBenchError, match="unknown --model_args"):
        KVBenchLM(pretrained=MODEL, method="snapkv", windw=8)
    with pytest.raises(
        KVBenchError, match=r"unknown method 'snapkvv' \(there is no conf/method/snapkvv.yaml\); valid: .*snapkv"
    ):
        KVBenchLM(pretrained=MODEL, method="snapkvv")
    with pytest.raises(KVBenchError, match="budget='20%'"):
        KVBenchLM(pretrained=MODEL, method="snapkv", budget="20%")
    assert KVBenchLM(pretrained=MODEL, method="snapkv", **{"method.window": 8}).method.window == 8


def test_missing_dataset_names_it(tmp_path: Path) -> None:
    """A task whose data is absent fails before any model loads, naming the task and the dataset."""
    (tmp_path / "gone.yaml").write_text(
        f"task: gone\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {tmp_path / 'absent.jsonl'}\n"
        'test_split: test\noutput_type: multiple_choice\ndoc_to_text: "{{q}}"\ndoc_to_choice: ["a", "b"]\n'
        "doc_to_target: 0\n"
    )
    manager = task_manager(str(tmp_path), include_defaults=False)
    with pytest.raises(KVBenchError, match=r"lm-eval task 'gone': cannot load json \(data_files .*absent.jsonl"):
        load_tasks(manager, ["gone"])
    with pytest.raises(KVBenchError, match="unknown lm-eval task"):
        load_tasks(manager, ["arc_easyy"])


def test_offline_hub_dataset_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With HF_DATASETS_OFFLINE and the dataset not in the cache: a clear error naming the hub dataset."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    (tmp_path / "hub.yaml").write_text(
        "task: hub_task\ndataset_path: kvbench-absent/short-text\ndataset_name: easy\ntest_split: test\n"
        'output_type: multiple_choice\ndoc_to_text: "{{q}}"\ndoc_to_choice: ["a", "b"]\ndoc_to_target: 0\n'
    )
    manager = task_manager(str(tmp_path), include_defaults=False)
    with pytest.raises(KVBenchError, match=r"cannot load kvbench-absent/short-text \(subset easy\).*HF_DATASETS"):
        load_tasks(manager, ["hub_task"])


def test_hydra_task_lmeval_end_to_end(tmp_path: Path, task_dir: Path) -> None:
    """``task=lmeval`` through the runner: kvbench's results layout, lm-eval's metrics in metrics.json, the kept
    fraction recorded; a second run skips the finished tasks."""
    register_configs()
    overrides = [
        "model=tiny-random-llama",
        "method=snapkv",
        "budget=ratio0.2",
        "task=lmeval",
        "task.lm_eval_tasks=[kv_mc,kv_gen]",
        f"task.options.include_path={task_dir}",
        "task.options.include_defaults=false",
        "task.options.bootstrap_iters=0",
        f"run.output_root={tmp_path}",
        "run.progress=false",
        "run.print_table=false",
    ]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    results = Runner(validate_run(cfg)).run()
    folder = tmp_path / "tiny-random-llama" / "lmeval" / "snapkv" / "ratio0.2"
    assert [r.dataset for r in results] == ["kv_mc", "kv_gen"]
    metrics = json.loads((folder / "kv_mc" / "metrics.json").read_text())
    assert metrics["metric"] == "acc" and metrics["score"] == pytest.approx(100 * metrics["scores"]["acc,none"])
    assert {"acc,none", "acc_norm,none"} <= set(metrics["scores"])
    assert 0 < metrics["cache"]["mean_kept_fraction"] < 0.5 and metrics["cache"]["contexts"] == len(MC_DOCS)
    assert metrics["data_provenance"]["kv_mc"]["source"] == "local"
    assert len((folder / "kv_mc" / "predictions.jsonl").read_text().splitlines()) == len(MC_DOCS)
    gen = json.loads((folder / "kv_gen" / "metrics.json").read_text())
    assert gen["metric"] == "exact_match" and gen["n_samples"] == len(GEN_DOCS)
    meta = json.loads((folder / "run_meta.json").read_text())
    assert meta["status"] == "complete" and meta["datasets"] == ["kv_mc", "kv_gen"]
    assert all(r.skipped for r in Runner(validate_run(cfg)).run())
