"""EXPERIMENTAL, UNVERIFIED ON HARDWARE: a Mosaic GPU (Hopper) FP4 matmul for small M (W4A16 decode).

x[M, K] (bf16) @ W[K, N], W an nvfp4/mxfp4 QuantizedTensor quantized along K; same result as
``fp4_matmul_reference`` up to float32 summation order. Checked in Mosaic GPU's CPU interpreter and by
lowering for an abstract H200 (tests/fp4/test_fp4_mosaic.py); never compiled or run on a GPU yet:
benchmarks/gpu_check.sh runs and times it when a session gets one.

Data movement. The weights stay packed in HBM: uint8 codes Wp[K/2, N] (code 2i in the low nibble,
2i+1 in the high one) and raw block-scale bytes S[K/bs, N] (E4M3 for nvfp4, E8M0 for mxfp4). Grid
(N/bn, M tiles, K splits), one CTA (one warpgroup) each. A pipeline over K, ``num_stages`` deep, copies
one step (8 scale blocks: R = 4*bs packed rows, 8*bs values of K) by TMA into shared memory; the CTA
unpacks and scales it in registers to two bf16 tiles [R, bn] (low and high nibbles) in shared memory,
and two WGMMAs multiply them by x's even and odd columns (x_even @ W_lo + x_odd @ W_hi, as in the
portable kernel), accumulating in float32. The tensor scale (nvfp4) multiplies the sum of the K
splits, outside the kernel.

Why the WGMMA, with M padded to 64: a warpgroup's WGMMA has M = 64, and only its A operand may come
from registers; A must be x here, since the QuantizedTensor stores W with K on rows (W^T as A, the
"swap AB" trick that pads only to 8, would need the weights transposed in HBM). The padded rows are
zero in shared memory and never copied from HBM (x moves ceil(M/8)*8 rows). At small M the kernel is
bound by the weight bytes and the unpacking ALU work; WGMMA runs on the tensor cores beside them, so
the 64/M wasted tensor-core work does not set the time (a register dot on the CUDA cores would compete
with the unpacking for the same ALUs). Estimate, not measured: ~35 integer/float ops per packed byte
(two E2M1 decodes, the scale decode, two products and casts), for K = N = 8192 about 1.2e9 lane ops,
~40 us on an H200's CUDA cores, against ~9 us to read its 38 MB: the unpacking, not HBM, is the
expected bound; gpu_check.sh measures it (next steps then: decode each scale once per thread's row pair,
a bit-level bf16 decode where Mosaic GPU has a bitcast rule).

Scales without a broadcast. Each element needs the scale of its block; broadcasting scale rows over a
block's rows in registers has no Mosaic GPU layout rule. Instead the wrapper reorders K within a step
(of x only, a free view for W): smem row rho = 8i + j of a step holds packed row j*(bs/2) + i, so its
block is j = rho mod 8, and the step's 8-row scale tile copied bs/2 times one below the other (TMA,
from L2: no extra HBM bytes) gives every weight element its scale at the same position: unpacking
is elementwise. The exact values: an E2M1 value times an E4M3 or E8M0 scale is exact in bf16, so the
bf16 products are the reference's up to the f32 sum order (x rounded to bf16 first, when given f32).

Lowering semantics: Lane, with explicit register layouts (as mosaic.py's decode kernel). In the CPU
interpreter (``interpret``) the layouts are dropped (it has no rule for them); everything else (the
TMA copies, barriers, the K pipeline, the unpacking, both WGMMAs, the output copy) runs as compiled.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels import _compat
from pallas_kernels.fp4 import matmul as portable
from pallas_kernels.fp4.quantized_tensor import QuantizedTensor
from pallas_kernels.fp4.scale_codecs import E8M0_NAN, decode_e4m3_bytes

_WGMMA_M = 64
_TARGET_CTAS = 264  # two waves' worth of an H200's 132 SMs: K splits are added up to this many CTAs
MAX_M = 64  # "small M": one M tile; larger M runs, one 64-row tile per CTA, but is not what it is for
BLOCK_NS = (64, 128)
SMEM_BYTES = 232448  # an H100/H200 CTA's shared memory (227 KiB), which Mosaic GPU checks at lowering


def smem_bytes(fmt, block_n, num_stages):
    """Shared memory the kernel allocates (barriers aside): per stage x's two [64, R] bf16 tiles and
    the [R, bn] codes and scales; the two bf16 weight tiles; the f32 output tile."""
    r = 4 * (16 if fmt == "nvfp4" else 32)
    return num_stages * (2 * _WGMMA_M * r * 2 + 2 * r * block_n) + 2 * r * block_n * 2 + _WGMMA_M * block_n * 4


def decode_e2m1_minmax(c):
    """int32 codes (low 4 bits read) -> f32 values, equal to ``decode_e2m1`` (signed zeros too), in ~10
    ALU ops instead of ~15: the magnitude of f = code & 7 is max(f/2, f - 2, 2f - 8), exactly."""
    f = (c & 7).astype(jnp.float32)
    mag = jnp.maximum(jnp.maximum(f * 0.5, f - 2.0), f * 2.0 - 8.0)
    return jnp.where((c & 8) != 0, -mag, mag)


def _decode_scale(b, fmt):
    """uint8 block-scale bytes -> f32 (E4M3 for nvfp4, E8M0 for mxfp4), without a bitcast: jax 0.10.2's
    Mosaic GPU has no bitcast rule. exp2 of an integer is exact on the GPU; on CPU it may be 1 ulp off,
    which the product's rounding to bf16 (exact there) removes."""
    if fmt == "nvfp4":
        return decode_e4m3_bytes(b)
    return jnp.where(b == E8M0_NAN, jnp.nan, jnp.exp2((b - 127).astype(jnp.float32)))


def _kernel(xe_ref, xo_ref, w_ref, s_ref, o_ref, scoped, *, fmt, rows, steps, num_stages, interpreted):
    from jax.experimental.pallas import mosaic_gpu as plgpu
    (xe_s, xo_s, w_s, sc_s, lo_s, hi_s, out_s), (bars,) = scoped
    n, m, split = lax.axis_index("n"), lax.axis_index("m"), lax.axis_index("s")
    r, bn = w_s.shape[1], w_s.shape[2]  # R packed rows per step, N tile
    half_bs = r // 8
    n_cols = pl.ds(n * bn, bn)
    m_rows = pl.ds(m * rows, rows)

    def load(ref, layout):
        return ref[...] if interpreted else _compat.mosaic_load(ref, layout)

    def cast(x, layout):
        return x if interpreted else plgpu.layout_cast(x, layout)

    if rows < _WGMMA_M:  # WGMMA's padding rows: zero once, never written by the copies below
        zeros = cast(jnp.zeros((_WGMMA_M, r), xe_s.dtype), plgpu.Layout.WGMMA)
        for slot in range(num_stages):
            xe_s.at[slot][...] = zeros
            xo_s.at[slot][...] = zeros
        plgpu.commit_smem()

    def fetch(step, slot):
        ks = split * steps + step  # the step's index in the whole K
        bar = bars.at[slot]
        plgpu.copy_gmem_to_smem(xe_ref.at[m_rows, pl.ds(ks * r, r)], xe_s.at[slot, pl.ds(0, rows)], bar)
        plgpu.copy_gmem_to_smem(xo_ref.at[m_rows, pl.ds(ks * r, r)], xo_s.at[slot, pl.ds(0, rows)], bar)
        for i in range(half_bs):  # smem rows 8i..8i+7 <- packed rows j*(bs/2) + i, j = 0..7
            plgpu.copy_gmem_to_smem(w_ref.at[ks, :, i, n_cols], w_s.at[slot, pl.ds(8 * i, 8)], bar)
            plgpu.copy_gmem_to_smem(s_ref.at[pl.ds(ks * 8, 8), n_cols], sc_s.at[slot, pl.ds(8 * i, 8)], bar)

    for step in range(min(num_stages - 1, steps)):
        fetch(step, step)

    def scope(acc_ref):
        def body(i, carry):
            slot = lax.rem(i, num_stages)
            nxt = i + num_stages - 1  # its slot was read by step i - 1, which has finished
            pl.when(nxt < steps)(lambda: fetch(nxt, lax.rem(nxt, num_stages)))
            plgpu.barrier_wait(bars.at[slot])
            # 8-bit registers only take bitwise ops in Mosaic GPU: widen to int32 first.
            codes = load(w_s.at[slot], plgpu.Layout.WGMMA).astype(jnp.int32)
            scale = _decode_scale(load(sc_s.at[slot], plgpu.Layout.WGMMA).astype(jnp.int32), fmt)
            lo_s[...] = (decode_e2m1_minmax(codes) * scale).astype(lo_s.dtype)
            hi_s[...] = (decode_e2m1_minmax(codes >> 4) * scale).astype(hi_s.dtype)
            plgpu.commit_smem()
            plgpu.wgmma(acc_ref, xe_s.at[slot], lo_s)
            plgpu.wgmma(acc_ref, xo_s.at[slot], hi_s)
            plgpu.wgmma_wait(0)  # lo_s/hi_s and this slot are rewritten by the next steps
            return carry

        lax.fori_loop(0, steps, body, 0)
        return acc_ref[...]

    out_s[...] = pl.run_scoped(scope, plgpu.ACC((_WGMMA_M, bn), jnp.float32))
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(out_s.at[pl.ds(0, rows)], o_ref.at[split, m_rows, n_cols])
    plgpu.wait_smem_to_gmem(0)


def _swizzle(nbytes):
    return next(s for s in (128, 64, 32) if nbytes % s == 0)


def _transforms(cols, dtype):
    from jax.experimental.pallas import mosaic_gpu as plgpu
    nbytes = cols * jnp.dtype(dtype).itemsize
    swizzle = _swizzle(nbytes)
    return (plgpu.TilingTransform((8, swizzle // jnp.dtype(dtype).itemsize)), plgpu.SwizzleTransform(swizzle))


def pick_tiles(m, n, k, fmt):
    """(block_n, num_splits) for a problem: N tiles of 64 (more CTAs at decode sizes), and K split in
    powers of two while that stays under ``_TARGET_CTAS`` CTAs with >= 4 steps per split."""
    bs = 16 if fmt == "nvfp4" else 32
    block_n = 64
    ctas = -(-n // block_n) * -(-m // _WGMMA_M)
    steps = -(-k // (8 * bs))
    splits = 1
    while ctas * splits * 2 <= _TARGET_CTAS and steps % (splits * 2) == 0 and steps // (splits * 2) >= 4:
        splits *= 2
    return block_n, splits


def _permute_k(xh, bs):
    """x's even (or odd) columns [M, Kp/2] in the kernel's order: within each step of 4*bs, column
    8i + j holds column j*(bs/2) + i."""
    mp, k2 = xh.shape
    return xh.reshape(mp, k2 // (4 * bs), 8, bs // 2).transpose(0, 1, 3, 2).reshape(mp, k2)


@functools.partial(jax.jit, static_argnames=("block_n", "num_splits", "num_stages", "interpret", "out_dtype"))
def _fp4_matmul_mosaic_call(x, w, *, block_n, num_splits, num_stages, interpret, out_dtype):
    from jax.experimental.pallas import mosaic_gpu as plgpu
    (m, k), n = x.shape, w.shape[1]
    bs = w.block_size
    r = 4 * bs  # packed rows per step
    rows = min(_WGMMA_M, portable._roundup(m, 8))
    mp = portable._roundup(m, rows)
    kp = portable._roundup(k, 8 * bs * num_splits)
    np_ = portable._roundup(n, block_n)
    steps = kp // (8 * bs) // num_splits
    xp = jnp.pad(x.astype(jnp.bfloat16), ((0, mp - m), (0, kp - k)))
    xe, xo = _permute_k(xp[:, 0::2], bs), _permute_k(xp[:, 1::2], bs)
    # Pads copy the weights: only when K or N is off the tiles (real layers' are multiples of 256).
    data = w.data if (kp, np_) == (k, n) else jnp.pad(w.data, ((0, (kp - k) // 2), (0, np_ - n)))
    scales = portable._scale_bytes(w)
    scales = scales if (kp, np_) == (k, n) else jnp.pad(scales, ((0, (kp - k) // bs), (0, np_ - n)))
    w4 = data.reshape(kp // (8 * bs), 8, bs // 2, np_)  # a free view: [step, j, i, N] = packed row j*bs/2+i

    def entry(xe_ref, xo_ref, w_ref, s_ref, o_ref):
        x_t, w_t, b_t = (_transforms(r, jnp.bfloat16), _transforms(block_n, jnp.uint8),
                         _transforms(block_n, jnp.bfloat16))
        smem = (plgpu.SMEM((num_stages, _WGMMA_M, r), jnp.bfloat16, transforms=x_t),
                plgpu.SMEM((num_stages, _WGMMA_M, r), jnp.bfloat16, transforms=x_t),
                plgpu.SMEM((num_stages, r, block_n), jnp.uint8, transforms=w_t),
                plgpu.SMEM((num_stages, r, block_n), jnp.uint8, transforms=w_t),
                plgpu.SMEM((r, block_n), jnp.bfloat16, transforms=b_t),
                plgpu.SMEM((r, block_n), jnp.bfloat16, transforms=b_t),
                plgpu.SMEM((_WGMMA_M, block_n), jnp.float32, transforms=_transforms(block_n, jnp.float32)))
        # Per slot and step: x's two tiles, then bs/2 weight slabs and bs/2 scale tiles.
        barriers = (plgpu.Barrier(num_arrivals=2 + bs, num_barriers=num_stages),)
        pl.run_scoped(lambda *s: _kernel(xe_ref, xo_ref, w_ref, s_ref, o_ref, s, fmt=w.fmt, rows=rows,
                                         steps=steps, num_stages=num_stages,
                                         interpreted=_compat.is_mosaic_interpret(interpret)),
                      smem, barriers)

    partial = plgpu.kernel(
        entry,
        out_type=jax.ShapeDtypeStruct((num_splits, mp, np_), jnp.float32),
        grid=(np_ // block_n, mp // rows, num_splits),
        grid_names=("n", "m", "s"),
        compiler_params=_compat.mosaic_params(lowering_semantics=plgpu.LoweringSemantics.Lane),
        interpret=interpret,
    )(xe, xo, w4, scales)
    out = partial.sum(axis=0) if num_splits > 1 else partial[0]
    return (out[:m, :n] * w.tensor_scale.astype(jnp.float32)).astype(out_dtype)


def check_supported(x, w: QuantizedTensor, *, block_n=None, num_splits=None, num_stages=2):
    """Raises ValueError, naming the argument and its value, for what the Mosaic kernel does not take."""
    portable._validate(x, w, None, "bfloat16")
    if block_n is not None and block_n not in BLOCK_NS:
        raise ValueError(f"fp4_matmul_mosaic: block_n must be one of {BLOCK_NS}, got {block_n!r}")
    if num_splits is not None and (not isinstance(num_splits, int) or num_splits < 1):
        raise ValueError(f"fp4_matmul_mosaic: num_splits must be an int >= 1, got {num_splits!r}")
    if not isinstance(num_stages, int) or not 2 <= num_stages <= 4:
        raise ValueError(f"fp4_matmul_mosaic: num_stages must be 2, 3 or 4, got {num_stages!r}")
    need = smem_bytes(w.fmt, block_n or 64, num_stages)
    if need > SMEM_BYTES:
        raise ValueError(f"fp4_matmul_mosaic: num_stages={num_stages} with block_n={block_n or 64} for {w.fmt} "
                         f"needs {need} bytes of shared memory, over {SMEM_BYTES}; use fewer stages")


def fp4_matmul_mosaic(x, w: QuantizedTensor, *, interpret=None, block_n=None, num_splits=None, num_stages=2,
                      out_dtype=None):
    """EXPERIMENTAL (never run on a GPU): x[..., K] @ w[K, N] (nvfp4/mxfp4 along K) on Hopper via Mosaic GPU.

    Products in bf16 (x is rounded to bf16 when given f32/f16; the weights are exact in bf16), float32
    accumulation; meant for M = rows of x <= 64 (decode). interpret: None compiles on GPU and runs Mosaic
    GPU's CPU interpreter elsewhere (slow: correctness only); or pass ``plgpu.InterpretGPUParams(...)`` /
    False. block_n (64 | 128) and num_splits (of K) default to ``pick_tiles``; num_stages: the K pipeline.
    """
    x = jnp.asarray(x)
    check_supported(x, w, block_n=block_n, num_splits=num_splits, num_stages=num_stages)
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    auto_n, auto_splits = pick_tiles(x2.shape[0], w.shape[1], k, w.fmt)
    if interpret is None and jax.default_backend() != "gpu":
        interpret = _compat.mosaic_interpret_params()
    elif interpret is False:
        interpret = None
    out = _fp4_matmul_mosaic_call(x2, w, block_n=block_n or auto_n, num_splits=num_splits or auto_splits,
                                  num_stages=num_stages, interpret=interpret,
                                  out_dtype=jnp.dtype(out_dtype or x.dtype))
    return out.reshape(lead + (w.shape[1],))
