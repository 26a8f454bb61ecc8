"""Needle grid: context sizes and needle depth with a real (in-code) tokenizer, determinism, both scores, heatmap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvbench.metrics.synthetic import needle_rouge_score, needle_set_recall, porter_stem, rouge1_f
from kvbench.tasks.base import build_task, data_preparers
from kvbench.tasks.needle_grid import NEEDLE, build_needle_grid, default_depths, needle_grid_rows, plot_needle_heatmap
from kvbench.tasks.text_inputs import TextTokenizer
from tests.task_config import task_config

REPO = Path(__file__).resolve().parents[2]
NEEDLE_SENTENCE = NEEDLE.strip()


def _cfg(**overrides):
    return task_config("needle_grid", **{"lengths": [600, 1500, 4096], "depths": [0, 25, 50, 75, 100], **overrides})


def test_samples_fit_length_and_needle_sits_at_depth(tokenizer):
    (ds,) = build_needle_grid(_cfg(), tokenizer)
    samples = ds.samples()
    assert len(samples) == 15 and ds.max_new_tokens == 30 and ds.chat_template is False
    assert ds.stop_strings == ("\n",)
    for sample in samples:
        length, depth = sample.extra["context_length"], sample.extra["depth"]
        haystack = sample.context[len("<|im_start|> This is a very long story book: <book> ") : -len(" </book>.\n")]
        n_haystack = len(tokenizer.tokenize(haystack))
        # the haystack (needle included) fills context_length minus the 200-token buffer
        assert length - 200 - 5 <= n_haystack <= length - 200 + 5, (length, n_haystack)
        assert len(tokenizer.tokenize(sample.prompt)) <= length
        assert sample.extra["prompt_tokens"] == len(tokenizer.tokenize(sample.prompt))
        # exactly one needle, at the requested depth (snapped back to the end of the previous sentence)
        assert haystack.count(NEEDLE_SENTENCE) == 1
        pos = haystack.index(NEEDLE)
        needle_tokens = len(tokenizer.tokenize(NEEDLE))
        before = len(tokenizer.tokenize(haystack[:pos]))
        target = depth / 100 * (n_haystack - needle_tokens)
        assert target - 120 <= before <= target + 2, (length, depth, before, target)
        if depth == 100:
            assert haystack.endswith(NEEDLE)
        elif before > 0:
            assert haystack[:pos].rstrip().endswith(".")  # inserted after a period token
        assert (
            sample.question
            == " Based on the content of the book, Question: The best thing to do in San Francisco is: \nAnswer:"
        )


def test_grid_defaults_and_yaml(tokenizer):
    from omegaconf import OmegaConf

    from kvbench.config import TaskConfig

    assert default_depths() == [0, 11, 22, 33, 44, 56, 67, 78, 89, 100]
    raw = OmegaConf.load(REPO / "conf" / "task" / "needle_grid.yaml")
    raw.pop("defaults")
    cfg = OmegaConf.merge(OmegaConf.structured(TaskConfig), raw)
    (ds,) = build_task(cfg, tokenizer)
    assert ds.lengths == list(range(1000, 8001, 100)) and len(ds.lengths) == 71
    assert ds.depths == default_depths()
    cfg.lengths, cfg.depths, cfg.num_samples = [800], [50], None
    (small,) = build_task(cfg, tokenizer)
    assert [s.id for s in small.samples()] == ["L800_D50"]
    assert "needle_grid" in data_preparers()


def test_deterministic_and_num_samples(tokenizer):
    first = [s.prompt for s in build_needle_grid(_cfg(), tokenizer)[0].samples()]
    second = [s.prompt for s in build_needle_grid(_cfg(), tokenizer)[0].samples()]
    assert first == second
    capped = build_needle_grid(_cfg(num_samples=4), tokenizer)[0].samples()
    assert [s.prompt for s in capped] == first[:4]


def test_validation(tokenizer):
    with pytest.raises(ValueError, match="valid keys"):
        build_needle_grid(_cfg(options={"depth": 3}), tokenizer)
    with pytest.raises(ValueError, match="depths"):
        build_needle_grid(_cfg(depths=[120]), tokenizer)
    with pytest.raises(ValueError, match="buffer"):
        build_needle_grid(_cfg(lengths=[150]), tokenizer)


def test_essays_from_data_dir(tokenizer, tmp_path):
    folder = tmp_path / "PaulGrahamEssays"
    folder.mkdir()
    (folder / "b.txt").write_text("Zebras graze. " * 400)
    (folder / "a.txt").write_text("Apples fall. " * 400)
    (ds,) = build_needle_grid(_cfg(data_dir=str(tmp_path), lengths=[700], depths=[50]), tokenizer)
    (sample,) = ds.samples()
    assert "Apples fall." in sample.context and "Zebras" not in sample.context  # sorted glob: a.txt first
    record = ds.provenance()["essays"]
    assert record["source"] == "official" and record["path"] == str(folder) and record["files"] == 2


def test_url_list_is_not_an_essay_and_json_comes_first(tmp_path):
    """RULER's data folder holds PaulGrahamEssays_URLs.txt next to PaulGrahamEssays.json: the JSON is the haystack."""
    from kvbench.tasks.text_inputs import load_essays

    (tmp_path / "PaulGrahamEssays_URLs.txt").write_text("http://www.paulgraham.com/a.html\n")
    essays, record = load_essays(tmp_path, "PaulGrahamEssays.json", "prepare it")
    assert record["source"] == "stand-in" and record["missing"] == "PaulGrahamEssays.json"  # the URL list is skipped
    (tmp_path / "PaulGrahamEssays.json").write_text(json.dumps({"text": "Real essay text."}))
    essays, record = load_essays(tmp_path, "PaulGrahamEssays.json", "prepare it")
    assert essays == ["Real essay text."] and record["path"] == str(tmp_path / "PaulGrahamEssays.json")


def test_fallback_tokenizer_without_model():
    tok = TextTokenizer(None)
    ids = tok.encode("Hello, world. 你好")
    assert tok.decode(ids) == "Hello, world. 你好" and len(ids) == 6
    (ds,) = build_needle_grid(_cfg(lengths=[600], depths=[50]), None)
    assert NEEDLE_SENTENCE in ds.samples()[0].context


# ------------------------------------------------------------------------------------------------ scores


def test_scores_golden():
    # ROUGE-1 F x 10 (Google rouge-score, stemmed) values from the spec (verified there with rouge-score)
    assert needle_rouge_score(
        NEEDLE_SENTENCE, "eat a sandwich and sit in Dolores Park on a sunny day."
    ) == pytest.approx(7.2727, abs=1e-4)
    assert needle_rouge_score(NEEDLE_SENTENCE, NEEDLE_SENTENCE) == pytest.approx(10.0)
    assert needle_rouge_score(NEEDLE_SENTENCE, "go to the Golden Gate Bridge.") == pytest.approx(1.4815, abs=1e-4)
    assert rouge1_f("running dogs", "the dog runs") == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))
    assert [porter_stem(w) for w in ("caresses", "ponies", "generalization", "sunny", "hopping")] == [
        "caress",
        "poni",
        "gener",
        "sunni",
        "hop",
    ]
    # heatmap set recall: 11 distinct expected words ("day." keeps its period); legacy divides by 12
    full = "Eat a sandwich and sit in Dolores Park on a sunny day."
    assert needle_set_recall(full) == 1.0
    assert needle_set_recall(full, legacy=True) == pytest.approx(11 / 12)
    assert needle_set_recall("eat a sandwich") == pytest.approx(3 / 11)
    assert needle_set_recall("Sit on a sunny day") == pytest.approx(4 / 11)  # "day" without period misses


def test_dataset_score_and_rows(tokenizer):
    (ds,) = build_needle_grid(_cfg(lengths=[600, 900], depths=[0, 100]), tokenizer)
    samples = ds.samples()
    preds = [
        ds.postprocess("  eat a sandwich and sit in Dolores Park on a sunny day. "),
        "eat a sandwich",
        "",
        "eat a sandwich and sit in dolores park on a sunny day.",
    ]
    rows = needle_grid_rows(preds, samples)
    assert [(r["length"], r["depth"]) for r in rows] == [(600, 0), (600, 100), (900, 0), (900, 100)]
    assert [r["score"] for r in rows] == pytest.approx([1.0, 3 / 11, 0.0, 1.0])
    scores = ds.score(preds, samples)
    assert scores["score"] == pytest.approx(100 * (2 + 3 / 11) / 4)
    assert scores["length_600"] == pytest.approx(100 * (1 + 3 / 11) / 2) and scores["length_900"] == 50.0
    assert scores["rouge1_x10"] == pytest.approx(sum(r["rouge1_x10"] for r in rows) / 4)


def test_heatmap_png(tmp_path):
    import matplotlib.image as mpimg

    rows = [
        {"length": length, "depth": depth, "score": (length + depth) % 3 / 2}
        for length in (1000, 2000, 3000)
        for depth in (0, 50, 100)
        if (length, depth) != (3000, 100)  # a missing cell stays blank
    ]
    out = plot_needle_heatmap(rows, tmp_path / "plots" / "needle.png", title="test")
    assert out.is_file() and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = mpimg.imread(out)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    with pytest.raises(ValueError):
        plot_needle_heatmap([], tmp_path / "empty.png")
