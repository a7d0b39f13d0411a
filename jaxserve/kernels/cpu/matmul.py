"""Weight-only matmuls for decoding on CPU, as XLA FFI custom calls (``matmul.cc``), with references.

M rows, K contracted, N outputs. The kernels read the weights as stored, float32, bf16 or packed FP4
with their block scales, and sum in float32; they pay where XLA:CPU's dot does not stream the weights
at memory bandwidth: a few rows (decoding; ``MAX_ROWS``). Above that XLA's dot stays.

- ``bf16_matmul(x f32/bf16[M, K], w bf16[K, N]) -> f32[M, N]``; ``transpose_w=True``: w bf16[N, K]
  (a tied embedding read as the LM head).
- ``f32_matmul(x f32[M, K], w f32[K, N]) -> f32[M, N]``, ``transpose_w`` likewise: float32 FMAs, x as it is.
- ``fp4_matmul_cpu(x [..., K], w QuantizedTensor nvfp4/mxfp4 [K, N] along K) -> [..., N]``; w [N, K] along K
  (axis 1): x @ w^T (a quantized tied embedding as the LM head).
- ``f32_gemm(x f32[M, K], w f32[K, N])``, ``transpose_w`` likewise: the same product for many rows (batched decode,
  prefill), by OpenBLAS's sgemm (``build.load_blas``), where XLA:CPU's float32 dot is compute-bound and slower.
- ``bf16_gemm(x, w bf16[K, N])``, ``transpose_w`` likewise: ``bf16_matmul``'s product for many rows on Intel AMX tiles
  (``amx.cc``), where the CPU has them (``amx_usable()``; ``JAXSERVE_CPU_AMX=0`` turns only it off). Weights packed
  once (``packed.py``) run on the tiles or, without them, on float32 FMAs (``packed_impl()``).

``usable()`` says whether to route to them at trace time: the CPU backend with one device (XLA
cannot partition a custom call over a mesh), the library built and loaded (``build.load``), and
``JAXSERVE_CPU_KERNELS`` not set to 0/off/false. ``JAXSERVE_CPU_KERNEL_THREADS`` caps the threads
a call uses (default: the CPUs this process may run on). ``blas_usable()`` says the same for ``f32_gemm``, which
also needs OpenBLAS loaded (``build.load_blas``) and ``JAXSERVE_CPU_BLAS`` not 0/off/false (turning only it off).
The choice is made when a function is
traced: a jitted function keeps the path it was traced with.
"""
from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp

from jaxserve.kernels.cpu import build

MAX_ROWS = 16
ENV_SWITCH = "JAXSERVE_CPU_KERNELS"
ENV_THREADS = "JAXSERVE_CPU_KERNEL_THREADS"
BLAS_SWITCH = "JAXSERVE_CPU_BLAS"
AMX_SWITCH = "JAXSERVE_CPU_AMX"
FP4_FORMATS = {"nvfp4": 0, "mxfp4": 1}  # -> the kernel's scale_kind (E4M3 / E8M0 scale bytes)


def enabled(switch: str = ENV_SWITCH) -> bool:
    """False when the environment variable ``switch`` (default ``JAXSERVE_CPU_KERNELS``) is 0, off, false or no."""
    return os.environ.get(switch, "1").strip().lower() not in ("0", "off", "false", "no")


def usable() -> bool:
    """Whether traced matmuls should go to the kernels now (see the module docstring)."""
    return (enabled() and jax.default_backend() == "cpu" and jax.device_count() == 1
            and build.load() is not None)


def blas_usable() -> bool:
    """Whether traced float32 matmuls of many rows should go to ``f32_gemm`` now: ``usable()``, ``JAXSERVE_CPU_BLAS``
    not 0/off/false/no, and OpenBLAS loaded."""
    return usable() and enabled(BLAS_SWITCH) and build.load_blas() is not None


def amx_usable() -> bool:
    """Whether traced bf16 matmuls of many rows should go to ``bf16_gemm`` (AMX tiles) now: ``usable()``,
    ``JAXSERVE_CPU_AMX`` not 0/off/false/no, a library built for a CPU with AMX-BF16, and Linux granting the process
    the tile state (asked once)."""
    return usable() and enabled(AMX_SWITCH) and amx_granted()


def packed_impl() -> str | None:
    """How traced GEMMs on packed bf16 weights (``packed.bf16_gemm_packed``) run now: "amx" (``amx_usable()``), "fma"
    (float32 FMAs, ``packed_fma.h``: a CPU without AMX, or ``JAXSERVE_CPU_AMX`` off, with the kernels ``usable()``), or
    None (no kernels: the engine keeps its weights unpacked)."""
    if amx_usable():
        return "amx"
    return "fma" if usable() else None


@functools.lru_cache(maxsize=None)
def amx_granted() -> bool:
    """Whether the library has the AMX kernels and Linux granted this process the tile state (asked once; needs
    the library loaded)."""
    return bool(build.load().jaxserve_amx_enable())


def vnni_usable() -> bool:
    """Whether the VNNI kernels (``fp4_w4a8_matmul_cpu``, ``int8_head``) can run now: ``usable()`` and a library
    built with AVX-512 VNNI."""
    return usable() and _vnni_built()


@functools.lru_cache(maxsize=None)
def _vnni_built() -> bool:
    return bool(build.load().jaxserve_vnni_available())


def default_threads() -> int:
    if os.environ.get(ENV_THREADS):
        return max(1, int(os.environ[ENV_THREADS]))
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _check_2d(name, x, w, k_axis):
    if x.ndim != 2 or w.ndim != 2:
        raise ValueError(f"{name}: x and w must be 2-D, got x{x.shape} and w{w.shape}")
    if x.shape[1] != w.shape[k_axis]:
        raise ValueError(f"{name}: x{x.shape} and w{w.shape} disagree on K")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"{name}: x must be floating point, got {x.dtype}")


def bf16_matmul(x: jax.Array, w: jax.Array, *, transpose_w: bool = False, threads: int | None = None) -> jax.Array:
    """x f32/bf16/f16[M, K] @ w bf16[K, N] (``transpose_w``: w bf16[N, K]) -> f32[M, N], float32 sums.

    x is rounded to bf16 (the operands XLA's bf16 dot multiplies). Differentiable (the JVP uses XLA's dot);
    under vmap the call runs once per batch element."""
    return _weight_matmul("bf16_matmul", jnp.bfloat16, x, w, transpose_w, threads)


def f32_matmul(x: jax.Array, w: jax.Array, *, transpose_w: bool = False, threads: int | None = None) -> jax.Array:
    """x f32/bf16/f16[M, K] @ w f32[K, N] (``transpose_w``: w f32[N, K]) -> f32[M, N]: float32 FMAs of x as it
    is (converted to float32, which is exact), so XLA's float32 dot up to the summation order. Differentiable
    and vmappable as ``bf16_matmul``."""
    return _weight_matmul("f32_matmul", jnp.float32, x, w, transpose_w, threads)


def f32_gemm(x: jax.Array, w: jax.Array, *, transpose_w: bool = False, threads: int | None = None) -> jax.Array:
    """``f32_matmul`` by OpenBLAS's sgemm (``build.load_blas``), for many rows: x converted to float32, float32 sums
    (XLA's float32 dot up to the summation order). N is split into ``threads`` column blocks, each a one-thread
    sgemm on XLA's intra-op pool. Differentiable and vmappable as ``bf16_matmul``."""
    return _weight_matmul("f32_gemm", jnp.float32, x, w, transpose_w, threads, op="gemm")


def bf16_gemm(x: jax.Array, w: jax.Array, *, transpose_w: bool = False, threads: int | None = None) -> jax.Array:
    """``bf16_matmul`` on Intel AMX tiles (``amx.cc``), for many rows: x rounded to bf16, exact products summed in
    float32 by the tiles (their own order and roundings: equal to ``bf16_matmul`` to float32 rounding, not bits; a
    row's result does not depend on the other rows or the threads). Needs ``amx_usable()``. Differentiable and
    vmappable as ``bf16_matmul``."""
    return _weight_matmul("bf16_gemm", jnp.bfloat16, x, w, transpose_w, threads, op="gemm")


def _weight_matmul(name, w_dtype, x, w, transpose_w, threads, op="matmul"):
    x, w = jnp.asarray(x), jnp.asarray(w)
    _check_2d(name, x, w, 1 if transpose_w else 0)
    if w.dtype != w_dtype:
        raise ValueError(f"{name}: w must be {jnp.dtype(w_dtype).name}, got {w.dtype}")
    if build.load() is None:
        raise RuntimeError(f"{name}: the CPU kernels are unavailable (see the logged warning)")
    if op == "gemm" and w_dtype == jnp.bfloat16 and not amx_granted():
        raise RuntimeError(f"{name}: AMX tiles are unavailable (a CPU without AMX-BF16, or Linux refused them)")
    if op == "gemm" and w_dtype == jnp.float32 and build.load_blas() is None:
        raise RuntimeError(f"{name}: OpenBLAS is unavailable (see the logged warning)")
    return _matmul(x.astype(jnp.float32), w, transpose_w, threads or default_threads(), op)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3, 4))
def _matmul(x, w, transpose_w, threads, op):
    n = w.shape[0] if transpose_w else w.shape[1]
    target = f"jaxserve_{'bf16' if w.dtype == jnp.bfloat16 else 'f32'}_{op}_{'nk' if transpose_w else 'kn'}"
    call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((x.shape[0], n), jnp.float32), vmap_method="sequential")
    return call(x, w, threads=threads)


@_matmul.defjvp
def _matmul_jvp(transpose_w, threads, op, primals, tangents):
    (x, w), (dx, dw) = primals, tangents
    wf = lambda a: a.astype(jnp.float32).T if transpose_w else a.astype(jnp.float32)  # noqa: E731
    y = _matmul(x, w, transpose_w, threads, op)
    return y, jnp.dot(dx, wf(w)) + jnp.dot(x, wf(dw))


def bf16_matmul_reference(x, w, *, transpose_w: bool = False):
    """What ``bf16_matmul`` (with x already bf16) and ``f32_matmul`` compute, with XLA's dot: float32 operands,
    float32 result."""
    w = jnp.asarray(w).astype(jnp.float32)
    return jnp.dot(jnp.asarray(x).astype(jnp.float32), w.T if transpose_w else w,
                   precision=jax.lax.Precision.HIGHEST)


def _scale_bytes(w) -> jax.Array:
    """w's block scales as the FP4 kernels take them: u8 (E8M0) or float8_e4m3fn (NVFP4) as stored, their bytes read
    in place (a bitcast to u8 in the graph would be a copy per call); any other 1-byte dtype bitcast."""
    if w.scales.dtype in (jnp.uint8, jnp.float8_e4m3fn):
        return w.scales
    return jax.lax.bitcast_convert_type(w.scales, jnp.uint8)


def fp4_matmul_cpu(x: jax.Array, w, *, out_dtype=None, threads: int | None = None) -> jax.Array:
    """x f32/bf16/f16[..., K] @ w -> out_dtype[..., N]: w a QuantizedTensor (fmt nvfp4/mxfp4) of shape [K, N]
    quantized along K (axis 0), or of shape [N, K] quantized along K (axis 1: a tied embedding read as the LM head,
    x @ w^T; block sizes dividing 128).

    The codes are decoded to their exact E2M1 values and the scale bytes to exactly the scales
    ``dequantize(w)`` uses; sums in float32 (``fp4_matmul_reference`` up to rounding and summation order:
    with AVX-512, float32 x multiplies the dequantized weight and bf16 x is summed per block with exact bf16
    products, then scaled; with AVX2, any x is summed per block, then scaled; [N, K]: AVX-512 sums pairs of
    products, then scales them). out_dtype defaults to x's dtype."""
    from pallas_kernels.fp4 import QuantizedTensor
    x = jnp.asarray(x)
    if not isinstance(w, QuantizedTensor) or w.fmt not in FP4_FORMATS:
        raise ValueError(f"fp4_matmul_cpu needs an nvfp4/mxfp4 QuantizedTensor, got {getattr(w, 'fmt', type(w))!r}")
    if len(w.shape) != 2 or w.axis not in (0, 1) or (w.axis == 1 and 128 % w.block_size):
        raise ValueError(f"fp4_matmul_cpu needs a 2-D weight quantized along axis 0, or along axis 1 in blocks "
                         f"dividing 128, got shape {w.shape} axis {w.axis} block size {w.block_size}")
    k, n = w.shape[::-1] if w.axis == 1 else w.shape
    if x.ndim < 1 or x.shape[-1] != k:
        raise ValueError(f"fp4_matmul_cpu: x{x.shape} does not contract with w{w.shape} (axis {w.axis})")
    if build.load() is None:
        raise RuntimeError("fp4_matmul_cpu: the CPU kernels are unavailable (see the logged warning)")
    call = jax.ffi.ffi_call(f"jaxserve_fp4_matmul_{'nk' if w.axis == 1 else 'kn'}",
                            jax.ShapeDtypeStruct((x.size // k, n), jnp.float32), vmap_method="sequential")
    y = call(x.reshape(-1, k).astype(jnp.float32), w.data, _scale_bytes(w),
             jnp.asarray(w.tensor_scale, jnp.float32).reshape(()), block_size=w.block_size,
             scale_kind=FP4_FORMATS[w.fmt], x_bf16=int(x.dtype == jnp.bfloat16), threads=threads or default_threads())
    return y.reshape(*x.shape[:-1], n).astype(out_dtype or x.dtype)


def fp4_w4a8_matmul_cpu(x: jax.Array, w, *, out_dtype=None, threads: int | None = None) -> jax.Array:
    """x f32/bf16/f16[..., K] @ w (nvfp4/mxfp4 QuantizedTensor [K, N] along K, blocks of 4 .. 64, a multiple of 4) with x
    quantized to int8 on w's blocks (W4A8, ``jaxserve.quant.w4a8``) -> out_dtype[..., N] (default x's dtype), on
    AVX-512 VNNI (``vnni.cc``): each block's products summed exactly in integers, the blocks' sums scaled and summed
    in float32, so ``w4a8_matmul_reference`` up to float32 rounding. Needs ``vnni_usable()``."""
    from pallas_kernels.fp4 import QuantizedTensor
    x = jnp.asarray(x)
    if (not isinstance(w, QuantizedTensor) or w.fmt not in FP4_FORMATS or len(w.shape) != 2 or w.axis != 0
            or w.block_size % 4 or w.block_size > 64):
        raise ValueError(f"fp4_w4a8_matmul_cpu needs a 2-D nvfp4/mxfp4 QuantizedTensor along axis 0 in blocks of a "
                         f"multiple of 4 up to 64, got {getattr(w, 'fmt', type(w))!r} shape {getattr(w, 'shape', None)} "
                         f"axis {getattr(w, 'axis', None)} block size {getattr(w, 'block_size', None)}")
    k, n = w.shape
    if x.ndim < 1 or x.shape[-1] != k:
        raise ValueError(f"fp4_w4a8_matmul_cpu: x{x.shape} does not contract with w{w.shape}")
    if not vnni_usable():
        raise RuntimeError("fp4_w4a8_matmul_cpu: the kernel is unavailable (the CPU kernels not built, or no "
                           "AVX-512 VNNI)")
    call = jax.ffi.ffi_call("jaxserve_fp4_w4a8_matmul_kn", jax.ShapeDtypeStruct((x.size // k, n), jnp.float32),
                            vmap_method="sequential")
    y = call(x.reshape(-1, k).astype(jnp.float32), w.data, _scale_bytes(w),
             jnp.asarray(w.tensor_scale, jnp.float32).reshape(()), block_size=w.block_size,
             scale_kind=FP4_FORMATS[w.fmt], threads=threads or default_threads())
    return y.reshape(*x.shape[:-1], n).astype(out_dtype or x.dtype)
