"""The bottom-right causal mask in both forms (boolean, and the additive form the CPU attention passes to SDPA): its
definition, and the additive form giving SDPA bit-identical outputs to the boolean one."""

from __future__ import annotations

import pytest
import torch

from kvbench.attention import ops
from kvbench.attention.ops import bottom_right_causal_mask, dense_attention

SHAPES = [(1, 1), (1, 9), (3, 3), (2, 7), (5, 40), (64, 300)]
CPU = torch.device("cpu")


def _definition(query_length: int, key_length: int) -> torch.Tensor:
    """``[q, S]`` True where ``j <= S - q + i``, element by element."""
    offset = key_length - query_length
    rows = [[j <= offset + i for j in range(key_length)] for i in range(query_length)]
    return torch.tensor(rows, dtype=torch.bool)


@pytest.mark.parametrize(("query_length", "key_length"), SHAPES)
def test_boolean_mask_is_the_bottom_right_causal_pattern(query_length, key_length):
    mask = bottom_right_causal_mask(query_length, key_length, CPU)
    assert mask.dtype == torch.bool and torch.equal(mask, _definition(query_length, key_length))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("query_length", "key_length"), SHAPES)
def test_additive_mask_is_what_sdpa_makes_of_the_boolean_one(query_length, key_length, dtype):
    allowed = _definition(query_length, key_length)
    additive = bottom_right_causal_mask(query_length, key_length, CPU, dtype)
    # SDPA's conversion of a boolean mask: -inf where masked out, 0 elsewhere (bit for bit, signs of zero included)
    expected = torch.where(allowed, torch.tensor(0.0, dtype=dtype), torch.tensor(float("-inf"), dtype=dtype))
    assert additive.dtype == dtype
    assert torch.equal(additive.view(torch.uint8), expected.view(torch.uint8))


def test_additive_masks_are_right_whatever_was_cached_before():
    """A chunked prefill's shapes (growing keys, a shorter last chunk), then a longer prompt and a fresh small one: each
    additive mask (a view of the cached largest one) is the definition."""
    shapes = [(8, 8), (8, 16), (8, 24), (3, 27), (1, 30), (8, 40), (5, 12), (20, 20), (2, 45)]
    for query_length, key_length in shapes:
        additive = bottom_right_causal_mask(query_length, key_length, CPU, torch.float32)
        assert additive.shape == (query_length, key_length)
        assert torch.equal(additive == 0, _definition(query_length, key_length)), (query_length, key_length)
        assert torch.isneginf(additive[additive != 0]).all()


def test_mask_refuses_more_queries_than_keys():
    with pytest.raises(ValueError, match="cache holds 2 tokens, fewer than the 3 new queries"):
        bottom_right_causal_mask(3, 2, CPU)


class _Module(torch.nn.Module):
    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("query_length", "key_length"), [(2, 7), (64, 300), (256, 1000)])
def test_dense_attention_bit_identical_to_sdpa_with_the_boolean_mask(query_length, key_length, dtype):
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(1, 4, query_length, 16, generator=generator).to(dtype)  # [1, H_q, q, D]
    keys = torch.randn(1, 2, key_length, 16, generator=generator).to(dtype)  # [1, H_kv, S, D]
    values = torch.randn(1, 2, key_length, 16, generator=generator).to(dtype)
    output = dense_attention(_Module(2), query, keys, values, 0.25, 0.0)  # [1, q, H_q, D]
    expected = torch.nn.functional.scaled_dot_product_attention(
        query,
        keys.repeat_interleave(2, dim=1),
        values.repeat_interleave(2, dim=1),
        attn_mask=_definition(query_length, key_length)[None, None],
        scale=0.25,
    ).transpose(1, 2)
    assert torch.equal(output, expected)


def test_a_chunked_prefill_rebuilds_the_cached_mask_a_logarithmic_number_of_times(monkeypatch):
    """Chunks of the same rows against keys growing chunk by chunk (a chunked prefill): the cached mask grows
    geometrically, so 64 chunks rebuild it at most 7 times, and every mask is still the boolean one's."""
    ops._ADDITIVE_MASKS.clear()
    builds = []
    real_full = torch.full

    def counting_full(*args, **kwargs):
        builds.append(args[0])
        return real_full(*args, **kwargs)

    monkeypatch.setattr(ops.torch, "full", counting_full)
    for chunk in range(1, 65):
        mask = ops.bottom_right_causal_mask(8, 8 * chunk, torch.device("cpu"), torch.float32)
        expected = torch.zeros(8, 8 * chunk).masked_fill(
            ~ops.bottom_right_causal_mask(8, 8 * chunk, torch.device("cpu")), float("-inf")
        )
        assert torch.equal(mask, expected), chunk
    assert 1 <= len(builds) <= 7, builds
