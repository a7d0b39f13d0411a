"""Activations quantized to int8 in blocks (llama.cpp's Q8 rule), as the VNNI kernels (``vnni.cc``) take them: per row
and block of ``block_size`` along K, d = amax / 127 and q = round(x * (127 / amax)) in [-127, 127] (float32, ties to
even), x ~ q * d. A block of zeros gives zeros; a block holding a NaN or an infinity gives NaN (its row's outputs are
NaN, as an unquantized matmul's would be). The references of ``jaxserve.quant.w4a8`` and ``int8_head`` use it.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


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
