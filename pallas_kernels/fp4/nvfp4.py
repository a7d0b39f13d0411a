"""NVFP4: E2M1 values in blocks of 16 along an axis, an E4M3 scale per block, an FP32 tensor scale.

Arithmetic follows Transformer Engine's NVFP4 reference quantizer op for op (reciprocals are
multiplied, as in its kernels), which is the two-level formula
    s_global = amax / (6 * 448)
    s_block  = e4m3_rne(min((block_amax / 6) / s_global, 448))
    q        = e2m1_rne(clip(x / (float32(s_block) * s_global), -6, 6))
    x_hat    = e2m1_value(q) * (float32(s_block) * s_global)
evaluated as  enc = min(2688 / amax, FLT_MAX),  s_global = 1 / enc,
              s_block = e4m3(clip(block_amax * (enc * (1/6)), 448)),
              q = e2m1(clip(x * min(1 / (float32(s_block) * s_global), FLT_MAX), -6, 6)).
(A literal `x / (s_block * s_global)` is not bit-stable anyway: XLA rewrites division by a
broadcast scalar into multiplication by its reciprocal.) E4M3 rounding clips to 448 before the
cast: a float8_e4m3fn cast above 464 gives NaN.

Zeros: an all-zero block gets s_block = 0; a block whose s_block rounds to 0 (block_amax below
~2^-10 * 6 * s_global) dequantizes to zeros as well: a zero scale means a zero block, never a
division by zero or a NaN. amax = 0 sets enc = s_global = 1 (TE stores 1/FLT_MAX there; the
values, all zero, are the same), so an all-zero tensor dequantizes to zeros.
NaN policy: amax ignores non-finite values; a block holding a NaN or ±inf gets a NaN block scale
(E4M3 0x7F) and dequantizes to NaN, the other blocks are unaffected.
Range: XLA:CPU flushes float32 subnormals, so a tensor with amax below ~1e-32 (where
s_block * s_global falls under 2^-126) loses its small blocks to zero on CPU.
"""
import jax.numpy as jnp
import numpy as np

from pallas_kernels.fp4 import quantized_tensor as qtm
from pallas_kernels.fp4.e2m1 import E2M1_MAX, decode_e2m1, encode_e2m1, pack_nibbles, round_e2m1, unpack_nibbles
from pallas_kernels.fp4.scale_codecs import E4M3_MAX, F32_MAX, round_e4m3

NVFP4_BLOCK = 16
_INV_E2M1_MAX = np.float32(1.0) / np.float32(E2M1_MAX)


def nvfp4_global_scales(amax):
    """f32[] finite amax -> (enc, s_global): enc = min(2688 / amax, FLT_MAX) (1 when amax = 0), s_global = 1/enc."""
    amax = jnp.asarray(amax, jnp.float32)
    safe = jnp.where(amax > 0, amax, 1.0)
    enc = jnp.where(amax > 0, jnp.minimum(np.float32(E2M1_MAX * E4M3_MAX) / safe, F32_MAX), 1.0)
    return enc, 1.0 / enc


def nvfp4_block_scale(bamax, enc):
    """f32[...] block amax, f32[] global enc -> float8_e4m3fn[...] block scales."""
    return round_e4m3(jnp.minimum(bamax * (enc * _INV_E2M1_MAX), F32_MAX))


def nvfp4_block_encode(s_block, s_global):
    """f32[...] decoded block scale -> f32[...] multiplier taking x into the E2M1 range."""
    return jnp.minimum(1.0 / (s_block * s_global), F32_MAX)


def nvfp4_fake_quantize_blocks(xb, enc, s_global, bamax=None):
    """f32[..., nb, bs] -> f32[..., nb, bs]: dequantize(quantize(x)) for NVFP4, used by W4A4.

    `bamax` (f32[..., nb]) overrides the per-block amax when a block is split over several
    arrays (the kernel holds a block's even and odd elements apart).
    """
    bamax = qtm.block_amax(xb) if bamax is None else bamax
    s_block = nvfp4_block_scale(bamax, enc).astype(jnp.float32)
    q = jnp.clip(xb * nvfp4_block_encode(s_block, s_global)[..., None], -E2M1_MAX, E2M1_MAX)
    return round_e2m1(q) * (s_block * s_global)[..., None]


def quantize_nvfp4(x, axis):
    """f32/bf16[...] -> QuantizedTensor(fmt="nvfp4"); the length along `axis` must divide by 16."""
    dtype = jnp.dtype(x.dtype).name
    x = x.astype(jnp.float32)
    enc, s_global = nvfp4_global_scales(qtm.finite_amax(x))
    xb = qtm.to_blocks(x, axis, NVFP4_BLOCK)
    s_block = nvfp4_block_scale(qtm.block_amax(xb), enc)
    q = jnp.clip(xb * nvfp4_block_encode(s_block.astype(jnp.float32), s_global)[..., None], -E2M1_MAX, E2M1_MAX)
    codes = qtm.from_blocks(encode_e2m1(q), axis)
    return qtm.QuantizedTensor(
        data=pack_nibbles(codes, axis), scales=qtm.block_scales_to_axis(s_block, axis),
        tensor_scale=s_global, shape=tuple(x.shape), fmt="nvfp4", axis=axis,
        block_size=NVFP4_BLOCK, dtype=dtype)


def dequantize_nvfp4(qt):
    """QuantizedTensor(fmt="nvfp4") -> f32[qt.shape]."""
    values = qtm.to_blocks(decode_e2m1(unpack_nibbles(qt.data, qt.axis)), qt.axis, NVFP4_BLOCK)
    denom = qtm.block_scales_from_axis(qt.scales.astype(jnp.float32) * qt.tensor_scale, qt.axis)
    return qtm.from_blocks(values * denom, qt.axis)
