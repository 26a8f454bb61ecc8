"""Chunked prefill (``run.prefill_chunk``) gives every method what a one-shot prefill gives it (kvbench issue #17).

On the trained tiny model (a ``tiny_niah`` prompt) and on a tiny random GQA model, for every method preset that
evicts at prefill: the prompt fed in chunks (smaller than the observation window, unaligned, larger) keeps the same
tokens in every layer and head, records the same sizes, and generates the same tokens as the prompt fed in one
forward (float32; in bf16 the model's own forward is not chunk-invariant, see the bf16 test).  Cost: about 20 s
on 2 CPU cores.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM

from kvbench.budget import parse_budget
from kvbench.eviction.base import PromptRows, TokenScorer, WindowObservation
from kvbench.inference.generate import CPU_PREFILL_CHUNK, generate, resolve_prefill_chunk
from kvbench.inference.prefill import prefill
from kvbench.models.loading import build_builtin
from kvbench.models.tiny import DEFAULT_MODEL_DIR, build_tokenizer
from kvbench.tasks.tiny_niah import build_instance
from tests.methods.helpers import method_from_yaml

PRESETS = [
    "snapkv", "pyramidkv", "ada_snapkv", "ada_pyramidkv", "cake", "cake_h2o", "h2o", "tova", "ahakv", "ahakv_no_ra",
    "xkv", "streamingllm", "full", "nacl_short",
]  # fmt: skip
CHUNKS = [13, 100, 257]


@pytest.fixture(scope="module")
def trained_tiny():
    """The trained tiny retrieval model and a ``niah_single`` prompt (context + question) of about 600 tokens."""
    if not (DEFAULT_MODEL_DIR / "model.safetensors").exists():
        pytest.skip("models/tiny-niah is not trained")
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_DIR, attn_implementation="kvbench").eval()
    tokenizer = build_tokenizer()
    instance = build_instance("niah_single", 60, 40.0, "chunked-prefill")
    ids = tokenizer(" ".join(instance.context) + "\n" + " ".join(instance.question), add_special_tokens=False)
    return model, tokenizer, ids["input_ids"]


@pytest.fixture(scope="module")
def random_tiny():
    """A tiny random Llama with GQA (4 query heads, 2 KV heads) and 300 random token ids."""
    model, tokenizer = build_builtin("tiny-random-llama", seed=7)
    model.set_attn_implementation("kvbench")
    ids = torch.randint(3, 250, (300,), generator=torch.Generator().manual_seed(11)).tolist()
    return model.eval(), tokenizer, ids


@pytest.fixture(scope="module")
def random_tiny_bf16(random_tiny):
    """The same model and ids in bf16."""
    model, tokenizer = build_builtin("tiny-random-llama", seed=7)
    model.set_attn_implementation("kvbench")
    return model.eval().to(torch.bfloat16), tokenizer, random_tiny[2]


def _kept_after_prefill(model, method, budget: str, ids: list[int], chunk: int):
    """Prefill ``ids`` in chunks of ``chunk`` tokens (0 = one forward); kept positions per layer and head."""
    with torch.no_grad():
        state = prefill(model, ids, method=method, budget=parse_budget(budget), prefill_chunk=chunk)
    record, cache = state.session.finish(), state.cache
    return [[p.tolist() for p in layer.positions] for layer in cache.headwise_layers], record


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("model_name", ["trained_tiny", "random_tiny"])
def test_chunked_prefill_keeps_and_generates_what_one_shot_does(request, model_name: str, preset: str) -> None:
    model, tokenizer, ids = request.getfixturevalue(model_name)
    budget = "48L"
    one_shot, record = _kept_after_prefill(model, method_from_yaml(preset), budget, ids, 0)
    if preset != "full":
        assert record.evicted
    for chunk in CHUNKS:
        chunked, chunked_record = _kept_after_prefill(model, method_from_yaml(preset), budget, ids, chunk)
        assert chunked == one_shot, f"chunk {chunk}"
        assert chunked_record.requested_per_head == record.requested_per_head
        assert chunked_record.achieved_per_head == record.achieved_per_head
    outputs = [
        generate(
            model, tokenizer, ids, [], method=method_from_yaml(preset), budget=parse_budget(budget),
            question_mode="aware", max_new_tokens=6, stop_token_ids=set(), prefill_chunk=chunk,
        )
        for chunk in (0, 100)
    ]  # fmt: skip
    assert outputs[0].token_ids == outputs[1].token_ids
    assert outputs[0].record.prefill_chunk == 0 and outputs[1].record.prefill_chunk == 100


@pytest.mark.parametrize("preset", ["snapkv", "ada_snapkv", "h2o", "tova", "ahakv", "ahakv_no_ra"])
def test_chunked_prefill_in_bf16_keeps_the_same_tokens_at_layer_0(random_tiny_bf16, preset: str) -> None:
    """bf16 with ``score_dtype=model`` (each probability rounded to bf16 in the kernels): layer 0, whose keys and
    queries do not depend on the chunking, keeps the same tokens.  Deeper layers' inputs differ in the last bf16
    bit, because the model's own attention sums its chunks in another order -- float32 keeps them equal (above)."""
    model, _, ids = random_tiny_bf16
    one_shot, _ = _kept_after_prefill(model, method_from_yaml(preset), "48L", ids, 0)
    for chunk in CHUNKS:
        chunked, _ = _kept_after_prefill(model, method_from_yaml(preset), "48L", ids, chunk)
        assert chunked[0] == one_shot[0], f"chunk {chunk}"


class _CapturingScorer(TokenScorer):
    """A scorer that records each observation's all-rows column sums, then scores as ``scorer`` does."""

    def __init__(self, scorer: TokenScorer, captured: list[torch.Tensor]) -> None:
        self.scorer = scorer
        self.captured = captured

    def prompt_rows(self, model_dtype: torch.dtype) -> PromptRows:
        return self.scorer.prompt_rows(model_dtype)

    def score(self, observation: WindowObservation) -> torch.Tensor:
        self.captured.append(observation.prompt_column_sums.clone())
        return self.scorer.score(observation)


def test_h2o_column_sums_accumulated_over_chunks_equal_the_one_shot_sums(random_tiny) -> None:
    """The session's all-rows column sums after a chunked prefill == those of one forward (H2O's scores)."""
    model, _, ids = random_tiny
    sums = []
    for chunk in (0, 37):
        captured: list[torch.Tensor] = []
        method = method_from_yaml("h2o")
        method = dataclasses.replace(method, scorer=_CapturingScorer(method.scorer, captured))
        _kept_after_prefill(model, method, "48L", ids, chunk)
        sums.append(captured)
    assert len(sums[0]) == len(sums[1]) == model.config.num_hidden_layers
    for one_shot, chunked in zip(*sums, strict=True):
        torch.testing.assert_close(chunked, one_shot, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(one_shot.sum(dim=1), torch.full((one_shot.shape[0],), float(len(ids))))


def test_prefill_chunk_resolution() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_prefill_chunk(None, cpu, CPU_PREFILL_CHUNK + 1) == CPU_PREFILL_CHUNK  # long CPU prompts: on
    assert resolve_prefill_chunk(None, cpu, CPU_PREFILL_CHUNK) == 0
    assert resolve_prefill_chunk(None, cpu, 131072) == 1024  # chunk x context bounded on CPU
    assert resolve_prefill_chunk(None, cpu, 10**7) == 256
    assert resolve_prefill_chunk(None, cuda, 10**6) == 0  # GPU: one forward unless asked
    assert resolve_prefill_chunk(512, cuda, 2000) == 512
    assert resolve_prefill_chunk(512, cpu, 300) == 0  # shorter than one chunk: one forward
    assert resolve_prefill_chunk(0, cpu, 10**6) == 0
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match=r"run\.prefill_chunk="):
            resolve_prefill_chunk(bad, cpu, 100)


def test_prefill_rows_keep_only_the_queries_a_scorer_asks_for() -> None:
    """``PromptRows.query_rows`` (NACL's proxy rows): across chunks the session holds the last ``R`` queries only,
    equal to the tail of the whole prompt's queries."""
    from kvbench.eviction.base import PromptRows
    from kvbench.inference.eviction import PrefillRows

    queries = torch.randn(4, 50, 8)
    needs = PromptRows(queries=True, query_rows=lambda length: length // 10)
    rows = PrefillRows()
    for first in range(0, 50, 13):
        rows.add(None, queries[:, first : first + 13], 1.0, 4, needs, "torch", 50)  # type: ignore[arg-type]
        assert rows.prompt_queries().shape[1] == min(5, first + 13)  # trimmed after every chunk
    assert torch.equal(rows.prompt_queries(), queries[:, -5:])
    assert torch.equal(rows.window_queries, queries[:, -4:])
