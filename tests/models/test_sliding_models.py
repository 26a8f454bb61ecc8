"""Sliding-window, hybrid and sink models (issue #34): Gemma-2, Gemma-3, gpt-oss, sliding-window Mistral and hybrid
Qwen2 on tiny random configurations (all-full models: the rest of the suite and ``tests/models/test_zoo.py``).

* with nothing evicted, kvbench gives ``model.generate``'s tokens (eager attention: soft-capping, sinks, the
  window), in one prefill forward and in chunks;
* the sliding layer equals transformers' own ``DynamicSlidingWindowLayer`` forward by forward;
* every method family runs question-aware and question-agnostic with the exact budgets it requested on the
  compressible (full-attention) layers, while the sliding layers hold at most their window; decode-time policies keep
  their caps.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3TextConfig,
    GptOssConfig,
    MistralConfig,
    PreTrainedModel,
    Qwen2Config,
)
from transformers.cache_utils import DynamicSlidingWindowLayer

import kvbench
from kvbench.budget import parse_budget
from kvbench.cache.kv_cache import KVBenchCache
from kvbench.cache.sliding import SlidingWindowLayer, UnsupportedLayers, layer_windows, sliding_causal_mask
from kvbench.eviction.base import build_method, method_families
from kvbench.eviction.threshold import is_threshold_method
from tests.methods.heads_replay import fitted_to_model

WINDOW = 16
PROMPT = [(37 * i + 11) % 120 + 3 for i in range(80)]
CONTEXT = 76  # question-agnostic split: the last 4 tokens are the question (CAKE evicts contexts over C + S_w = 72)
BUDGET = 40  # tokens per compressible layer (above every method's observation window, below the prompt)
COMMON = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
CONFIGS = {
    "gemma2": lambda: Gemma2Config(**COMMON, num_hidden_layers=4, sliding_window=WINDOW),
    "gemma3": lambda: Gemma3TextConfig(**COMMON, num_hidden_layers=6, sliding_window=WINDOW),
    "gpt_oss": lambda: GptOssConfig(
        **COMMON, num_hidden_layers=4, sliding_window=WINDOW, num_local_experts=4, num_experts_per_tok=2
    ),
    "mistral_sliding": lambda: MistralConfig(**COMMON, num_hidden_layers=2, sliding_window=WINDOW),
    "qwen2_hybrid": lambda: Qwen2Config(
        **COMMON, num_hidden_layers=4, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2
    ),
}
#: Expected sliding layers, as transformers lays them out.
SLIDING = {
    "gemma2": [0, 2],
    "gemma3": [0, 1, 2, 3, 4],
    "gpt_oss": [0, 2],
    "mistral_sliding": [0, 1],
    "qwen2_hybrid": [2, 3],
}


@pytest.fixture(scope="module")
def method_configs() -> dict[str, Any]:
    """Every method family's preset config, composed once (building a method from it is cheap)."""
    return {family: kvbench.compose_config(method=family).method for family in method_families()}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def model(request: pytest.FixtureRequest) -> tuple[str, PreTrainedModel]:
    torch.manual_seed(0)
    built = AutoModelForCausalLM.from_config(CONFIGS[request.param](), attn_implementation="eager")
    return request.param, built.eval()


def generate(model: PreTrainedModel, max_new_tokens: int = 5) -> list[int]:
    ids = torch.tensor([PROMPT])
    return model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)[
        0, len(PROMPT) :
    ].tolist()


def test_layer_layout_follows_transformers(model: tuple[str, PreTrainedModel]) -> None:
    name, built = model
    windows = layer_windows(built.config)
    assert [idx for idx, window in enumerate(windows) if window is not None] == SLIDING[name]
    assert all(window == WINDOW for window in windows if window is not None)


@pytest.mark.parametrize("prefill_chunk", [0, 24])
def test_full_cache_equals_plain_generate(model: tuple[str, PreTrainedModel], prefill_chunk: int) -> None:
    """Nothing evicted: kvbench's tokens are transformers' (eager attention and its own sliding cache)."""
    name, built = model
    reference = generate(built)
    with kvbench.press(built, "full", "full", prefill_chunk=prefill_chunk) as record:
        pressed = generate(built)
    assert pressed == reference
    last = record.last
    assert last.sliding_layers == SLIDING[name]
    for layer_idx in last.sliding_layers:  # a sliding layer holds the last window - 1 tokens, like transformers'
        assert set(last.achieved_per_head[layer_idx]) == {WINDOW - 1}


def test_sliding_layer_equals_transformers_sliding_layer() -> None:
    """Forward by forward (a prefill chunk, then single tokens): the same keys returned and stored."""
    torch.manual_seed(0)
    ours, theirs = SlidingWindowLayer(WINDOW), DynamicSlidingWindowLayer(WINDOW)
    for length in (24, 5, 1, 1, 12, 1):
        keys, values = torch.randn(1, 2, length, 8), torch.randn(1, 2, length, 8)
        our_k, our_v = ours.update(keys, values)
        their_k, their_v = theirs.update(keys, values)
        assert torch.equal(our_k, their_k) and torch.equal(our_v, their_v)
        assert torch.equal(ours.keys, theirs.keys)
        assert ours.get_seq_length() == theirs.get_seq_length()
        assert ours.positions[0].tolist() == list(range(ours.seen_tokens - ours.keys.shape[2], ours.seen_tokens))
    with pytest.raises(NotImplementedError, match="not evicted"):
        ours.keep([torch.arange(2)] * 2)


def test_sliding_mask_sees_the_window_and_nothing_in_the_future() -> None:
    mask = sliding_causal_mask(3, 6, 2, torch.device("cpu"))
    # queries are positions 3, 4, 5 of keys 0..5: each sees itself and one position back
    assert mask.int().tolist() == [[0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 1, 1]]


@pytest.mark.parametrize("question_mode", ["aware", "agnostic"])
def test_every_method_family_keeps_exact_budgets(
    model: tuple[str, PreTrainedModel], method_configs: dict[str, Any], question_mode: str, tmp_path
) -> None:
    """Eviction acts on the full-attention layers with the budget it requested there; sliding layers keep their
    window; decode-time policies keep their caps (decoding 5 tokens).  Families reading a per-model head file get one
    of the model's shape (:func:`tests.methods.heads_replay.fitted_to_model`)."""
    name, built = model
    extra = {"context_length": CONTEXT} if question_mode == "agnostic" else {}
    for family in method_families():
        method_cfg = fitted_to_model(method_configs[family], built.config, tmp_path)
        if family == "dms":  # its 128-token window would hold the whole 80-token prompt
            method_cfg = OmegaConf.merge(method_cfg, {"params": {"sliding_window_size": WINDOW}})
        method = build_method(method_cfg)
        if getattr(method.scorer, "replays_context", False) or getattr(method.scorer, "rerotates_keys", False):
            continue  # KVzip, Finch: they refuse sliding-window layers and kvbench.press (tests/methods/test_*.py)
        budget = parse_budget("1e9thr" if is_threshold_method(method) else f"{BUDGET}L")  # DMS: all but its window
        with kvbench.press(built, method, budget, question_mode, **extra) as record:
            generate(built)
        last = record.last
        assert last.sliding_layers == SLIDING[name], family
        assert last.compressible_layers == [i for i in range(len(last.achieved_per_head)) if i not in SLIDING[name]]
        assert last.requested_per_head == last.achieved_per_head, (family, last.requested_per_head)
        for layer_idx in last.sliding_layers:
            assert max(last.achieved_per_head[layer_idx]) <= WINDOW - 1, family
        compressed = [last.requested_per_layer[i] for i in last.compressible_layers]
        # NACL's reference evicts prompts over 2048 tokens only; SimLayerKV only the layers it finds lazy (none here).
        if family not in ("full", "nacl", "simlayerkv") and compressed:
            assert last.evicted, family
            if family in ("snapkv", "h2o", "tova", "streamingllm", "ada_snapkv", "ahakv"):
                assert compressed == [BUDGET] * len(compressed), family  # uniform allocators: BUDGET per layer
        if family in ("h2o", "tova", "streamingllm"):  # decode-time policies: the cache never exceeds its cap
            for layer_idx in last.compressible_layers:
                assert last.final_per_layer[layer_idx] <= last.decode_cap_per_layer[layer_idx], family


def test_a_model_with_recurrent_layers_is_refused_by_name() -> None:
    from transformers import Qwen3NextConfig

    config = Qwen3NextConfig(**{**COMMON, "num_hidden_layers": 4})
    with pytest.raises(UnsupportedLayers, match="linear_attention"):
        layer_windows(config)
    with pytest.raises(ValueError, match="1 sliding windows for 2 layers"):
        KVBenchCache(2, sliding_windows=[None])


@pytest.mark.parametrize("name", ["gemma2", "gpt_oss"])
def test_compress_sliding_switch_evicts_sliding_layers_too(name: str, method_configs: dict[str, Any]) -> None:
    """``EvictionMethod.compress_sliding``: sliding layers are kept evictable and join the compressible layers; the
    window is applied on the kept tokens' true positions, so with nothing evicted the tokens are still transformers'."""
    torch.manual_seed(0)
    built = AutoModelForCausalLM.from_config(CONFIGS[name](), attn_implementation="eager").eval()
    reference = generate(built)
    full = dataclasses.replace(build_method(method_configs["full"]), compress_sliding=True)
    with kvbench.press(built, full, parse_budget("full")):
        assert generate(built) == reference
    snapkv = dataclasses.replace(build_method(method_configs["snapkv"]), compress_sliding=True)
    with kvbench.press(built, snapkv, parse_budget(f"{BUDGET}L"), "agnostic", context_length=CONTEXT) as record:
        generate(built)
    last = record.last
    assert last.sliding_layers == SLIDING[name]
    assert last.compressible_layers == list(range(len(last.achieved_per_head)))
    assert last.requested_per_head == last.achieved_per_head
    assert last.requested_per_layer == [BUDGET] * len(last.requested_per_layer)


def test_window_only_in_the_mask_is_applied_without_a_session(method_configs: dict[str, Any]) -> None:
    """PhiMoE puts its window in the mask only (no ``sliding_window`` argument): kvbench's attention reads it from the
    cache, also in session-less forwards (lm-eval continuation scoring)."""
    from kvbench.inference.generate import build_cache, forward_logits
    from kvbench.inference.press import kvbench_attention
    from kvbench.models.zoo import tiny_model

    built = tiny_model("phimoe")
    assert built.config.sliding_window is not None and len(PROMPT) > built.config.sliding_window
    reference = built(torch.tensor([PROMPT])).logits[0, -1]
    with kvbench_attention(built):
        cache = build_cache(built, build_method(method_configs["full"]))
        logits = forward_logits(built, PROMPT, 0, cache, None, torch.device("cpu"))[-1]
    torch.testing.assert_close(logits, reference)
