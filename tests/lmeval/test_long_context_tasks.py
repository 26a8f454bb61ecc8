"""lm-eval 0.4.13's own long-context tasks through kvbench's bridge under eviction (issue #45, item 5).

Each task is lm-eval's installed YAML (``include:``), its prompt, generation settings and metric code unchanged; only
the data is swapped for two tiny stand-in documents in the task's own schema (the real data is on the hub):
``longbench2`` (multiple choice: the context compressed once, the four letters scored on copies), ``infinitebench``
(generate_until, greedy) and ``babilong`` (generate_until with its two inline few-shot examples).  ``ruler`` is
generate_until too, but builds its samples with ``wonderwords``, ``nltk`` and a tokenizer named in ``--metadata``
(not in the test environment): listed in docs/benchmarks/lmeval.md, not run here.  About 10 s on 2 CPU cores.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

lm_eval = pytest.importorskip("lm_eval")

from kvbench.lmeval.model import KVBenchLM  # noqa: E402
from kvbench.lmeval.tasks import task_manager  # noqa: E402

LM_TASKS = Path(lm_eval.__file__).parent / "tasks"
FILLER = "The grass is green. The sky is blue. The sun is yellow. " * 12
#: task -> (installed YAML it includes, the overrides that point it at local data, stand-in documents).
TASKS = {
    "kvb_longbench2": (
        "longbench2/academic_single.yaml",
        "dataset_path: json\ndataset_name: null\ndataset_kwargs:\n  data_files:\n    train: {data}\n",
        [
            {"_id": str(i), "domain": "d", "sub_domain": "s", "difficulty": "easy", "length": "short",
             "question": "Which colour is the sky?", "choices": ["green", "blue", "red", "black"], "answer": "B",
             "context": FILLER * (i + 1)}
            for i in range(2)
        ],
    ),
    "kvb_infinitebench_passkey": (
        "infinitebench/infinitebench_passkey.yaml",
        "dataset_path: json\ndataset_name: null\ndataset_kwargs:\n  data_files:\n    passkey: {data}\n",
        [
            {"id": i, "context": FILLER + f"The pass key is {key}. Remember it. " + FILLER,
             "input": "What is the pass key? The pass key is", "answer": [str(key)], "options": []}
            for i, key in enumerate((12345, 67890))
        ],
    ),
    "kvb_babilong_qa1": ("babilong/babilong_qa1.yaml", "custom_dataset: !function stand_in.babilong\n", None),
}  # fmt: skip
BABILONG_STAND_IN = """import datasets


def babilong(**kwargs):
    doc = {"input": "Mary went to the kitchen. " * 12 + "John moved to the garden.", "question": "Where is John?",
           "target": "The most recent location of John is garden."}
    return {kwargs.get("qa_split", "qa1"): datasets.Dataset.from_list([doc, doc])}
"""


@pytest.fixture(scope="module")
def manager(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("long_context_tasks")
    (root / "stand_in.py").write_text(BABILONG_STAND_IN)
    for task, (included, overrides, docs) in TASKS.items():
        data = root / f"{task}.jsonl"
        if docs is not None:
            data.write_text("".join(json.dumps(doc) + "\n" for doc in docs))
        text = f"include: {LM_TASKS / included}\ntask: {task}\ntag: []\n" + overrides.format(data=data)
        (root / f"{task}.yaml").write_text(text)
    return task_manager(str(root), include_defaults=False)


def test_long_context_tasks_run_under_eviction(manager) -> None:
    """Every listed task runs with SnapKV at a budget below the prompt: each request is prefilled with eviction
    (records ``evicted``), the task's own metric is computed, and longbench2's shared context is compressed once."""
    lm = KVBenchLM(pretrained="builtin:tiny-random-llama", method="snapkv", budget="64L")
    output = lm_eval.simple_evaluate(model=lm, tasks=list(TASKS), task_manager=manager, bootstrap_iters=0)
    results = output["results"]
    assert 0.0 <= results["kvb_longbench2"]["acc,none"] <= 1.0
    assert 0.0 <= results["kvb_infinitebench_passkey"]["score,none"] <= 1.0
    assert 0.0 <= results["kvb_babilong_qa1"]["acc,none"] <= 1.0
    kinds = [record["kind"] for record in lm.records]
    assert kinds.count("generate_until") == 4 and kinds.count("loglikelihood") == 2
    assert all(record["cache"]["evicted"] for record in lm.records)
    choices = [record["continuations"] for record in lm.records if record["kind"] == "loglikelihood"]
    assert choices == [4, 4]  # one compressed prefill per document, its four letters scored on copies
