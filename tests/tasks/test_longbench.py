"""Tests of the LongBench task: official prompts and limits, the context/question split, loading (jsonl, the hub's
Parquet layout from a local replica, ./data/longbench), errors, truncation helpers, scoring through the TaskDataset,
configs and ``scripts/prepare_data.py``.  All offline, on the fixtures in ``tasks/longbench/fixtures``."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvbench.tasks.base import build_task, data_preparers, task_kinds
from kvbench.tasks.longbench import (
    CHAT_TEMPLATE_SKIP,
    FIXTURES_DIR,
    LongBenchDataset,
    dataset_names,
    dataset_settings,
    format_sample,
    load_jsonl,
    prepare_longbench,
    split_truncated_prompt,
    truncate_middle,
    truncate_prompt,
)
from tests.task_config import task_config

REPO = Path(__file__).resolve().parents[2]

# Official dataset2maxlen.json (spec section 1.4).
OFFICIAL_MAXLEN = {
    "narrativeqa": 128,
    "qasper": 128,
    "multifieldqa_en": 64,
    "multifieldqa_zh": 64,
    "hotpotqa": 32,
    "2wikimqa": 32,
    "musique": 32,
    "dureader": 128,
    "gov_report": 512,
    "qmsum": 512,
    "multi_news": 512,
    "vcsum": 512,
    "trec": 64,
    "triviaqa": 32,
    "samsum": 128,
    "lsht": 64,
    "passage_count": 32,
    "passage_retrieval_en": 32,
    "passage_retrieval_zh": 32,
    "lcc": 64,
    "repobench-p": 64,
}
# A few official dataset2prompt.json entries, spelled out independently of tasks/longbench/datasets.json.
OFFICIAL_PROMPTS = {
    "narrativeqa": "You are given a story, which can be either a novel or a movie script, and a question. Answer the "
    "question asconcisely as you can, using a single phrase if possible. Do not provide any explanation.\n\nStory: "
    "{context}\n\nNow, answer the question based on the story asconcisely as you can, using a single phrase if "
    "possible. Do not provide any explanation.\n\nQuestion: {input}\n\nAnswer:",
    "multi_news": "You are given several news passages. Write a one-page summary of all news. \n\nNews:\n{context}\n\n"
    "Now, write a one-page summary of all the news.\n\nSummary:",
    "trec": "Please determine the type of the question below. Here are some examples of questions.\n\n{context}\n"
    "{input}",
    "passage_count": "There are some paragraphs below sourced from Wikipedia. Some of them may be duplicates. Please "
    "carefully read these paragraphs and determine how many unique paragraphs there are after removing duplicates. "
    "In other words, how many non-repeating paragraphs are there in total?\n\n{context}\n\nPlease enter the final "
    "count of unique paragraphs after removing duplicates. The output format should only contain the number, such "
    "as 1, 2, 3, and so on.\n\nThe final answer is: ",
    "lcc": "Please complete the code given below. \n{context}Next line of code:\n",
    "repobench-p": "Please complete the code given below. \n{context}{input}Next line of code:\n",
    "vcsum": "下面有一段会议记录，请你阅读后，写一段总结，总结会议的内容。\n会议记录：\n{context}\n\n会议总结：",
    "passage_retrieval_zh": "以下是若干段落文字，以及其中一个段落的摘要。请确定给定的摘要出自哪一段。\n\n{context}\n\n"
    '下面是一个摘要\n\n{input}\n\n请输入摘要所属段落的编号。答案格式必须是"段落1"，"段落2"等格式\n\n答案是：',
}
# Question segments (kvpress / Ada-KV split) for a line with input "Q" (answer prefixes included).
EXPECTED_QUESTIONS = {
    "narrativeqa": "Question: Q\n\nAnswer:",
    "qasper": "Question: Q\n\nAnswer:",
    "multifieldqa_en": "Question: Q\nAnswer:",
    "multifieldqa_zh": "问题：Q\n回答：",
    "hotpotqa": "Question: Q\nAnswer:",
    "dureader": "问题：Q\n回答：",
    "gov_report": "Now, write a one-page summary of the report.\n\nSummary:",
    "qmsum": "Query: Q\nAnswer:",
    "multi_news": "Now, write a one-page summary of all the news.\n\nSummary:",
    "vcsum": "会议总结：",
    "trec": "Q",
    "triviaqa": "Q",
    "samsum": "Q",
    "lsht": "Q",
    "passage_count": "Please enter the final count of unique paragraphs after removing duplicates. The output format "
    "should only contain the number, such as 1, 2, 3, and so on.\n\nThe final answer is: ",
    "passage_retrieval_en": "Q\n\nPlease enter the number of the paragraph that the abstract is from. The answer "
    'format must be like "Paragraph 1", "Paragraph 2", etc.\n\nThe answer is: ',
    "lcc": "Next line of code:\n",
    "repobench-p": "QNext line of code:\n",
}
ENGLISH_16 = [
    "narrativeqa",
    "qasper",
    "multifieldqa_en",
    "hotpotqa",
    "2wikimqa",
    "musique",
    "gov_report",
    "qmsum",
    "multi_news",
    "trec",
    "triviaqa",
    "samsum",
    "passage_count",
    "passage_retrieval_en",
    "lcc",
    "repobench-p",
]
CHINESE_5 = ["multifieldqa_zh", "dureader", "vcsum", "lsht", "passage_retrieval_zh"]


def task_cfg(**overrides):
    """A task config with TaskConfig's defaults, reading the fixtures."""
    return task_config("longbench", **{"data_dir": "fixtures", **overrides})


def fixture_line(**overrides):
    """One valid official-schema line."""
    line = {
        "input": "Who?",
        "context": "Some text.",
        "answers": ["Someone"],
        "length": 3,
        "dataset": "hotpotqa",
        "language": "en",
        "all_classes": None,
        "_id": "abc",
    }
    line.update(overrides)
    return line


# ------------------------------------------------------------------------------------------ datasets and prompts


def test_task_kinds_and_dataset_lists():
    assert {"longbench", "longbench_full", "longbench_e"} <= set(task_kinds())
    assert dataset_names("longbench") == ENGLISH_16
    assert len(dataset_names("longbench_full")) == 21
    assert set(dataset_names("longbench_full")) == set(ENGLISH_16) | set(CHINESE_5)
    assert dataset_names("longbench_e") == [
        "qasper",
        "multifieldqa_en",
        "hotpotqa",
        "2wikimqa",
        "gov_report",
        "multi_news",
        "trec",
        "triviaqa",
        "samsum",
        "passage_count",
        "passage_retrieval_en",
        "lcc",
        "repobench-p",
    ]


def test_max_new_tokens_are_official():
    datasets = build_task(task_cfg(kind="longbench_full", name="longbench_full"), None)
    assert {d.name: d.max_new_tokens for d in datasets} == OFFICIAL_MAXLEN


@pytest.mark.parametrize("name", sorted(OFFICIAL_PROMPTS))
def test_prompts_are_official(name):
    assert dataset_settings(name)["prompt"] == OFFICIAL_PROMPTS[name]


@pytest.mark.parametrize("name", sorted(OFFICIAL_MAXLEN))
def test_context_plus_question_is_the_official_formatted_prompt(name):
    # Braces in the data must stay literal (str.format only parses the template).
    line = fixture_line(context="Body {with} braces {0}\n", input="Q {input}")
    context, question = format_sample(name, line)
    assert context + question == dataset_settings(name)["prompt"].format(**line)
    if name in OFFICIAL_PROMPTS:
        assert context + question == OFFICIAL_PROMPTS[name].format(**line)


@pytest.mark.parametrize("name", sorted(EXPECTED_QUESTIONS))
def test_question_segment(name):
    context, question = format_sample(name, fixture_line(context="CTX", input="Q"))
    assert question == EXPECTED_QUESTIONS[name]
    assert "CTX" in context and "CTX" not in question


def test_generation_rules():
    datasets = {d.name: d for d in build_task(task_cfg(kind="longbench_full", name="longbench_full"), None)}
    assert set(CHAT_TEMPLATE_SKIP) == {"trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p"}
    for name, dataset in datasets.items():
        assert dataset.chat_template == (name not in CHAT_TEMPLATE_SKIP)
        assert dataset.stop_strings == ()
        assert dataset.stop_token_texts == (("\n",) if name == "samsum" else ())
        assert dataset.truncation == "middle"
        assert dataset.min_new_tokens == (1 if name == "samsum" else 0)
        assert dataset.postprocess("\n a\nb ") == "\n a\nb "  # pred.py keeps the decoded text unchanged
    assert datasets["lsht"].metric_name == "classification_score"
    assert datasets["lcc"].metric_name == "code_sim_score"
    assert datasets["vcsum"].metric_name == "rouge_zh_score"


# ---------------------------------------------------------------------------------------------------- loading


def test_fixtures_load_for_every_dataset():
    for kind in ("longbench_full", "longbench_e"):
        for dataset in build_task(task_cfg(kind=kind, name=kind), None):
            samples = dataset.samples()
            assert len(samples) == 3
            assert len({s.id for s in samples}) == 3
            for sample in samples:
                assert sample.prompt.startswith(sample.context) and sample.question
                assert sample.answers and sample.length is not None
            assert (samples[0].all_classes is not None) == (dataset.name in ("trec", "lsht"))


def test_subset_and_num_samples():
    datasets = build_task(task_cfg(datasets=["qasper", "hotpotqa"], num_samples=2), None)
    assert [d.name for d in datasets] == ["qasper", "hotpotqa"]
    assert all(len(d.samples()) == 2 for d in datasets)


def test_unknown_dataset_lists_valid_ones():
    with pytest.raises(ValueError, match=r"unknown dataset\(s\) \['hotpot_qa'\].*valid datasets: narrativeqa, qasper"):
        build_task(task_cfg(datasets=["hotpot_qa"]), None)
    # The Chinese datasets belong to longbench_full, not to the 16-dataset task.
    with pytest.raises(ValueError, match="valid datasets"):
        build_task(task_cfg(datasets=["lsht"]), None)
    with pytest.raises(ValueError, match="not in LongBench-E"):
        LongBenchDataset("narrativeqa", longbench_e=True)


def test_options_are_validated():
    with pytest.raises(ValueError, match=r"valid keys: .*code_sim_backend, hub_repo, hub_revision, max_new_tokens"):
        build_task(task_cfg(options={"backend": "difflib"}), None)
    with pytest.raises(ValueError, match=r"code_sim_backend=.fuzzy. is not valid; valid: difflib, levenshtein"):
        build_task(task_cfg(options={"code_sim_backend": "fuzzy"}), None)
    with pytest.raises(ValueError, match=r"task.options.bos='double' is not valid; valid: single, reference_double"):
        build_task(task_cfg(options={"bos": "double"}), None)
    with pytest.raises(ValueError, match=r"question_mode=.blind. is not valid; valid: aware, agnostic"):
        build_task(task_cfg(question_mode="blind"), None)


def test_malformed_line_names_file_and_line(tmp_path):
    good = json.dumps(fixture_line())
    cases = {
        "bad_json": (good + "\n{not json\n", 2, "invalid JSON"),
        "no_answers": (good + "\n\n" + json.dumps(fixture_line(answers=[])) + "\n", 3, "answers"),
        "bad_length": (json.dumps(fixture_line(length="12")) + "\n", 1, "length"),
        "not_object": (good + "\n" + good + "\n[1, 2]\n", 3, "JSON object"),
        "bad_classes": (json.dumps(fixture_line(all_classes="City")) + "\n", 1, "all_classes"),
    }
    for stem, (text, lineno, what) in cases.items():
        path = tmp_path / f"{stem}.jsonl"
        path.write_text(text, encoding="utf-8")
        with pytest.raises(ValueError, match=rf"{stem}\.jsonl:{lineno}: .*{what}"):
            load_jsonl(path)


def test_malformed_line_fails_through_the_task(tmp_path):
    (tmp_path / "qasper.jsonl").write_text(json.dumps(fixture_line()) + '\n{"input": 1}\n', encoding="utf-8")
    (dataset,) = build_task(task_cfg(datasets=["qasper"], data_dir=str(tmp_path)), None)
    with pytest.raises(ValueError, match=r"qasper\.jsonl:2: field 'input'"):
        dataset.samples()


def test_missing_file_points_to_prepare_data(tmp_path):
    (dataset,) = build_task(task_cfg(datasets=["qasper"], data_dir=str(tmp_path)), None)
    with pytest.raises(FileNotFoundError, match=r"prepare_data\.py longbench"):
        dataset.samples()


def test_data_subfolder_and_duplicate_ids(tmp_path):
    (tmp_path / "data").mkdir()
    lines = [fixture_line(_id="same"), fixture_line(_id="same"), fixture_line(_id="other")]
    (tmp_path / "data" / "hotpotqa.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    (dataset,) = build_task(task_cfg(datasets=["hotpotqa"], data_dir=str(tmp_path)), None)
    assert [s.id for s in dataset.samples()] == ["same", "same#2", "other"]


def write_parquet_replica(root: Path, configs: list[str], shard_size: int = 2) -> Path:
    """A local replica of the hub's Parquet branch (``<config>/test/0000.parquet``, ``0001.parquet``, ...) made from
    the fixtures: the layout ``load_dataset(..., revision="refs/convert/parquet")`` trips over."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for config in configs:
        rows = load_jsonl(FIXTURES_DIR / f"{config}.jsonl")
        folder = root / config / "test"
        folder.mkdir(parents=True)
        for shard, start in enumerate(range(0, len(rows), shard_size)):
            pq.write_table(pa.Table.from_pylist(rows[start : start + shard_size]), folder / f"{shard:04d}.parquet")
    return root


@pytest.fixture
def parquet_hub(tmp_path):
    return write_parquet_replica(tmp_path / "hub", ["trec", "trec_e", "vcsum", "qasper", "lcc"])


def test_hub_parquet_layout_is_read_in_shard_order(parquet_hub, monkeypatch):
    monkeypatch.chdir(parquet_hub)  # no data/longbench here
    options = {"hub_repo": str(parquet_hub)}
    cfg = task_cfg(kind="longbench_e", name="longbench_e", datasets=["trec"], data_dir=None, options=options)
    (dataset,) = build_task(cfg, None)
    (expected_dataset,) = build_task(task_cfg(kind="longbench_e", name="longbench_e", datasets=["trec"]), None)
    expected = expected_dataset.samples()  # the same rows read from the shipped jsonl fixtures
    assert [s.to_json() for s in dataset.samples()] == [s.to_json() for s in expected]
    record = dataset.provenance()["data"]
    assert record["source"] == "hub" and record["revision"] == "refs/convert/parquet"
    assert sorted(record["files"]) == ["trec_e/test/0000.parquet", "trec_e/test/0001.parquet"]
    assert all(len(sha) == 64 for sha in record["files"].values())


def test_hub_without_pyarrow_names_the_extra(parquet_hub, monkeypatch):
    monkeypatch.chdir(parquet_hub)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import fails as if not installed
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    (dataset,) = build_task(task_cfg(datasets=["qasper"], data_dir=None, options={"hub_repo": str(parquet_hub)}), None)
    with pytest.raises(ImportError, match=r"pyarrow: pip install -e '\.\[data\]'"):
        dataset.samples()


def test_hub_failure_offline_says_how_to_prepare(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no data/longbench here
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (dataset,) = build_task(task_cfg(datasets=["qasper"], data_dir=None), None)
    with pytest.raises(RuntimeError, match=r"qasper.*THUDM/LongBench@refs/convert/parquet.*prepare_data\.py longbench"):
        dataset.samples()


def test_default_data_dir_is_where_prepare_data_writes(monkeypatch, tmp_path):
    folder = tmp_path / "data" / "longbench"
    folder.mkdir(parents=True)
    (folder / "qasper.jsonl").write_bytes((FIXTURES_DIR / "qasper.jsonl").read_bytes())
    monkeypatch.chdir(tmp_path)
    (dataset,) = build_task(task_cfg(datasets=["qasper"], data_dir=None), None)
    assert len(dataset.samples()) == 3
    record = dataset.provenance()["data"]
    assert record["source"] == "official" and record["path"] == str(Path("data/longbench/qasper.jsonl"))
    fixtures = build_task(task_cfg(datasets=["qasper"], data_dir="fixtures"), None)[0].provenance()["data"]
    assert fixtures["source"] == "stand-in" and "prepare_data.py longbench" in fixtures["how_to_get"]


def test_prepare_longbench_round_trip(parquet_hub, tmp_path):
    assert "longbench" in data_preparers()
    tmp_path = tmp_path / "out"
    prepare_longbench(tmp_path, datasets=["trec", "vcsum"], hub_repo=str(parquet_hub))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["MANIFEST.json", "trec.jsonl", "trec_e.jsonl", "vcsum.jsonl"]
    manifest = json.loads((tmp_path / "MANIFEST.json").read_text())
    assert {name: entry["lines"] for name, entry in manifest["files"].items()} == {
        "trec.jsonl": 3,
        "trec_e.jsonl": 3,
        "vcsum.jsonl": 3,
    }
    assert all(len(entry["sha256"]) == 64 for entry in manifest["files"].values())  # checked on every read
    assert load_jsonl(tmp_path / "vcsum.jsonl") == load_jsonl(FIXTURES_DIR / "vcsum.jsonl")
    cfg = task_cfg(kind="longbench_full", name="longbench_full", datasets=["vcsum"], data_dir=str(tmp_path))
    samples = build_task(cfg, None)[0].samples()
    assert samples[0].question == "会议总结："


def test_prepare_data_script(tmp_path, capsys):
    names = dataset_names("longbench_full")
    hub = write_parquet_replica(tmp_path / "hub", names)
    spec = importlib.util.spec_from_file_location("prepare_data", REPO / "scripts" / "prepare_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--list"]) == 0
    assert "longbench" in capsys.readouterr().out.split()
    with pytest.raises(SystemExit):
        module.main(["nonexistent_benchmark", "--out", str(tmp_path)])
    assert "valid:" in capsys.readouterr().err
    args = ["longbench", "--out", str(tmp_path), "--set", "include_e=false", "--set", f"hub_repo={hub}"]
    assert module.main(args) == 0
    files = sorted(p.name for p in (tmp_path / "longbench").iterdir())
    assert len(files) == 22 and "MANIFEST.json" in files and not any(f.endswith("_e.jsonl") for f in files)


# ----------------------------------------------------------------------------------------------- truncation


def test_truncate_middle():
    ids = list(range(10))
    assert truncate_middle(ids, 10) == ids
    assert truncate_middle(ids, 20) == ids
    assert truncate_middle(ids, 6) == [0, 1, 2, 7, 8, 9]
    assert truncate_middle(ids, 7) == [0, 1, 2, 7, 8, 9]  # odd budget: int(7 / 2) = 3 per side
    with pytest.raises(ValueError):
        truncate_middle(ids, 1)


class WordTokenizer:
    """Whitespace tokenizer with a BOS id, enough for the official string-level rule."""

    def __init__(self):
        self.vocab: dict[str, int] = {"<s>": 0}
        self.words: dict[int, str] = {0: "<s>"}

    def __call__(self, text, truncation=False, add_special_tokens=True):
        ids = [0] if add_special_tokens else []
        for word in text.split():
            if word not in self.vocab:
                self.vocab[word] = len(self.vocab)
                self.words[self.vocab[word]] = word
            ids.append(self.vocab[word])
        return SimpleNamespace(input_ids=ids)

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(self.words[i] for i in ids if not (skip_special_tokens and i == 0))


def test_truncate_prompt_counts_bos_and_joins_halves():
    tok = WordTokenizer()
    prompt = "a b c d e f g h"
    assert truncate_prompt(prompt, tok, 9) == prompt  # 8 words + BOS fit
    # 9 ids > 8: keep ids[:4] = BOS a b c and ids[-4:] = e f g h; BOS dropped on decode, halves joined as strings.
    assert truncate_prompt(prompt, tok, 8) == "a b ce f g h"


def test_split_truncated_prompt():
    assert split_truncated_prompt("CTX...Question: Q\nAnswer:", "Question: Q\nAnswer:") == (
        "CTX...",
        "Question: Q\nAnswer:",
    )
    assert split_truncated_prompt("CTX...Answer:", "Question: Q\nAnswer:") == ("CTX...Answer:", "")
    assert split_truncated_prompt("CTX", "") == ("CTX", "")


# ------------------------------------------------------------------------------------------------- scoring


def test_gold_answers_score_100_on_every_dataset():
    for kind in ("longbench_full", "longbench_e"):
        for dataset in build_task(task_cfg(kind=kind, name=kind), None):
            samples = dataset.samples()
            result = dataset.score([s.answers[0] for s in samples], samples)
            assert result["score"] == 100.0, dataset.name
            if kind == "longbench_e":
                assert {k: result[k] for k in ("0-4k", "4-8k", "8k+")} == {"0-4k": 100.0, "4-8k": 100.0, "8k+": 100.0}


def test_score_follows_official_scorer():
    (trec,) = build_task(task_cfg(datasets=["trec"]), None)
    samples = trec.samples()
    # First line only; the second sample names two classes that are not substrings of each other -> 1/2.
    predictions = ["\nExpression abbreviated\nCity", "City or Country", "Date"]
    assert trec.score(predictions, samples) == {"score": round(100 * (1 + 0.5 + 0) / 3, 2)}
    with pytest.raises(ValueError, match="predictions for"):
        trec.score(predictions[:2], samples)


def test_longbench_e_buckets(tmp_path):
    (dataset,) = build_task(task_cfg(kind="longbench_e", name="longbench_e", datasets=["passage_count"]), None)
    samples = dataset.samples()
    assert [s.length for s in samples] == [1200, 5000, 9000]
    result = dataset.score([samples[0].answers[0], "0", "no idea"], samples)
    assert result == {"score": 33.33, "0-4k": 100.0, "4-8k": 0.0, "8k+": 0.0}


def test_code_sim_backend_option_is_used_and_recorded():
    pytest.importorskip("rapidfuzz")
    scores = {}
    for backend in ("difflib", "levenshtein"):
        (dataset,) = build_task(task_cfg(datasets=["lcc"], options={"code_sim_backend": backend}), None)
        samples = dataset.samples()[:1]
        assert dataset.describe()["code_sim_backend"] == backend
        # 'ccbcaa' vs 'bcbbbcc': fuzz.ratio 31 (difflib) vs 46 (python-Levenshtein).
        samples = [type(samples[0])(id="x", context="", question="", answers=["bcbbbcc"])]
        scores[backend] = dataset.score(["ccbcaa"], samples)["score"]
    assert scores == {"difflib": 31.0, "levenshtein": 46.0}


def test_describe_records_settings():
    (dataset,) = build_task(task_cfg(datasets=["samsum"], question_mode="agnostic"), None)
    info = dataset.describe()
    assert info["question_mode"] == "agnostic"
    assert info["max_new_tokens"] == 128 and info["chat_template"] is False and info["stop_token_texts"] == ["\n"]
    assert info["min_new_tokens"] == 1 and info["first_line_scoring"] is True and info["truncation"] == "middle"
    assert info["code_sim_backend"] == "difflib" and info["metric"] == "rouge_score"
    assert dataset.provenance()["data"]["path"].endswith("fixtures/samsum.jsonl")
    json.dumps(info)


# -------------------------------------------------------------------------------------------------- configs


@pytest.mark.parametrize(("stem", "count"), [("longbench", 16), ("longbench_full", 21), ("longbench_e", 13)])
def test_task_yaml_composes(stem, count):
    from omegaconf import OmegaConf

    from kvbench.config import TaskConfig

    raw = OmegaConf.load(REPO / "conf" / "task" / f"{stem}.yaml")
    raw.pop("defaults")
    cfg = OmegaConf.merge(OmegaConf.structured(TaskConfig), raw)
    cfg.data_dir = "fixtures"
    datasets = build_task(cfg, None)
    assert len(datasets) == count and cfg.name == stem
    assert datasets[0].code_sim_backend == "difflib" and datasets[0].hub_revision == "refs/convert/parquet"
    cfg.datasets = ["qasper", "lcc"]
    assert [d.name for d in build_task(cfg, None)] == ["qasper", "lcc"]
