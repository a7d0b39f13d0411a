"""W4A8: FP4 weights times activations quantized to int8 per weight block (llama.cpp's Q8 activations), the
reference the CPU kernel (``jaxserve.kernels.cpu.fp4_w4a8_matmul_cpu``) is checked against.

Per row and block of ``block_size`` along K (the weight's blocks): d = amax / 127, q = round(x * (127 / amax)) in
[-127, 127] (float32, ties to even), x ~ q * d. A block of zeros gives zeros; a block holding a NaN or an infinity
gives NaN (its row's outputs are NaN, as an unquantized matmul's would be).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.fp4 import QuantizedTensor, dequantize

FORMATS = ("nvfp4", "mxfp4")


def quantize_activations(x: jax.Array, block_size: int) -> tuple[jax.Array, jax.Array]:
    """x f32[..., K] -> (q int8[..., K], d f32[..., K / block_size]): q * d (per block) approximates x."""
    x = jnp.asarray(x, jnp.float32)
    k = x.shape[-1]
    if k % block_size:
        raise ValueError(f"quantize_activations: K={k} is not a multiple of block_size={block_size}")
    blocks = x.reshape(*x.shape[:-1], k // block_size, block_size)
    amax = jnp.max(jnp.abs(blocks), axis=-1)
    finite = jnp.all(jnp.isfinite(blocks), axis=-1)
    inv = jnp.where(finite & (amax > 0), jnp.float32(127) / jnp.where(amax > 0, amax, 1), 0)
    q = jnp.clip(jnp.round(blocks * inv[..., None]), -127, 127).astype(jnp.int8)
    d = jnp.where(finite, amax / jnp.float32(127), jnp.nan)
    return q.reshape(x.shape), d


def dequantize_activations(q: jax.Array, d: jax.Array) -> jax.Array:
    """``quantize_activations``'s (q, d) -> f32[..., K]."""
    blocks = q.reshape(*d.shape, -1).astype(jnp.float32) * d[..., None]
    return blocks.reshape(q.shape)


def w4a8_matmul_reference(x: jax.Array, w: QuantizedTensor, out_dtype=None) -> jax.Array:
    """x[..., K] @ w (nvfp4/mxfp4 [K, N] along K) with x quantized to int8 on w's blocks: a float32 dot of the
    dequantized operands -> out_dtype[..., N] (default x.dtype)."""
    if w.fmt not in FORMATS or w.axis != 0 or len(w.shape) != 2:
        raise ValueError(f"w4a8 needs a 2-D {FORMATS} weight quantized along axis 0, got fmt={w.fmt!r} "
                         f"axis={w.axis} shape={w.shape}")
    x = jnp.asarray(x)
    xq = dequantize_activations(*quantize_activations(x.astype(jnp.float32), w.block_size))
    y = jnp.dot(xq, dequantize(w, jnp.float32), precision=jax.lax.Precision.HIGHEST)
    return y.astype(out_dtype or x.dtype)
