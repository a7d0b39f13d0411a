"""Block-scaled FP4 matmul: x[M, K] @ W[K, N], W an nvfp4/mxfp4 QuantizedTensor quantized along K.

Layers: `_fp4_matmul_kernel` (Pallas kernel), `_fp4_matmul_call` (pallas_call wrapper: padding,
layout), `fp4_matmul` (validated public function), `fp4_matmul_reference` (dequantize, then
jnp.dot in float32).

The kernel reads the packed uint8 codes Wp[K/2, N] and the raw block-scale bytes S[K/bs, N],
decodes and scales them in registers and accumulates in float32 (W4A16: Hopper has no FP4
tensor cores). Code 2i sits in the low nibble and 2i+1 in the high one; rather than interleave
in the kernel, the wrapper splits x into even and odd columns and the kernel computes
x_even @ W_low + x_odd @ W_high.

Grid (M/bm, N/bn), both parallel; K is tiled inside the kernel by a fori_loop over bk-wide
slices. (A K grid axis accumulating into one output block would race on GPU, where the
programs of a Triton grid run concurrently.) M, N and K are zero-padded to their tiles.

W4A4 emulation (`w4a4=True`): each bk slice of x is fake-quantized in the kernel to the
weight's format (NVFP4: 16-element blocks with the tensor scale of the whole x, computed by the
wrapper; MXFP4: 32-element blocks, the weight's scale rule) before the product.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels import _compat
from pallas_kernels.fp4 import quantized_tensor as qtm
from pallas_kernels.fp4.e2m1 import decode_e2m1
from pallas_kernels.fp4.formats import dequantize, quantize
from pallas_kernels.fp4.mxfp4 import mxfp4_fake_quantize_blocks
from pallas_kernels.fp4.nvfp4 import nvfp4_fake_quantize_blocks, nvfp4_global_scales
from pallas_kernels.fp4.quantized_tensor import QuantizedTensor
from pallas_kernels.fp4.scale_codecs import decode_e4m3_bytes, decode_e8m0, e4m3_to_bytes

KERNEL_FORMATS = ("nvfp4", "mxfp4")
PRECISIONS = ("float32", "bfloat16")
_X_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
# (largest M, (bm, bn, bk)). Small M is weight-bandwidth bound: few rows, long K slices, and
# narrow N tiles so that K = N = 8192 still gives 128 programs (an H200 has 132 SMs).
_BLOCK_TABLE = ((16, (16, 64, 256)), (64, (64, 128, 128)), (None, (128, 128, 128)))


def _next_pow2(n):
    return 1 << max(0, (n - 1).bit_length())


def _roundup(n, m):
    return -(-n // m) * m


def pick_block_sizes(m, n, k):
    """(bm, bn, bk) from the table, shrunk to the problem (powers of two, bn >= 16, bk >= 32)."""
    bm, bn, bk = next(b for limit, b in _BLOCK_TABLE if limit is None or m <= limit)
    return bm, min(bn, max(16, _next_pow2(n))), min(bk, max(32, _next_pow2(k)))


def _fake_quantize_pair(xe, xo, fmt, scale_rule, x_enc, x_dec, bs):
    """Fake-quantize x's bk slice held as even/odd halves f32[bm, bk/2] (one block = bs/2 of each)."""
    bm, bk2 = xe.shape
    xe_b, xo_b = xe.reshape(bm, bk2 * 2 // bs, bs // 2), xo.reshape(bm, bk2 * 2 // bs, bs // 2)
    bamax = jnp.maximum(qtm.block_amax(xe_b), qtm.block_amax(xo_b))
    if fmt == "nvfp4":
        fq = lambda b: nvfp4_fake_quantize_blocks(b, x_enc, x_dec, bamax)
    else:
        fq = lambda b: mxfp4_fake_quantize_blocks(b, scale_rule, bamax)
    return fq(xe_b).reshape(bm, bk2), fq(xo_b).reshape(bm, bk2)


def _dot(a, b, precision):
    if precision == "bfloat16":
        return jnp.dot(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16), preferred_element_type=jnp.float32)
    return jnp.dot(a, b, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST)


def _fp4_matmul_kernel(gs_ref, xe_ref, xo_ref, w_ref, s_ref, o_ref, *, fmt, scale_rule, bs, bk, nk,
                       w4a4, precision):
    # gs_ref: f32[4] (w tensor scale, x enc, x tensor scale, unused); xe_ref/xo_ref: [bm, Kp/2];
    # w_ref: u8[Kp/2, bn] packed codes; s_ref: u8[Kp/bs, bn] scale bytes; o_ref: [bm, bn].
    bk2, nb = bk // 2, bk // bs
    bn = o_ref.shape[1]
    w_global, x_enc, x_dec = gs_ref[0], gs_ref[1], gs_ref[2]
    decode_scale = decode_e4m3_bytes if fmt == "nvfp4" else decode_e8m0

    def body(k, acc):
        kx = pl.multiple_of(k * bk2, bk2)
        xe = xe_ref[:, pl.ds(kx, bk2)].astype(jnp.float32)
        xo = xo_ref[:, pl.ds(kx, bk2)].astype(jnp.float32)
        if w4a4:
            xe, xo = _fake_quantize_pair(xe, xo, fmt, scale_rule, x_enc, x_dec, bs)
        packed = w_ref[pl.ds(kx, bk2), :]
        scale = decode_scale(s_ref[pl.ds(pl.multiple_of(k * nb, nb), nb), :]) * w_global
        scale = jnp.broadcast_to(scale[:, None, :], (nb, bs // 2, bn)).reshape(bk2, bn)
        w_lo = decode_e2m1(packed) * scale
        w_hi = decode_e2m1(packed >> 4) * scale
        return acc + _dot(xe, w_lo, precision) + _dot(xo, w_hi, precision)

    acc = jax.lax.fori_loop(0, nk, body, jnp.zeros(o_ref.shape, jnp.float32))
    o_ref[...] = acc.astype(o_ref.dtype)


def _scale_bytes(w):
    return e4m3_to_bytes(w.scales) if w.fmt == "nvfp4" else w.scales


@functools.partial(jax.jit, static_argnames=("block_sizes", "interpret", "w4a4", "precision", "out_dtype"))
def _fp4_matmul_call(x, w, *, block_sizes, interpret, w4a4, precision, out_dtype):
    (m, k), n = x.shape, w.shape[1]
    bm, bn, bk = block_sizes
    bs = w.block_size
    mp, np_, kp = _roundup(m, bm), _roundup(n, bn), _roundup(k, bk)
    xp = jnp.pad(x, ((0, mp - m), (0, kp - k)))
    data = jnp.pad(w.data, ((0, (kp - k) // 2), (0, np_ - n)))
    scales = jnp.pad(_scale_bytes(w), ((0, (kp - k) // bs), (0, np_ - n)))
    x_enc = x_dec = jnp.ones((), jnp.float32)
    if w4a4 and w.fmt == "nvfp4":
        x_enc, x_dec = nvfp4_global_scales(qtm.finite_amax(x.astype(jnp.float32)))
    gs = jnp.stack([w.tensor_scale.astype(jnp.float32), x_enc, x_dec, jnp.zeros((), jnp.float32)])
    kernel = functools.partial(_fp4_matmul_kernel, fmt=w.fmt, scale_rule=w.scale_rule, bs=bs, bk=bk,
                               nk=kp // bk, w4a4=w4a4, precision=precision)
    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((mp, np_), out_dtype),
        grid=(mp // bm, np_ // bn),
        in_specs=[
            pl.BlockSpec((4,), lambda i, j: (0,)),
            pl.BlockSpec((bm, kp // 2), lambda i, j: (i, 0)),
            pl.BlockSpec((bm, kp // 2), lambda i, j: (i, 0)),
            pl.BlockSpec((kp // 2, bn), lambda i, j: (0, j)),
            pl.BlockSpec((kp // bs, bn), lambda i, j: (0, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        interpret=interpret,
        # Explicit, so the backend is chosen: on jax 0.10.2 the default is Mosaic GPU, which cannot
        # lower this grid kernel (its copies need warpgroup-multiple byte counts). Triton is kept
        # for the portable kernel; the Mosaic GPU path is a plgpu.kernel of its own.
        compiler_params=None if interpret else _compat.triton_params(num_warps=4, num_stages=2),
        name=f"fp4_matmul_{w.fmt}",
    )(gs, xp[:, 0::2], xp[:, 1::2], data, scales)
    return out[:m, :n]


def _validate(x, w, block_sizes, precision):
    if not isinstance(w, QuantizedTensor):
        raise ValueError(f"fp4_matmul needs w as a QuantizedTensor, got {type(w).__name__}")
    if w.fmt not in KERNEL_FORMATS:
        raise ValueError(f"fp4_matmul takes {KERNEL_FORMATS} weights, got fmt={w.fmt!r}; "
                         "use fp4_matmul_reference for it")
    if len(w.shape) != 2 or w.axis != 0:
        raise ValueError(f"fp4_matmul needs a [K, N] weight quantized along K (axis 0), "
                         f"got shape {w.shape} quantized along axis {w.axis}")
    if x.ndim < 1 or x.dtype not in _X_DTYPES:
        raise ValueError(f"fp4_matmul needs x[..., K] of dtype float32/bfloat16/float16, "
                         f"got shape {x.shape} dtype {x.dtype}")
    if x.shape[-1] != w.shape[0]:
        raise ValueError(f"fp4_matmul shape mismatch: x {x.shape} @ w {w.shape} (K {x.shape[-1]} != {w.shape[0]})")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if block_sizes is not None:
        bm, bn, bk = block_sizes
        if min(bm, bn, bk) < 1 or bk % w.block_size:
            raise ValueError(f"block_sizes {block_sizes} need positive sizes and bk a multiple of "
                             f"the {w.fmt} block size {w.block_size}")


def fp4_matmul(x, w: QuantizedTensor, *, interpret=None, w4a4=False, block_sizes=None,
               precision="float32", out_dtype=None):
    """x[..., K] (f32/bf16/f16) @ w[K, N] (nvfp4/mxfp4, quantized along K) -> out_dtype[..., N].

    interpret: None interprets the Pallas kernel on CPU and compiles it elsewhere.
    w4a4: also fake-quantize x per block to w's format on the fly (see the module docstring).
    block_sizes: (bm, bn, bk) override of the table; bk a multiple of w.block_size.
    precision: "float32" (dequantized weights and x in f32) or "bfloat16" (bf16 x bf16 products);
      both accumulate in float32.
    out_dtype: defaults to x.dtype.
    """
    x = jnp.asarray(x)
    _validate(x, w, block_sizes, precision)
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    block_sizes = tuple(block_sizes) if block_sizes else pick_block_sizes(x2.shape[0], w.shape[1], k)
    interpret = jax.default_backend() == "cpu" if interpret is None else interpret
    out = _fp4_matmul_call(x2, w, block_sizes=block_sizes, interpret=bool(interpret), w4a4=w4a4,
                           precision=precision, out_dtype=jnp.dtype(out_dtype or x.dtype))
    return out.reshape(lead + (w.shape[1],))


def fp4_matmul_reference(x, w: QuantizedTensor, *, w4a4=False, out_dtype=None):
    """Reference for fp4_matmul (any format): dequantize, then jnp.dot in float32.

    With w4a4, x is first round-tripped through quantize(x, w.fmt, axis=-1).
    """
    x = jnp.asarray(x)
    return _reference(x, w, w4a4=w4a4, out_dtype=jnp.dtype(out_dtype or x.dtype))


@functools.partial(jax.jit, static_argnames=("w4a4", "out_dtype"))
def _reference(x, w, *, w4a4, out_dtype):
    xf = x.astype(jnp.float32)
    if w4a4:
        opts = {"scale_rule": w.scale_rule} if w.fmt == "mxfp4" else {}
        xf = dequantize(quantize(xf, w.fmt, axis=-1, **opts))
    return jnp.dot(xf, dequantize(w), precision=jax.lax.Precision.HIGHEST).astype(out_dtype)
