"""The sample cache: RULER/NeedleBench samples generated once per (task settings, tokenizer, length, seed, inputs,
generator code) and reused by every method x budget run; resume checks per-sample prompt hashes.  Cost: about 15 s."""

from __future__ import annotations

import json
from pathlib import Path

from kvbench.storage.sample_cache import SampleCache, source_fingerprint, tokenizer_fingerprint
from kvbench.tasks.needlebench import build_needlebench
from kvbench.tasks.ruler import build_ruler
from tests.task_config import task_config


def _ruler(tokenizer, cache: Path, chat_template: bool = False, **overrides):
    cfg = task_config("ruler", **{"length": 1024, "num_samples": 3, "datasets": ["niah_single_1", "cwe"], **overrides})
    datasets = build_ruler(cfg, tokenizer, chat_template=chat_template)
    for dataset in datasets:
        dataset.sample_cache = SampleCache(cache)
    return datasets


def _as_json(datasets):
    return [[s.to_json() for s in d.samples()] for d in datasets]


def test_ruler_samples_are_generated_once_and_reused(tokenizer, tmp_path, monkeypatch):
    first = _as_json(_ruler(tokenizer, tmp_path))
    files = sorted((tmp_path / "ruler").glob("*.jsonl"))
    assert [f.name.split("-")[0] for f in files] == ["cwe", "niah_single_1"]

    from kvbench.tasks import ruler

    def fail(*args, **kwargs):
        raise AssertionError("regenerated although the samples are stored")

    monkeypatch.setattr(ruler.RulerDataset, "generate_samples", fail)
    assert _as_json(_ruler(tokenizer, tmp_path)) == first  # read back, identical
    assert _as_json(_ruler(tokenizer, tmp_path, num_samples=2)) == [s[:2] for s in first]  # a prefix is served


def test_a_longer_request_regenerates_and_the_prefix_is_stable(tokenizer, tmp_path):
    short = _as_json(_ruler(tokenizer, tmp_path, num_samples=2))
    longer = _as_json(_ruler(tokenizer, tmp_path, num_samples=3))
    assert [s[:2] for s in longer] == short  # samples come from one seeded stream: the first n do not change
    header = json.loads(next(iter(sorted((tmp_path / "ruler").glob("cwe-*.jsonl")))).open().readline())
    assert header["count"] == 3 and header["key"]["seed"] == 42


def test_changed_tokenizer_template_seed_or_code_gets_new_samples(tokenizer, real_tokenizer, tmp_path):
    (base,) = _ruler(tokenizer, tmp_path, datasets=["fwe"])
    keys = {"base": base.cache_key()}
    (other_seed,) = _ruler(tokenizer, tmp_path, datasets=["fwe"], seed=7)
    keys["seed"] = other_seed.cache_key()
    llama = real_tokenizer("llama3", "llama3")
    (plain,) = _ruler(llama, tmp_path, datasets=["fwe"])
    (templated,) = _ruler(llama, tmp_path, datasets=["fwe"], chat_template=True)
    keys["tokenizer"], keys["template"] = plain.cache_key(), templated.cache_key()
    assert len({json.dumps(k, sort_keys=True) for k in keys.values()}) == 4
    assert tokenizer_fingerprint(llama) != tokenizer_fingerprint(real_tokenizer("llama3", "llama3.1"))
    for dataset in (base, other_seed, plain, templated):
        dataset.samples()
    assert len(list((tmp_path / "ruler").glob("fwe-*.jsonl"))) == 4


def test_generator_code_is_part_of_the_key(tmp_path):
    source = tmp_path / "generator.py"
    source.write_text("STEP = 1\n")
    before = source_fingerprint([source])
    source.write_text("STEP = 2\n")
    assert source_fingerprint([source]) != before
    from kvbench.tasks.ruler import datasets, niah

    sources = [Path(p).resolve() for p in datasets.GENERATOR_SOURCES]
    assert Path(niah.__file__).resolve() in sources and Path(datasets.__file__).resolve() in sources


def test_needlebench_samples_are_cached_per_dataset(tokenizer, tmp_path):
    cfg = task_config(
        "needlebench", lengths=[1200], depths=[0, 50], options={"size": "4k", "repeats": 2, "needle_counts": [2]}
    )

    def build():
        datasets = build_needlebench(cfg, tokenizer)
        for dataset in datasets:
            dataset.sample_cache = SampleCache(tmp_path)
        return datasets

    first = _as_json(build())
    files = sorted((tmp_path / "needlebench").glob("*.jsonl"))
    assert len(files) == 6
    for path in files:  # mark every stored sample: a second build that reads the files returns the marks
        header, *lines = path.read_text(encoding="utf-8").splitlines()
        marked = [json.dumps({**json.loads(line), "answers": ["stored"]}) for line in lines]
        path.write_text("\n".join([header, *marked]) + "\n", encoding="utf-8")
    second = _as_json(build())
    assert [[{**s, "answers": ["stored"]} for s in d] for d in first] == second
