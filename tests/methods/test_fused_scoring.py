"""Every scorer on the fused path == the same scorer on the dense reference computation (kvbench issue #17).

The observation's statistics come from :func:`kvbench.kernels.window_stats` /
:func:`kvbench.kernels.causal_column_sums`; with
``impl="dense"`` they come from the materialised attention matrix of :mod:`kvbench.kernels.reference` (what the scorers
computed before the kernels were on their path).  On random tensors, per method preset, model dtype (float32, and
bf16 with ``score_dtype=model``: each probability rounded before it is reduced) and implementation (chunked torch;
Triton, in its interpreter without a GPU), the scores agree within float32 tolerance (bf16: one rounding step) and
select the same tokens (ties allowed).  Cost: about 20 s on 2 CPU cores, most of it the Triton interpreter.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvbench import kernels
from kvbench.budget import parse_budget
from kvbench.cache.kv_cache import KVBenchCache
from kvbench.eviction.base import WindowObservation
from kvbench.inference.eviction import EvictionSession
from kvbench.methods.cake import CakeLayerAllocator
from kvbench.methods.xkv import importance
from tests.kernel_devices import kernel_device
from tests.methods.helpers import LayerIndex, method_from_yaml

REPO = Path(__file__).resolve().parents[2]
PRESETS = [
    "snapkv", "pyramidkv", "ada_snapkv", "cake", "cake_ind_var", "cake_ind_mean_x_var", "cake_h2o", "cake_tova",
    "h2o", "tova", "ahakv", "ahakv_no_ra", "ahakv_no_sgs", "xkv",
]  # fmt: skip
IMPLS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(not kernels.triton_available(), reason="no triton"))]
CONTEXT, DIM = 150, 16


def _layer(seed: int, dtype: torch.dtype, heads: int = 2, groups: int = 2):
    gen = torch.Generator().manual_seed(seed)
    keys = torch.randn(heads, CONTEXT, DIM, generator=gen)
    values = torch.randn(heads, CONTEXT, DIM, generator=gen)
    queries = torch.randn(heads * groups, CONTEXT, DIM, generator=gen) * 1.5
    return keys.to(dtype), values.to(dtype), queries.to(dtype)


def _observation(keys, values, queries, impl: str, window: int) -> WindowObservation:
    """A window observation on the device ``impl`` runs on (CUDA for compiled Triton, when there is one)."""
    device = kernel_device(impl)
    keys, values, queries = keys.to(device), values.to(device), queries.to(device)
    observation = WindowObservation(
        0, 1, queries[:, -window:], keys, values, DIM**-0.5, prompt_queries=queries, layer_budget=64, impl=impl
    )
    return observation


def assert_same_selection(fused: torch.Tensor, dense: torch.Tensor, count: int, tolerance: float) -> None:
    """Per row, the top-``count`` of ``fused`` is a top-``count`` of ``dense`` up to ``tolerance`` (ties allowed)."""
    for got, ref in zip(fused, dense, strict=True):
        chosen = torch.zeros_like(ref, dtype=torch.bool)
        chosen[torch.topk(got, count).indices] = True
        assert float(ref[chosen].min()) >= float(ref[~chosen].max()) - tolerance


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("preset", PRESETS)
def test_scorer_fused_equals_dense(preset: str, dtype: torch.dtype, impl: str) -> None:
    method = method_from_yaml(preset, decode_eviction=False)
    assert method.scorer is not None
    keys, values, queries = _layer(3, dtype)
    fused = method.scorer.score(_observation(keys, values, queries, impl, method.window)).float().cpu()
    dense = method.scorer.score(_observation(keys, values, queries, "dense", method.window)).float()
    scale = float(dense.abs().max())
    # bf16: a probability on a rounding boundary may round the other way -> one rounding step of a score.
    tolerance = scale * (1e-5 if dtype == torch.float32 else 2**-7)
    torch.testing.assert_close(fused, dense, rtol=0, atol=tolerance)
    candidates = CONTEXT - method.window
    for count in (8, 40, 90):
        assert_same_selection(fused[:, :candidates], dense[:, :candidates], count, tolerance)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_allocator_statistics_fused_equal_dense(dtype: torch.dtype, impl: str) -> None:
    """CAKE's layer preference (entropy and variance sums over the candidates) and XKV's importance."""
    keys, values, queries = _layer(4, dtype)
    preferences = []
    for which in (impl, "dense"):
        allocator = CakeLayerAllocator(32, 1.0, 1.0, None, cascading=True)
        state = allocator.new_state(64 * 2, 2, CONTEXT)
        allocator.on_layer(state, _observation(keys, values, queries, which, 32))
        preferences.append(float(state.preferences[0]))
    assert preferences[0] == pytest.approx(preferences[1], rel=1e-4 if dtype == torch.float32 else 1e-2)
    method = method_from_yaml("xkv")
    fused = importance(_observation(keys, values, queries, impl, method.window), method.layer_allocator.options).cpu()
    dense = importance(_observation(keys, values, queries, "dense", method.window), method.layer_allocator.options)
    torch.testing.assert_close(fused, dense, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("preset", PRESETS)
def test_sessions_keep_the_same_tokens_fused_and_dense(preset: str) -> None:
    """A whole prefill eviction (3 layers, float32, budget 64L) keeps the same tokens with either computation."""
    kept = []
    for impl in ("auto", "dense"):
        method = method_from_yaml(preset, decode_eviction=False)
        expand = 2 if method.gqa_granularity == "query_head" else 1
        cache = KVBenchCache(3, expand_factor=expand)
        session = EvictionSession(method, parse_budget("64L"), cache, scoring_impl=impl)
        session.begin_prefill(CONTEXT)
        for layer in range(3):
            keys, values, queries = _layer(10 + layer, torch.float32)
            cache.update(keys[None], values[None], layer)
            session.after_attention(LayerIndex(layer), queries[None], DIM**-0.5)
        session.begin_decode()
        kept.append([[p.tolist() for p in layer.positions] for layer in cache.headwise_layers])
        assert session.record.evicted
    assert kept[0] == kept[1]


def test_no_method_calls_the_dense_window_attention() -> None:
    """The dense helper is the tests' reference only: no module of kvbench/ (methods, session) calls it."""
    offenders = []
    for path in sorted((REPO / "kvbench").rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if "window_attention(" in line and not line.lstrip().startswith("def window_attention("):
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
            if ".window_attention" in line:
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not offenders, offenders


def test_session_rejects_an_unknown_scoring_impl() -> None:
    with pytest.raises(ValueError, match="scoring_impl='fast' is not valid; valid: auto, triton, torch, dense"):
        EvictionSession(method_from_yaml("snapkv"), parse_budget("64L"), KVBenchCache(1), scoring_impl="fast")
