"""E2M1 (FP4) codec: the 16 four-bit codes, round-to-nearest-even, nibble packing.

A code is sign(1) | exponent(2) | mantissa(1); the magnitude of `code & 7` is
{0, 0.5, 1, 1.5, 2, 3, 4, 6}. E2M1 has no inf and no NaN: encoding saturates at ±6 and the
code of a NaN input is unspecified (the block formats mark NaN through their block scale).
Every function here is elementwise jnp without gathers, so it also runs inside Pallas kernels.

Packing: two codes per uint8 along the packed axis, element 2i in the low nibble and
element 2i+1 in the high nibble.
"""
import jax.numpy as jnp
import numpy as np

E2M1_MAX = 6.0
# f32[16]: value of each code, in code order (code 8 is -0.0).
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def _magnitude_code(a):
    # Midpoints between neighbouring magnitudes. A tie goes to the even code (mantissa 0):
    # at an even->odd boundary it stays down (>), at an odd->even boundary it goes up (>=).
    steps = (a > 0.25, a >= 0.75, a > 1.25, a >= 1.75, a > 2.5, a >= 3.5, a > 5.0)
    return sum(s.astype(jnp.int32) for s in steps)


def encode_e2m1(x):
    """f32[...] -> uint8[...] codes in [0, 15]; round-to-nearest-even, saturating at ±6.

    The sign of zero is kept (-0.0 and tiny negatives encode as code 8).
    """
    x = jnp.asarray(x, jnp.float32)
    sign = jnp.signbit(x).astype(jnp.int32) << 3
    return (_magnitude_code(jnp.abs(x)) | sign).astype(jnp.uint8)


def decode_e2m1(codes):
    """uint8/int[...] codes -> f32[...] values (only the low 4 bits are read)."""
    c = jnp.asarray(codes).astype(jnp.int32) & 15
    exp, man = (c & 7) >> 1, c & 1
    quarter_units = jnp.where(exp > 0, (2 + man) << exp, man << 1)
    mag = quarter_units.astype(jnp.float32) * 0.25
    return jnp.where((c & 8) != 0, -mag, mag)


def round_e2m1(x):
    """f32[...] -> f32[...]: the E2M1 value nearest to x (ties to even, saturating at ±6).

    Equal to decode_e2m1(encode_e2m1(x)) up to the sign of zero; cheaper inside kernels.
    """
    a = jnp.abs(x)
    steps = ((a > 0.25, 0.5), (a >= 0.75, 0.5), (a > 1.25, 0.5), (a >= 1.75, 0.5),
             (a > 2.5, 1.0), (a >= 3.5, 1.0), (a > 5.0, 2.0))
    mag = sum(jnp.where(s, inc, 0.0) for s, inc in steps)
    return jnp.where(x < 0, -mag, mag).astype(jnp.float32)


def pack_nibbles(codes, axis=-1):
    """uint8[..., n, ...] codes -> uint8[..., n/2, ...]; element 2i low nibble, 2i+1 high."""
    c = jnp.moveaxis(jnp.asarray(codes, jnp.uint8), axis, -1)
    if c.shape[-1] % 2:
        raise ValueError(f"pack_nibbles needs an even length along axis {axis}, got shape {codes.shape}")
    packed = (c[..., 0::2] & 15) | ((c[..., 1::2] & 15) << 4)
    return jnp.moveaxis(packed.astype(jnp.uint8), -1, axis)


def unpack_nibbles(packed, axis=-1):
    """uint8[..., n/2, ...] -> uint8[..., n, ...] codes; inverse of pack_nibbles."""
    p = jnp.moveaxis(jnp.asarray(packed, jnp.uint8), axis, -1)
    codes = jnp.stack([p & 15, p >> 4], axis=-1).reshape(p.shape[:-1] + (2 * p.shape[-1],))
    return jnp.moveaxis(codes, -1, axis)
