"""MXFP4 (OCP Microscaling v1.0): E2M1 values in blocks of 32 along an axis, one E8M0 scale per block.

Scale rules (published implementations differ, so the rule is a parameter):
  "floor" (OCP v1.0):   X = 2^(floor(log2(block_amax)) - 2); block_amax / X lies in [4, 8),
                        values above 6 * X saturate to ±6.
  "ceil"  (round up):   X = 2^ceil(log2(block_amax / 6)), the smallest power of two with
                        block_amax / X <= 6, so nothing saturates (coarser steps instead).
Exponents are computed exactly from the float32 bits (frexp), not from a rounded log2.
q = e2m1_rne(clip(x / X, -6, 6)); x_hat = e2m1_value(q) * X.

Zeros: an all-zero block gets the smallest scale 2^-127 (E8M0 has no zero) and codes 0, so it
dequantizes to zeros. NaN policy: a block holding a NaN or ±inf gets the E8M0 NaN byte 0xFF and
dequantizes to NaN; other blocks are unaffected. Exponents clamp to [-127, 127].
"""
import jax.numpy as jnp

from pallas_kernels.fp4 import quantized_tensor as qtm
from pallas_kernels.fp4.e2m1 import E2M1_MAX, decode_e2m1, encode_e2m1, pack_nibbles, round_e2m1, unpack_nibbles
from pallas_kernels.fp4.scale_codecs import (E8M0_MAX_EXP, E8M0_MIN_EXP, decode_e8m0, encode_e8m0,
                                             pow2_f32)

MXFP4_BLOCK = 32
SCALE_RULES = ("floor", "ceil")


def mx_scale_exponent(bamax, scale_rule):
    """f32[...] block amax -> int32[...] exponent k of the block scale 2^k (clamped to E8M0 range)."""
    if scale_rule not in SCALE_RULES:
        raise ValueError(f"mxfp4 scale_rule must be one of {SCALE_RULES}, got {scale_rule!r}")
    _, e = jnp.frexp(bamax)                       # bamax = m * 2^e, m in [0.5, 1)
    k = e.astype(jnp.int32) - 1 - 2               # floor(log2(bamax)) - emax(E2M1)
    if scale_rule == "ceil":
        k_safe = jnp.clip(k, E8M0_MIN_EXP + 1, E8M0_MAX_EXP)
        k = k + (bamax * pow2_f32(-k_safe) > E2M1_MAX).astype(jnp.int32)
    k = jnp.where(bamax > 0, k, E8M0_MIN_EXP)
    return jnp.clip(k, E8M0_MIN_EXP, E8M0_MAX_EXP)


def mx_scaled(xb, k):
    """x / 2^k clipped to the E2M1 range (exact: multiplication by a power of two)."""
    # Finite inputs give k in [-127, 126], so 2^-k is a normal float32 and the product is exact.
    inv = pow2_f32(jnp.clip(-k, -126, 127))
    return jnp.clip(xb * inv[..., None], -E2M1_MAX, E2M1_MAX)


def mxfp4_fake_quantize_blocks(xb, scale_rule, bamax=None):
    """f32[..., nb, bs] -> f32[..., nb, bs]: dequantize(quantize(x)) for MXFP4, used by W4A4.

    `bamax` (f32[..., nb]) overrides the per-block amax, as in nvfp4_fake_quantize_blocks.
    """
    bamax = qtm.block_amax(xb) if bamax is None else bamax
    k = mx_scale_exponent(bamax, scale_rule)
    scale = jnp.where(jnp.isnan(bamax), jnp.nan, decode_e8m0(encode_e8m0(k)))
    return round_e2m1(mx_scaled(xb, k)) * scale[..., None]


def quantize_mxfp4(x, axis, scale_rule="floor"):
    """f32/bf16[...] -> QuantizedTensor(fmt="mxfp4"); the length along `axis` must divide by 32."""
    dtype = jnp.dtype(x.dtype).name
    x = x.astype(jnp.float32)
    xb = qtm.to_blocks(x, axis, MXFP4_BLOCK)
    bamax = qtm.block_amax(xb)
    k = mx_scale_exponent(jnp.where(jnp.isnan(bamax), 0.0, bamax), scale_rule)
    codes = qtm.from_blocks(encode_e2m1(mx_scaled(xb, k)), axis)
    scales = encode_e8m0(k, is_nan=jnp.isnan(bamax))
    return qtm.QuantizedTensor(
        data=pack_nibbles(codes, axis), scales=qtm.block_scales_to_axis(scales, axis),
        tensor_scale=jnp.ones((), jnp.float32), shape=tuple(x.shape), fmt="mxfp4", axis=axis,
        block_size=MXFP4_BLOCK, scale_rule=scale_rule, dtype=dtype)


def dequantize_mxfp4(qt):
    """QuantizedTensor(fmt="mxfp4") -> f32[qt.shape]."""
    values = qtm.to_blocks(decode_e2m1(unpack_nibbles(qt.data, qt.axis)), qt.axis, MXFP4_BLOCK)
    return qtm.from_blocks(values * qtm.block_scales_from_axis(decode_e8m0(qt.scales), qt.axis), qt.axis)
