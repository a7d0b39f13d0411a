"""Comparison baselines: FP8 E4M3 per-tensor / per-channel, and symmetric INT4 per-group (g=128).

Both compute an encode multiplier enc = qmax / amax and store the decode scale 1 / enc (as
Transformer Engine's current-scaling reference does): reciprocals are multiplied, never divided
by a broadcast scale, which XLA would rewrite into a reciprocal multiply anyway.

FP8: amax over the tensor ("tensor") or along `axis` for every other index ("channel": one scale
per output channel when a [K, N] weight is quantized along K); enc = 448 / amax;
q = e4m3_rne(clip(x * enc, -448, 448)), clipped before the cast (a float8_e4m3fn cast above 464
gives NaN); x_hat = q * (1 / enc). amax = 0 gives enc = 1 (zeros stay zeros).
NaN policy: E4M3 has NaN, so a NaN or ±inf element becomes NaN on its own; amax ignores it.

INT4: symmetric, per group of `group_size` along `axis`: enc = 7 / group_amax,
q = clip(round_half_even(x * enc), -7, 7) stored as two's-complement nibbles (packed like E2M1:
element 2i low nibble); x_hat = q * (1 / enc). An all-zero group has scale 0 and dequantizes to
zeros. NaN policy: a group holding a NaN or ±inf gets a NaN scale and dequantizes to NaN.
"""
import jax.numpy as jnp

from pallas_kernels.fp4 import quantized_tensor as qtm
from pallas_kernels.fp4.e2m1 import pack_nibbles, unpack_nibbles
from pallas_kernels.fp4.scale_codecs import E4M3_MAX, F32_MAX, round_e4m3

FP8_SCALINGS = ("tensor", "channel")
INT4_MAX = 7


def quantize_fp8(x, axis, scaling="tensor"):
    """f32/bf16[...] -> QuantizedTensor(fmt="fp8") with float8_e4m3fn data."""
    if scaling not in FP8_SCALINGS:
        raise ValueError(f"fp8 scaling must be one of {FP8_SCALINGS}, got {scaling!r}")
    dtype = jnp.dtype(x.dtype).name
    x = x.astype(jnp.float32)
    reduce_axis = None if scaling == "tensor" else axis
    amax = qtm.finite_amax(x, axis=reduce_axis, keepdims=True)
    enc = jnp.where(amax > 0, jnp.minimum(E4M3_MAX / jnp.where(amax > 0, amax, 1.0), F32_MAX), 1.0)
    q = round_e4m3(jnp.where(jnp.isfinite(x), x * enc, jnp.nan))
    scale = 1.0 / enc
    ones = jnp.ones((), jnp.float32)
    scales, tensor_scale = (jnp.ones(scale.shape, jnp.float32), scale.reshape(())) if scaling == "tensor" else (scale, ones)
    return qtm.QuantizedTensor(
        data=q, scales=scales, tensor_scale=tensor_scale, shape=tuple(x.shape), fmt="fp8",
        axis=axis, block_size=x.shape[axis], scale_rule=scaling, dtype=dtype)


def dequantize_fp8(qt):
    """QuantizedTensor(fmt="fp8") -> f32[qt.shape]."""
    return qt.data.astype(jnp.float32) * qt.scales * qt.tensor_scale


def quantize_int4(x, axis, group_size=128):
    """f32/bf16[...] -> QuantizedTensor(fmt="int4"); the length along `axis` must divide by group_size."""
    dtype = jnp.dtype(x.dtype).name
    x = x.astype(jnp.float32)
    xb = qtm.to_blocks(x, axis, group_size)
    bamax = qtm.block_amax(xb)
    enc = jnp.minimum(INT4_MAX / jnp.where(bamax > 0, bamax, 1.0), F32_MAX)
    q = jnp.where(bamax[..., None] > 0, jnp.clip(jnp.round(xb * enc[..., None]), -INT4_MAX, INT4_MAX), 0.0)
    scale = jnp.where(bamax > 0, 1.0 / enc, bamax)  # 0 for a zero group, NaN for a non-finite one
    nibbles = qtm.from_blocks(q.astype(jnp.int32) & 15, axis).astype(jnp.uint8)
    return qtm.QuantizedTensor(
        data=pack_nibbles(nibbles, axis), scales=qtm.block_scales_to_axis(scale, axis),
        tensor_scale=jnp.ones((), jnp.float32), shape=tuple(x.shape), fmt="int4", axis=axis,
        block_size=group_size, dtype=dtype)


def dequantize_int4(qt):
    """QuantizedTensor(fmt="int4") -> f32[qt.shape]."""
    n = unpack_nibbles(qt.data, qt.axis).astype(jnp.int32)
    values = qtm.to_blocks(jnp.where(n >= 8, n - 16, n).astype(jnp.float32), qt.axis, qt.block_size)
    return qtm.from_blocks(values * qtm.block_scales_from_axis(qt.scales, qt.axis), qt.axis)
