"""The numerics of quantized KV storage: each scheme's quantize -> dequantize round trip, written from its reference.

A cache layer with ``kv_quant`` on (:mod:`kvbench.cache.quantized`) keeps the *dequantized* states of its quantized
tokens (what attention and eviction scorers read in both references) and counts their bytes as the packed codes plus
the scales and zero points (:func:`quantized_bytes`); the functions here give those dequantized states, bit for bit
what the reference's quantize-then-dequantize gives on the same device and dtype.

* **KIVI** (jy-yuan/KIVI ``quant/new_pack.py``, the pure-PyTorch ``quant_and_pack_kcache`` /
  ``quant_and_pack_vcache`` and ``unpack_and_dequant_kcache`` / ``unpack_and_dequant_vcache``): asymmetric min-max
  codes ``clamp((x - mn) / scale, 0, 2^b - 1).round()`` with ``scale = (mx - mn) / (2^b - 1)``, dequantized as
  ``codes.to(float16) * scale + mn``; keys per channel in groups of ``G`` consecutive tokens
  (:func:`kivi_keys`), values per token in groups of ``G`` channels (:func:`kivi_values`).
* **quanto** (transformers' ``QuantoQuantizedLayer``: optimum-quanto's ``MaxOptimizer`` + ``quantize_weight`` for
  ``qint2`` / ``qint4`` and ``QBitsTensor.dequantize``): ``group(x, axis, G)`` (axis 0: rows of ``G`` consecutive
  elements; axis -1: per last-dim channel, ``G`` consecutive rows), ``scale = (max - min) / (2^b - 1)``,
  ``shift = -min``, codes ``clamp(round((x + shift) / scale), 0, 2^b - 1)``, dequantized ``scale * codes - shift``
  (:func:`quanto_roundtrip`).
* **HQQ** (transformers' ``HQQQuantizedLayer``: ``hqq.core.quantize.Quantizer.quantize(..., optimize=True)`` and
  ``Quantizer.dequantize``): min-max init in float32 over ``reshape(-1, G)`` (axis 1) or ``reshape(G, -1)`` (axis
  0), then HQQ's proximal zero-point solver (``optimize_weights_proximal_legacy``: lp-norm 0.7, beta 10, up to 20
  iterations with early stop; in float16 on CUDA, float32 elsewhere, as HQQ does), dequantized in the compute dtype
  as ``(codes - zero) * (1 / scale)`` (:func:`hqq_roundtrip`).

A group whose values are all equal has ``scale = 0`` in KIVI and quanto: their codes are then undefined (``0 / 0``),
and both dequantize to the group's value whatever the code; here the code is 0.
"""

from __future__ import annotations

import math

import torch

#: The schemes and the bit widths each reference supports (transformers: quanto 2/4; HQQ 1..8, here 2/4/8; KIVI 2/4/8).
SCHEME_BITS: dict[str, tuple[int, ...]] = {"kivi": (2, 4, 8), "quanto": (2, 4), "hqq": (2, 4, 8)}
#: HQQ's proximal solver settings (``optimize_weights_proximal_legacy``'s defaults).
HQQ_LP_NORM, HQQ_BETA, HQQ_ITERS = 0.7, 10.0, 20


def _max_code(bits: int) -> int:
    return 2**bits - 1


# ---------------------------------------------------------------------------------------------------------- KIVI
def kivi_dequantize(codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> torch.Tensor:
    """KIVI's ``unpack_and_dequant_*cache``: ``codes.to(float16) * scale + mn`` (float32 for float32 or bfloat16
    scales, as torch promotes)."""
    return codes.to(torch.float16) * scale + minimum


def _kivi_codes(
    states: torch.Tensor, minimum: torch.Tensor, maximum: torch.Tensor, bits: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codes, scale)`` of KIVI's quantizer: ``clamp((x - mn) / scale, 0, 2^b - 1).round()``."""
    scale = (maximum - minimum) / _max_code(bits)
    codes = ((states - minimum) / scale).clamp(0, _max_code(bits)).round()
    return torch.where(scale == 0, torch.zeros_like(codes), codes), scale


def kivi_values(values: torch.Tensor, group_size: int, bits: int) -> torch.Tensor:
    """KIVI's per-token value round trip: ``values`` ``[..., D]`` in groups of ``group_size`` channels
    (``D % group_size == 0``); returns the dequantized values (float32 for float32 / bfloat16 input, as KIVI's
    ``unpack_and_dequant_vcache`` returns them)."""
    shape = values.shape
    grouped = values.reshape(*shape[:-1], shape[-1] // group_size, group_size)
    minimum = grouped.amin(dim=-1, keepdim=True)
    maximum = grouped.amax(dim=-1, keepdim=True)
    codes, scale = _kivi_codes(grouped, minimum, maximum, bits)
    return kivi_dequantize(codes, scale, minimum).reshape(shape)


def kivi_keys(keys: torch.Tensor, groups: torch.Tensor, bits: int) -> torch.Tensor:
    """KIVI's per-channel key round trip: ``keys`` ``[N, D]`` (one head's tokens), ``groups`` ``[N]`` int64 the group
    of each token (KIVI: ``position // G``, so ``G`` consecutive tokens share each channel's scale and zero point).

    With every group complete this is ``quant_and_pack_kcache`` then ``unpack_and_dequant_kcache``; a group some of
    whose tokens were evicted before it was quantized takes its minimum and maximum over the tokens that remain
    (kvbench's extension: KIVI has no eviction).  Returns ``[N, D]`` dequantized keys (float32 for float32 / bfloat16).
    """
    _, index = torch.unique(groups, return_inverse=True)
    count = int(index.max()) + 1 if index.numel() else 0
    expanded = index[:, None].expand_as(keys)
    fill = torch.full((count, keys.shape[1]), float("inf"), dtype=keys.dtype, device=keys.device)
    minimum = fill.scatter_reduce(0, expanded, keys, reduce="amin").gather(0, expanded)
    maximum = (-fill).scatter_reduce(0, expanded, keys, reduce="amax").gather(0, expanded)
    codes, scale = _kivi_codes(keys, minimum, maximum, bits)
    return kivi_dequantize(codes, scale, minimum)


# -------------------------------------------------------------------------------------------------------- quanto
def quanto_group(states: torch.Tensor, axis: int, group_size: int) -> torch.Tensor:
    """optimum-quanto's ``group``: axis 0 -> ``[numel / G, G]`` rows of ``G`` consecutive elements; axis -1 ->
    ``[G, D * groups]`` (per last-dim channel, ``G`` consecutive rows).  Raises like quanto when ``G`` does not
    divide the elements per channel."""
    axis_dim = states.shape[axis]
    axis_numel = states.numel() // axis_dim
    if group_size > axis_numel or axis_numel % group_size != 0:
        raise ValueError(f"quanto: group size ({group_size}) must be a divisor of ({axis_numel})")
    if axis == 0:
        return states.reshape(-1, group_size)
    grouped = states.reshape(axis_numel // group_size, group_size, axis_dim).permute(1, 2, 0)
    return grouped.reshape(group_size, axis_dim * (axis_numel // group_size))


def quanto_ungroup(grouped: torch.Tensor, axis: int, shape: torch.Size) -> torch.Tensor:
    """optimum-quanto's ``ungroup`` (the inverse of :func:`quanto_group`)."""
    if grouped.shape == shape:
        return grouped
    if axis == 0:
        return grouped.reshape(shape)
    group_size, axis_dim = grouped.shape[0], shape[axis]
    groups = grouped.numel() // axis_dim // group_size
    return grouped.reshape(group_size, axis_dim, groups).permute(2, 0, 1).reshape(shape)


def quanto_roundtrip(states: torch.Tensor, bits: int, axis: int, group_size: int) -> torch.Tensor:
    """transformers' quanto layer on ``states`` (its ``[B, H, S, D]`` tensor): ``MaxOptimizer`` scale and shift per
    group, ``quantize_weight`` codes, ``QBitsTensor.dequantize``.  Returns the dequantized states, same dtype."""
    grouped = quanto_group(states, axis, group_size)
    reduce_axis = None if grouped.shape[axis] == 1 else axis  # quanto: an axis of size 1 is per-tensor
    dims = [1] if reduce_axis == 0 else [0]
    minimum = torch.amin(grouped, dim=dims, keepdim=True)
    maximum = torch.amax(grouped, dim=dims, keepdim=True)
    scale = (maximum - minimum) / _max_code(bits)
    shift = -minimum
    codes = torch.round((grouped + shift) / scale).clamp(0, _max_code(bits))
    codes = torch.where(scale == 0, torch.zeros_like(codes), codes)
    return quanto_ungroup(scale * codes - shift, axis, states.shape)


# ----------------------------------------------------------------------------------------------------------- HQQ
def _hqq_shrink(error: torch.Tensor, beta: float, lp_norm: float) -> torch.Tensor:
    """HQQ's ``shrink_lp_op``: ``sign(x) * relu(|x| - |x|^(p - 1) / beta)``."""
    out = torch.abs(error)
    out.sub_((1.0 / beta) * out.pow(lp_norm - 1)).clamp_min_(0.0)
    return out.mul_(torch.sign(error))


def _hqq_optimize(
    grouped: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int, axis: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """HQQ's ``optimize_weights_proximal_legacy`` (float16 on CUDA, float32 elsewhere): ``(codes, scale, zero)``."""
    dtype = torch.float16 if grouped.device.type == "cuda" else torch.float32
    weights, scale, zero = grouped.to(dtype), scale.to(dtype), zero.to(dtype)
    best = torch.tensor(torch.inf, dtype=torch.float32, device=grouped.device)
    for _ in range(HQQ_ITERS):
        codes = torch.round(weights * scale + zero).clamp_(0, _max_code(bits))
        restored = (codes - zero) / scale
        shrunk = _hqq_shrink(weights - restored, HQQ_BETA, HQQ_LP_NORM)
        zero = torch.mean(codes - (weights - shrunk) * scale, axis=axis, keepdim=True)
        error = torch.abs(weights - restored).mean().float()
        if error < best:
            best = error
        else:
            break
    codes = torch.round(grouped * scale + zero).clamp_(0, _max_code(bits))
    return codes, scale, zero


def hqq_roundtrip(states: torch.Tensor, bits: int, axis: int, group_size: int) -> torch.Tensor:
    """transformers' HQQ layer on ``states`` (its ``[B, H, S, D]`` tensor; ``numel % G == 0``): ``Quantizer.quantize``
    with ``optimize=True`` (axis 1: rows of ``G`` consecutive elements; axis 0: ``reshape(G, -1)``), then
    ``Quantizer.dequantize`` in ``states.dtype`` (the layer's compute dtype)."""
    if states.numel() % group_size:
        raise ValueError(f"HQQ: group_size ({group_size}) must divide the tensor's {states.numel()} elements")
    weights = states.float()
    grouped = weights.reshape(-1, group_size) if axis == 1 else weights.reshape(group_size, -1)
    minimum = grouped.min(axis=axis, keepdim=True)[0]
    maximum = grouped.max(axis=axis, keepdim=True)[0]
    denom = maximum - minimum
    scale = _max_code(bits) / denom
    scale = torch.where(denom.abs() <= 1e-4, torch.full_like(scale, 1.0), scale).clamp(max=2e4)
    zero = -minimum * scale
    codes, scale, zero = _hqq_optimize(grouped, scale, zero, bits, axis)
    dtype = states.dtype  # Quantizer.cuda casts scale and zero to the compute dtype; unpack gives codes in it
    inverse = (1.0 / scale).to(dtype)
    return ((codes.to(torch.uint8).to(dtype) - zero.to(dtype)) * inverse).reshape(states.shape)


# --------------------------------------------------------------------------------------------------------- bytes
def quantized_bytes(elements: int, bits: int, groups: int, itemsize: int) -> int:
    """Bytes of ``elements`` quantized values in ``groups`` groups: packed codes ``ceil(bits * elements / 8)`` plus one
    scale and one zero point per group at ``itemsize`` bytes (docs/kv_quant.md)."""
    return math.ceil(bits * elements / 8) + 2 * groups * itemsize
