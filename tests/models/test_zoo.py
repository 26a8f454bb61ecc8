"""Every causal-LM architecture of the installed transformers, at a tiny size (issue #34), and the support table.

:func:`kvbench.models.zoo.probe` builds each architecture of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` tiny (size checked on
the meta device first; multimodal wrappers listed, not built) and checks that kvbench with nothing evicted gives
``model.generate``'s tokens and really runs through kvbench's attention (the eviction session saw every layer), then
that SnapKV keeps exactly its budget on the full-attention layers.  The
result is the support table: ``docs/support_table.md`` must equal it (``KVBENCH_WRITE_SUPPORT_TABLE=1`` rewrites
the file) and docs/models.md embeds that file between its ``support-table`` markers.  The method-family sweep runs
on the sliding / sink / hybrid models and Llama in ``tests/models/test_sliding_models.py``.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from transformers import PreTrainedModel

import kvbench
from kvbench.budget import parse_budget
from kvbench.eviction.base import build_method
from kvbench.models import zoo

REPO = Path(__file__).resolve().parents[2]
TABLE = REPO / "docs" / "support_table.md"
README_START, README_END = "<!-- support-table:start -->", "<!-- support-table:end -->"
PROMPT = [(7 * i + 3) % 200 + 5 for i in range(40)]  # longer than zoo.TINY_WINDOW: sliding layers slide
SNAPKV_BUDGET = "36L"  # above SnapKV's 32-token observation window, below the prompt: 4 tokens evicted per layer
#: Architectures the issue names, which must stay supported.
MUST_SUPPORT = ("gemma2", "gemma3_text", "gpt_oss", "mistral", "qwen2", "qwen3", "llama", "olmo2", "mixtral")


@functools.cache
def preset(name: str) -> Any:
    """A method preset's config, composed once (composing costs more than a tiny model's generate)."""
    return kvbench.compose_config(method=name).method


def full_cache_matches_generate(model: PreTrainedModel) -> None:
    """Raise unless kvbench with nothing evicted gives ``model.generate``'s tokens through its own attention, and
    SnapKV keeps exactly its budget on the compressible layers."""
    ids = torch.tensor([PROMPT])
    reference = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)[0, len(PROMPT) :].tolist()
    with kvbench.press(model, build_method(preset("full")), parse_budget("full")) as record:
        pressed = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)[0, len(PROMPT) :].tolist()
    if record.last.peak_prefill_bytes == 0:
        raise AssertionError("the model does not call kvbench's registered attention function (AttentionInterface)")
    if pressed != reference:
        raise AssertionError(f"tokens differ from model.generate: {pressed} vs {reference}")
    with kvbench.press(model, build_method(preset("snapkv")), parse_budget(SNAPKV_BUDGET)) as record:
        model.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=0)
    last = record.last
    if last.compressible_layers and not (last.evicted and last.requested_per_head == last.achieved_per_head):
        raise AssertionError(
            f"SnapKV {SNAPKV_BUDGET}: requested {last.requested_per_head}, kept {last.achieved_per_head}"
        )


@pytest.fixture(scope="module")
def probes() -> list[zoo.Probe]:
    return [zoo.probe(model_type, full_cache_matches_generate) for model_type in zoo.causal_lm_architectures()]


def test_support_table_is_generated_from_every_architecture(probes: list[zoo.Probe]) -> None:
    assert [p.model_type for p in probes] == sorted(zoo.causal_lm_architectures())
    by_type = {p.model_type: p for p in probes}
    for model_type in MUST_SUPPORT:
        assert by_type[model_type].status == "supported", by_type[model_type]
    assert "sliding" in by_type["gemma2"].layers and "sliding" in by_type["gpt_oss"].layers
    assert all(p.reason for p in probes if p.status != "supported")  # every ✗ says why
    table = zoo.support_table(probes, transformers.__version__)
    if os.environ.get("KVBENCH_WRITE_SUPPORT_TABLE") == "1":
        TABLE.write_text(table, encoding="utf-8")
    assert TABLE.read_text(encoding="utf-8") == table, (
        "docs/support_table.md is stale: rerun with KVBENCH_WRITE_SUPPORT_TABLE=1 (and copy it into docs/models.md)"
    )


def test_readme_embeds_the_support_table() -> None:
    """The documentation's model-support page (docs/models.md) embeds the generated table."""
    page = (REPO / "docs" / "models.md").read_text(encoding="utf-8")
    block = page[page.index(README_START) + len(README_START) : page.index(README_END)]
    assert block.strip() == TABLE.read_text(encoding="utf-8").strip()


def test_tiny_builds_are_size_checked_before_allocating(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zoo, "MAX_TINY_PARAMETERS", 1000)
    with pytest.raises(ValueError, match="parameters at the tiniest sizes tried"):
        zoo.tiny_model("llama")
    probe = zoo.probe("fuyu", full_cache_matches_generate)  # multimodal: listed without building
    assert probe.status == "multimodal" and "vision" in probe.reason


def test_support_table_flags_models_that_evict_nothing_in_the_check() -> None:
    """An architecture whose tiny configuration slides on every layer runs, but eviction does nothing there: its row
    says so ("✓ no eviction", "**no**"), and the summary line counts those rows; hybrid and full-attention rows say
    on how many layers eviction acts."""
    probes = [
        zoo.Probe("mistral", "MistralForCausalLM", "supported", "", "4 sliding(8)", 0, 4),
        zoo.Probe("gemma2", "Gemma2ForCausalLM", "supported", "", "2 full + 2 sliding(8)", 2, 4),
        zoo.Probe("llama", "LlamaForCausalLM", "supported", "", "4 full", 4, 4),
        zoo.Probe("bloom", "BloomForCausalLM", "unsupported", "no kvbench attention"),
    ]
    table = zoo.support_table(probes, "5.x")
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()}
    assert "| ✓ no eviction | **no**: every layer slides" in rows["mistral"]
    assert "| ✓ | yes: 2 of 4 layers (2 sliding keep their window) |" in rows["gemma2"]
    assert "| ✓ | yes: all 4 layers |" in rows["llama"]
    assert "| ✗ | - | unsupported: no kvbench attention |" in rows["bloom"]
    summary = table.splitlines()[0]
    assert "4 causal-LM architectures, 3 supported" in summary and "1 had every layer sliding" in summary
