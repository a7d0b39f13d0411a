"""cuBLASLt / CUTLASS "128x4" swizzled layout of block scales (export option, and its inverse).

A scale matrix S[R, C] (R rows = the non-reduced dimension, C = K / block_size) is zero-padded
to [roundup(R, 128), roundup(C, 4)] and cut into 128x4 tiles of 512 bytes, laid out row-major
over (r // 128, c // 4). Inside a tile the entry (r, c) sits at byte
    (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4.
"""
import jax.numpy as jnp

from pallas_kernels.fp4.quantized_tensor import QuantizedTensor

TILE_ROWS, TILE_COLS = 128, 4


def _roundup(n, m):
    return -(-n // m) * m


def swizzle_scales_128x4(scales):
    """[R, C] scales (any 1-byte dtype) -> flat [roundup(R,128) * roundup(C,4)] in the 128x4 layout."""
    if scales.ndim != 2:
        raise ValueError(f"swizzle_scales_128x4 needs a 2-D [rows, K/block] array, got shape {scales.shape}")
    r, c = scales.shape
    rp, cp = _roundup(r, TILE_ROWS), _roundup(c, TILE_COLS)
    s = jnp.pad(scales, ((0, rp - r), (0, cp - c)))
    # rows r = 128*rt + 32*rq + rm, cols c = 4*ct + cm  ->  order (rt, ct, rm, rq, cm)
    tiles = s.reshape(rp // 128, 4, 32, cp // 4, 4).transpose(0, 3, 2, 1, 4)
    return tiles.reshape(-1)


def unswizzle_scales_128x4(flat, rows, cols):
    """Inverse of swizzle_scales_128x4: flat swizzled bytes -> [rows, cols]."""
    rp, cp = _roundup(rows, TILE_ROWS), _roundup(cols, TILE_COLS)
    if flat.shape != (rp * cp,):
        raise ValueError(f"expected {rp * cp} swizzled scales for [{rows}, {cols}], got shape {flat.shape}")
    s = flat.reshape(rp // 128, cp // 4, 32, 4, 4).transpose(0, 3, 2, 1, 4).reshape(rp, cp)
    return s[:rows, :cols]


def cublas_scale_layout(qt: QuantizedTensor):
    """Block scales of a 2-D nvfp4/mxfp4 QuantizedTensor as flat 128x4-swizzled bytes.

    Rows are the non-quantized dimension (N for a [K, N] weight quantized along K), columns
    the K / block_size blocks, as cuBLASLt expects for both operands.
    """
    if qt.fmt not in ("nvfp4", "mxfp4") or len(qt.shape) != 2:
        raise ValueError(f"cublas_scale_layout needs a 2-D nvfp4/mxfp4 tensor, got {qt.fmt} {qt.shape}")
    return swizzle_scales_128x4(jnp.moveaxis(qt.scales, qt.axis, -1))
