"""Which attention implementation the paged cache runs, chosen up front from what the machine can do, and a record of
what ran (issue #26).

Paths of a decode step (one query token) or a later chunk (a question chunk on a filled cache) of
:func:`kvbench.attention.paged.paged_attention`:

* ``varlen_paged`` -- ``torch.nn.attention.varlen.varlen_attn`` over the block table (FlashAttention-2's paged KV):
  needs a CUDA tensor, ``page_size`` a multiple of 256, fp16/bf16, a head dim <= 256 divisible by 8, and a torch whose
  ``varlen_attn`` accepts ``block_table``, ``seqused_k`` and ``enable_gqa`` (torch 2.13 does; torch 2.11's takes only
  ``(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux, scale, window_size)``).  The capability is
  read from the function's signature (:func:`varlen_capability`), never from a version string.
* ``triton_decode`` -- kvbench's split-K Triton decode kernel (one query token, CUDA, triton installed).
* ``torch_gather`` -- gather each head and run the torch reference attention (CPU, and chunks of several queries
  when the varlen path is not planned).

:func:`plan_attention` picks the path once per layer (when its storage is allocated).  When the preferred GPU path is
unavailable for one of the reasons above -- the only "feature unavailable" cases -- the plan names the next path and
the reason, and every call on that plan is counted as a fallback.  Nothing is chosen by catching an exception: an
error raised by a kernel (a Triton compile error, out of resources, a FlashAttention error) propagates.

:data:`ATTENTION_RECORD` counts, process-wide, the calls per path and the fallbacks per reason; the runner writes it
into ``metrics.json`` (per dataset) and ``run_meta.json`` (per run, with :func:`capability_summary`).
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

#: Pages of FlashAttention-2's paged-KV kernels (torch varlen_attn, flash_attn_with_kvcache): multiples of 256 tokens.
FLASH_PAGE_MULTIPLE = 256
#: Keyword parameters ``varlen_attn`` must accept for the paged path.
PAGED_VARLEN_PARAMETERS = ("block_table", "seqused_k", "enable_gqa")
#: Dtypes FlashAttention-2 runs.
FLASH_DTYPES = (torch.float16, torch.bfloat16)
#: Largest head dim of FlashAttention-2.
FLASH_MAX_HEAD_DIM = 256
PATHS = ("dense_prefill", "varlen_paged", "triton_decode", "torch_gather")


@dataclass(frozen=True)
class VarlenCapability:
    """Whether ``varlen_attn`` can read a paged cache; ``reason`` says why not (empty when it can)."""

    paged: bool
    reason: str = ""


def varlen_capability(function: Callable[..., Any] | None = None) -> VarlenCapability:
    """Read the paged-KV capability from ``function``'s signature (default: torch's ``varlen_attn``).

    Tests pass a stand-in with torch 2.11's signature to check the detection.
    """
    if function is None:
        try:
            from torch.nn.attention.varlen import varlen_attn as function
        except ImportError as err:
            return VarlenCapability(False, f"torch.nn.attention.varlen.varlen_attn is missing ({err})")
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError) as err:
        return VarlenCapability(False, f"varlen_attn's signature cannot be read ({err})")
    missing = [name for name in PAGED_VARLEN_PARAMETERS if name not in parameters]
    if missing:
        return VarlenCapability(False, f"this torch's varlen_attn has no {', '.join(missing)} (no paged KV)")
    return VarlenCapability(True)


def triton_available() -> bool:
    """Whether ``import triton`` works (the kernels' own check)."""
    from kvbench.kernels.ops import triton_available as available

    return available()


@dataclass(frozen=True)
class AttentionPlan:
    """The paths a paged layer runs after its first chunk.

    Attributes
    ----------
    decode:
        Path of a one-token query (one of :data:`PATHS`).
    chunk:
        Path of a query of several tokens.
    fallback:
        Why the preferred GPU path is unavailable (``None``: nothing fell back).  Counted at every call of a kind
        in ``fallback_kinds``.
    fallback_kinds:
        Which queries the fallback changed the path of: ``("decode",)`` or ``("decode", "chunk")``.
    """

    decode: str
    chunk: str
    fallback: str | None = None
    fallback_kinds: tuple[str, ...] = ()

    def fallback_of(self, kind: str) -> str | None:
        """The fallback reason for a ``kind`` (``decode`` / ``chunk``) query, if its path is a fallback."""
        return self.fallback if kind in self.fallback_kinds else None


def plan_attention(
    device: torch.device,
    dtype: torch.dtype,
    page_size: int,
    head_dim: int,
    capability: VarlenCapability | None = None,
    triton: bool | None = None,
    compute_capability: tuple[int, int] | None = None,
) -> AttentionPlan:
    """Choose the paths of a paged layer on ``device`` holding ``dtype`` states with ``head_dim``, ``page_size``.

    ``capability`` / ``triton`` / ``compute_capability`` default to this machine's (:func:`varlen_capability`,
    :func:`triton_available`, ``torch.cuda.get_device_capability``); tests pass them to plan for other machines.
    """
    if device.type != "cuda":
        return AttentionPlan("torch_gather", "torch_gather")
    triton = triton_available() if triton is None else triton
    decode = "triton_decode" if triton else "torch_gather"
    no_triton = None if triton else "triton is not installed (no Triton decode kernel)"
    if page_size % FLASH_PAGE_MULTIPLE:
        return AttentionPlan(decode, "torch_gather", no_triton, ("decode",) if no_triton else ())
    capability = varlen_capability() if capability is None else capability
    reasons = [] if capability.paged else [capability.reason]
    if dtype not in FLASH_DTYPES:
        reasons.append(f"FlashAttention needs float16/bfloat16, the cache holds {dtype}")
    if head_dim > FLASH_MAX_HEAD_DIM or head_dim % 8:
        reasons.append(f"FlashAttention needs a head dim <= {FLASH_MAX_HEAD_DIM} divisible by 8, got {head_dim}")
    if compute_capability is None and torch.cuda.is_available():
        compute_capability = torch.cuda.get_device_capability(device)
    if compute_capability is not None and compute_capability[0] < 8:
        reasons.append(f"FlashAttention-2 needs compute capability >= 8.0, this GPU has {compute_capability[0]}.x")
    if not reasons:
        return AttentionPlan("varlen_paged", "varlen_paged")
    fallback = f"varlen_paged unavailable: {'; '.join(reasons)}"
    return AttentionPlan(
        decode, "torch_gather", fallback if triton else f"{fallback}; {no_triton}", ("decode", "chunk")
    )


class AttentionRecord:
    """Process-wide counts of the paged attention calls per path and of the fallbacks per reason."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.fallbacks: Counter[str] = Counter()

    def note(self, path: str, fallback: str | None) -> None:
        """Count one call of ``path`` (and of ``fallback``'s reason when the plan fell back)."""
        self.calls[path] += 1
        if fallback is not None:
            self.fallbacks[fallback] += 1

    def reset(self) -> None:
        self.calls.clear()
        self.fallbacks.clear()

    def summary(self) -> dict[str, Any]:
        """``{"calls": {path: n}, "fallbacks": {reason: n}}`` (JSON-ready, sorted)."""
        return {"calls": dict(sorted(self.calls.items())), "fallbacks": dict(sorted(self.fallbacks.items()))}


ATTENTION_RECORD = AttentionRecord()


def capability_summary() -> dict[str, Any]:
    """What this machine offers the paged cache (recorded in ``run_meta.json``): CUDA, triton, varlen paged KV."""
    capability = varlen_capability()
    return {
        "cuda": torch.cuda.is_available(),
        "triton": triton_available(),
        "varlen_paged_kv": capability.paged,
        "varlen_reason": capability.reason,
    }
