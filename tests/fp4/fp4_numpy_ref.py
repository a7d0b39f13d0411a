"""Independent NumPy formulations of the codecs, for the tests to compare against.

E2M1 rounding is a brute-force nearest search over the 8 magnitudes (ties to the even code);
E4M3 rounding is ml_dtypes' float8_e4m3fn cast; MX exponents come from float64 log2.
Inputs are quantized along the last axis.
"""
import ml_dtypes
import numpy as np

E2M1_MAGS = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)
F32 = np.float32


def e2m1_nearest(v):
    """f32[...] -> (f32 values, int magnitude index) by exhaustive search, ties to even index."""
    a = np.abs(np.asarray(v, F32))[..., None]
    dist = np.abs(a - E2M1_MAGS)
    tied = dist == dist.min(-1, keepdims=True)
    even = tied & (np.arange(8) % 2 == 0)
    idx = np.where(even.any(-1), even.argmax(-1), tied.argmax(-1))
    return np.copysign(E2M1_MAGS[idx], v).astype(F32), idx


def e4m3(v):
    return np.asarray(v, F32).astype(ml_dtypes.float8_e4m3fn).astype(F32)


def nvfp4(x):
    """x f32[..., n] -> (x_hat f32[..., n], s_block f32[..., n/16], s_global), TE reference arithmetic."""
    x = np.asarray(x, F32)
    fmax = np.finfo(F32).max
    amax = np.max(np.where(np.isfinite(x), np.abs(x), 0)).astype(F32)
    with np.errstate(divide="ignore", over="ignore"):
        enc = np.minimum(F32(2688) / amax, fmax) if amax > 0 else F32(1)
    s_global = F32(1) / enc
    xb = x.reshape(x.shape[:-1] + (-1, 16))
    bamax = np.abs(xb).max(-1)
    s_block = e4m3(np.clip(np.minimum(bamax * (enc * (F32(1) / F32(6))), fmax), -448, 448))
    with np.errstate(divide="ignore", over="ignore"):
        enc_b = np.minimum(F32(1) / (s_block * s_global), fmax)[..., None]
        q = np.clip(xb * enc_b, -6, 6).astype(F32)
    return (e2m1_nearest(q)[0] * (s_block * s_global)[..., None]).reshape(x.shape), s_block, s_global


def mx_exponent(bamax, scale_rule):
    b = np.asarray(bamax, np.float64)
    with np.errstate(divide="ignore"):
        k = np.floor(np.log2(b)) - 2 if scale_rule == "floor" else np.ceil(np.log2(b / 6))
    return np.clip(np.where(b > 0, k, -127), -127, 127).astype(np.int64)


def mxfp4(x, scale_rule):
    """x f32[..., n] -> (x_hat f32[..., n], exponent int[..., n/32])."""
    x = np.asarray(x, F32)
    xb = x.reshape(x.shape[:-1] + (-1, 32))
    k = mx_exponent(np.abs(xb).max(-1), scale_rule)
    scale = np.ldexp(np.ones_like(k, np.float64), k)[..., None]
    q = np.clip(xb / scale, -6, 6).astype(F32)
    return (e2m1_nearest(q)[0] * scale).astype(F32).reshape(x.shape), k


def e4m3_finite_values():
    """(f32[254] values, uint8[254] bytes) of every finite float8_e4m3fn (both zeros included)."""
    b = np.arange(256, dtype=np.uint8)
    v = b.view(ml_dtypes.float8_e4m3fn).astype(F32)
    keep = np.isfinite(v)
    return v[keep], b[keep]


def e4m3_nearest_byte(v):
    """f32[...] in [-448, 448] -> uint8 byte of the nearest E4M3 value, ties to even mantissa."""
    vals, bytes_ = e4m3_finite_values()
    vals, bytes_ = vals[~((vals == 0) & np.signbit(vals))], bytes_[~((vals == 0) & np.signbit(vals))]
    dist = np.abs(np.asarray(v, np.float64)[..., None] - vals.astype(np.float64))
    tied = dist == dist.min(-1, keepdims=True)
    even = tied & (bytes_ % 2 == 0)
    idx = np.where(even.any(-1), even.argmax(-1), tied.argmax(-1))
    return bytes_[idx]
