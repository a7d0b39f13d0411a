"""Block-scale codecs: FP8 E4M3 (NVFP4 block scales, FP8 baseline) and E8M0 (MXFP4).

E4M3 here is float8_e4m3fn: bias 7, max 448, subnormals down to 2^-9, no inf, NaN = S.1111.111.
A float8_e4m3fn cast of a value above 464 (the midpoint to the missing 480) gives NaN, not 448,
so `round_e4m3` clips to ±448 before casting.
E8M0 is a bare biased exponent: byte b means 2^(b-127) for b in [0, 254]; 255 is NaN; no zero.
The byte decoders are integer arithmetic (no bitcast of float8, no gathers) so kernels can use them.
"""
import jax
import jax.numpy as jnp
import numpy as np

E4M3_MAX = 448.0
F32_MAX = np.float32(np.finfo(np.float32).max)
E8M0_NAN = 255
E8M0_MIN_EXP, E8M0_MAX_EXP = -127, 127


def round_e4m3(x):
    """f32[...] -> float8_e4m3fn[...]: clip to ±448, then round to nearest even (NaN stays NaN)."""
    return jnp.clip(jnp.asarray(x, jnp.float32), -E4M3_MAX, E4M3_MAX).astype(jnp.float8_e4m3fn)


def decode_e4m3_bytes(b):
    """uint8[...] raw E4M3 bytes -> f32[...] values (0x7F and 0xFF are NaN)."""
    b = jnp.asarray(b).astype(jnp.int32)
    exp, man = (b >> 3) & 15, b & 7
    # value = man * 2^-9 (subnormal) or (8 + man) * 2^(exp - 10) (normal), scaled by 2^-10 once.
    units = jnp.where(exp == 0, man << 1, (8 + man) << exp).astype(jnp.float32)
    mag = jnp.where((exp == 15) & (man == 7), jnp.nan, units * np.float32(2.0 ** -10))
    return jnp.where((b & 128) != 0, -mag, mag)


def e4m3_to_bytes(x):
    """float8_e4m3fn[...] -> uint8[...] raw bytes."""
    return jax.lax.bitcast_convert_type(x, jnp.uint8)


def encode_e8m0(exponent, is_nan=None):
    """int32[...] power-of-two exponents -> uint8[...] E8M0 bytes, clamped to [-127, 127]."""
    b = jnp.clip(exponent, E8M0_MIN_EXP, E8M0_MAX_EXP) + 127
    if is_nan is not None:
        b = jnp.where(is_nan, E8M0_NAN, b)
    return b.astype(jnp.uint8)


def decode_e8m0(b):
    """uint8[...] E8M0 bytes -> f32[...] = 2^(b-127); 255 -> NaN.

    Byte 0 is 2^-127, a float32 subnormal: XLA:CPU flushes it (and products with it) to zero.
    """
    b = jnp.asarray(b).astype(jnp.int32)
    normal = jax.lax.bitcast_convert_type(jnp.maximum(b, 1) << 23, jnp.float32)
    value = jnp.where(b == 0, np.float32(2.0 ** -127), normal)
    return jnp.where(b == E8M0_NAN, jnp.nan, value)


def pow2_f32(exponent):
    """int32[...] in [-126, 127] -> f32[...] = 2^exponent, exact (built from the exponent bits)."""
    return jax.lax.bitcast_convert_type((jnp.asarray(exponent, jnp.int32) + 127) << 23, jnp.float32)
