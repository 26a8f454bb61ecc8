"""The paged cache's GPU attention path is chosen up front from what the machine can do, never by swallowing an error
(kvbench/kernels/paths.py, issue #26 items 1-2): torch 2.11's ``varlen_attn`` (no block table) is detected from its
signature, a planned path's error propagates, and every fallback is counted and written to metrics.json and
run_meta.json.  About 3 s on 2 shared cores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import kvbench
from kvbench.attention.paged import paged_attention
from kvbench.cache import paged
from kvbench.cache.kv_cache import BACKEND_ENV
from kvbench.kernels.paths import (
    ATTENTION_RECORD,
    AttentionPlan,
    VarlenCapability,
    capability_summary,
    plan_attention,
    varlen_capability,
)
from kvbench.resources import models_dir

CUDA = torch.device("cuda")
HOPPER = (9, 0)


def varlen_attn_torch_2_11(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                           window_size=(-1, -1)):  # fmt: skip
    """A stand-in with the signature of torch 2.11's ``torch.nn.attention.varlen.varlen_attn``."""
    raise AssertionError("the capability check must not call the function")


def varlen_attn_torch_2_13(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                           window_size=(-1, -1), enable_gqa=False, seqused_k=None, block_table=None,
                           num_splits=None):  # fmt: skip
    """A stand-in with the signature of torch 2.13's ``varlen_attn`` (paged KV)."""
    raise AssertionError("the capability check must not call the function")


def test_varlen_capability_is_read_from_the_signature() -> None:
    old = varlen_capability(varlen_attn_torch_2_11)
    assert not old.paged
    assert all(name in old.reason for name in ("block_table", "seqused_k", "enable_gqa"))
    assert varlen_capability(varlen_attn_torch_2_13) == VarlenCapability(True)
    # This machine's torch (2.13) has the paged signature; the summary says so for run_meta.json.
    assert varlen_capability().paged == capability_summary()["varlen_paged_kv"]


def test_plan_chooses_the_gpu_path_up_front_and_names_every_fallback() -> None:
    new, old = varlen_capability(varlen_attn_torch_2_13), varlen_capability(varlen_attn_torch_2_11)

    def plan(**kwargs) -> AttentionPlan:
        settings = {"device": CUDA, "dtype": torch.bfloat16, "page_size": 256, "head_dim": 128, "capability": new,
                    "triton": True, "compute_capability": HOPPER, **kwargs}  # fmt: skip
        return plan_attention(**settings)

    assert plan() == AttentionPlan("varlen_paged", "varlen_paged")
    assert plan(page_size=16) == AttentionPlan("triton_decode", "torch_gather")  # Triton's page size: by design
    cpu = plan_attention(torch.device("cpu"), torch.bfloat16, 256, 128)
    assert cpu == AttentionPlan("torch_gather", "torch_gather")  # the CPU path is no fallback

    torch_2_11 = plan(capability=old)  # the GPU machine's torch: the Triton decode kernel, and it is recorded
    assert (torch_2_11.decode, torch_2_11.chunk) == ("triton_decode", "torch_gather")
    assert "block_table" in torch_2_11.fallback
    assert "float16/bfloat16" in plan(dtype=torch.float32).fallback
    assert "head dim" in plan(head_dim=512).fallback
    assert "compute capability" in plan(compute_capability=(7, 5)).fallback
    assert torch_2_11.fallback_of("decode") == torch_2_11.fallback_of("chunk") == torch_2_11.fallback
    no_triton = plan(page_size=16, triton=False)
    assert no_triton.decode == "torch_gather" and "triton is not installed" in no_triton.fallback
    assert no_triton.fallback_of("chunk") is None  # page 16 gathers for chunks by design, Triton or not


def test_an_error_on_the_planned_path_propagates() -> None:
    """A layer planned for varlen_attn whose call fails (here: FlashAttention has no CPU kernel) raises; before
    issue #26 every exception was caught and the gather path ran with one log line."""
    layer = paged.PagedLayer(page_size=256, impl="torch")
    keys = torch.randn(1, 2, 300, 8, dtype=torch.bfloat16)
    layer.update(keys, keys)
    layer.attention_plan = AttentionPlan("varlen_paged", "varlen_paged")
    step_keys, step_values = layer.update(keys[:, :, :1], keys[:, :, :1])
    query = torch.randn(1, 4, 1, 8, dtype=torch.bfloat16)
    # torch 2.13: NotImplementedError (a RuntimeError), FlashAttention has no CPU kernel; torch 2.11: TypeError, its
    # varlen_attn takes no block_table.  Either way the error reaches the caller.
    with pytest.raises((RuntimeError, TypeError)):
        paged_attention(torch.nn.Module(), query, step_keys, step_values, None, 0.0)


def test_calls_and_fallbacks_are_recorded_in_metrics_and_run_meta(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One tiny_niah sample on the paged backend, with the layers' plan replaced by one that fell back: the run's
    files name the paths that ran and the fallback's reason."""
    reason = "varlen_paged unavailable: stand-in reason"

    def fallen_back_plan(*args, **kwargs) -> AttentionPlan:
        return AttentionPlan("torch_gather", "torch_gather", reason, ("decode", "chunk"))

    monkeypatch.setenv(BACKEND_ENV, "paged")
    monkeypatch.setattr(paged, "plan_attention", fallen_back_plan)
    path = models_dir() / "tiny-niah"
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    evaluation = kvbench.evaluate(
        model, tokenizer, method="snapkv", budget="64L", limit=1, output_dir=tmp_path, progress=False,
        overrides=["task.lengths=[512]", "task.datasets=[niah_single_512]"],
    )  # fmt: skip
    folder = evaluation.folder
    assert folder is not None
    metrics = json.loads(next(folder.glob("*/metrics.json")).read_text())
    calls, fallbacks = metrics["attention"]["calls"], metrics["attention"]["fallbacks"]
    assert calls["dense_prefill"] > 0 and calls["torch_gather"] > 0
    assert fallbacks == {reason: calls["torch_gather"]}
    meta = json.loads((folder / "run_meta.json").read_text())
    assert meta["attention_fallbacks"] == {reason: calls["torch_gather"]}
    assert meta["attention_capability"] == capability_summary()
    ATTENTION_RECORD.reset()
