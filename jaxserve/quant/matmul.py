"""The quantized matmul, chosen without touching model code: a Flax method interceptor.

Inside ``with use_quantized_matmul(impl):`` (or a function wrapped by ``quantized_apply``), every
``nn.Dense.__call__`` whose ``kernel`` param is a ``QuantizedTensor`` computes
``quantized_matmul(x, kernel) + bias`` instead of ``x @ kernel``; Dense layers holding float
kernels, and everything else, run unchanged. The interceptor reads the kernel with
``get_variable`` before Dense would, because ``Dense.__call__`` goes through ``self.param``, which
checks the stored leaves against the float kernel's shape and so rejects a QuantizedTensor
(``ScopeParamShapeError``): quantized params outside the context fail loudly, never silently.

Likewise an ``nn.Embed`` whose ``embedding`` is a QuantizedTensor ([V, E] along E: ``quantize_params(lm_head=True)``
for a tied head): its ``setup`` keeps the QuantizedTensor as ``embedding``, ``__call__`` (the lookup) gathers and
dequantizes the looked-up rows only, and ``attend`` (the tied LM head) is ``quantized_matmul`` of the transposed
table (``tied_matmul``). One device only.

On a device mesh (a model module above the Dense carries a ``layout``), the quantized matmul runs per shard
inside ``shard_map``, each device on its slice of the kernel (``jaxserve.quant.sharded``).

The choice happens when the model is traced. Under ``jax.jit`` enter the context inside the jitted
function (wrap before jitting: ``jax.jit(quantized_apply(forward, ...))``): the settings are not
part of jit's cache key, so one jitted function called under two different settings with params of
the same structure would reuse the first trace.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import threading

import flax.linen as nn
import jax
import jax.numpy as jnp

from pallas_kernels import _compat
from pallas_kernels.fp4 import QuantizedTensor, dequantize, fp4_matmul, fp4_matmul_mosaic, fp4_matmul_reference

IMPLS = ("auto", "pallas", "mosaic", "reference")
KERNEL_FORMATS = ("nvfp4", "mxfp4")  # formats the Pallas kernels read; fp8/int4 dequantize then dot
_CPU_MAX_ROWS = 16  # jaxserve.kernels.cpu.MAX_ROWS: rows of x per call of the tied head's kernel
# Weight-only Dense layers run the CPU FP4 kernel (it decodes the weight once per 16 rows) up to this many rows,
# the dequantize-then-dot reference above: on the AMX Xeon VM, ms per matmul (nvfp4, bf16 x, 8 distinct weights):
# 576 x 1536 at 64 rows 0.77 vs 1.26, at 128 rows 1.44 vs 1.65, at 256 rows 3.01 vs 2.57; 1536 x 576 at 64 rows
# 0.94 vs 1.01, at 96 rows 1.39 vs 1.05
_FP4_KERNEL_MAX_ROWS = 64


@dataclasses.dataclass(frozen=True)
class MatmulSettings:
    impl: str = "auto"            # "pallas" | "mosaic" | "reference" | "auto" (see ``kernel_for``)
    w4a4: bool = False            # also fake-quantize activations to the weight's format
    interpret: bool | None = None  # Pallas interpret mode; None: on CPU only
    precision: str = "float32"    # Pallas products in "float32" or "bfloat16" (f32 accumulation either way)
    # activations quantized to int8 on the weight's blocks (jaxserve.quant.w4a8): the CPU VNNI kernel for few rows,
    # the reference (emulation) elsewhere; Dense kernels only (a quantized tied head stays weight-only)
    w4a8: bool = False

    def __post_init__(self):
        if self.impl not in IMPLS:
            raise ValueError(f"quantized matmul impl must be one of {IMPLS}, got {self.impl!r}")
        if self.w4a4 and self.w4a8:
            raise ValueError("quantized matmul: w4a4=True and w4a8=True exclude each other")
        if self.impl in ("mosaic", "pallas") and self.w4a8:
            raise ValueError(f"quantized matmul impl={self.impl!r} has no W4A8 (w4a8=True); use 'auto' (the CPU "
                             f"kernel) or 'reference'")
        if self.impl == "mosaic" and self.w4a4:
            raise ValueError("quantized matmul impl='mosaic' has no W4A4 emulation (w4a4=True); "
                             "use impl='pallas' for it")


def kernel_for(x_dtype, w: QuantizedTensor, settings: MatmulSettings, backend: str | None = None,
               hopper: bool | None = None, cpu_kernel: bool | None = None) -> str:
    """Which matmul ``quantized_matmul`` runs: "cpu" | "mosaic" | "triton" | "portable" | "reference".

    - "reference" (dequantize, then a float32 dot): impl="reference", fp8/int4 weights under any impl,
      and impl="auto" on CPU where the CPU kernel is not usable (or W4A4 is asked for); W4A8 off the CPU.
    - "cpu" (``jaxserve.kernels.cpu.fp4_matmul_cpu``, an AVX-512 or AVX2 XLA FFI call that decodes the packed
      weight in registers; with w4a8, ``fp4_w4a8_matmul_cpu``, AVX-512 VNNI): impl="auto" on CPU when ``cpu_kernel`` (default: ``jaxserve.kernels.cpu.usable()``,
      off with ``JAXSERVE_CPU_KERNELS=0``); ``quantized_matmul`` uses it for up to 64 rows of x (decoding, a
      batch of 64, a short prefill) and the reference for more (W4A8: for any rows).
    - "mosaic" (``fp4_matmul_mosaic``, Mosaic GPU; its CPU interpreter off a GPU): impl="mosaic"; and
      impl="pallas"/"auto" on a Hopper GPU wherever the Mosaic kernel computes what was asked: bf16
      products (x in bf16, where they are exact, or precision="bfloat16"), no W4A4 emulation, no
      explicit interpret mode.
    - "triton" (the portable Pallas kernel, compiled through Triton): impl="pallas"/"auto" on a GPU
      where Mosaic cannot: W4A4, float32 products of f32/f16 activations, a GPU other than Hopper,
      or a backend that is neither CPU nor GPU (the portable kernel, as before Mosaic).
    - "portable" (that kernel in Pallas interpret mode): impl="pallas" on CPU, or interpret=True.
    """
    backend = jax.default_backend() if backend is None else backend
    if settings.impl == "reference" or w.fmt not in KERNEL_FORMATS or (settings.w4a8 and backend != "cpu"):
        return "reference"
    if settings.impl == "mosaic":
        return "mosaic"
    if backend == "cpu":
        if settings.impl != "auto":
            return "portable"
        if cpu_kernel is None:
            from jaxserve.kernels import cpu
            cpu_kernel = cpu.vnni_usable() if settings.w4a8 else cpu.usable()
        return "cpu" if cpu_kernel and not settings.w4a4 and not settings.interpret else "reference"
    if settings.interpret:
        return "portable"
    hopper = _compat.is_hopper_gpu() if hopper is None else hopper
    bf16_products = jnp.dtype(x_dtype) == jnp.bfloat16 or settings.precision == "bfloat16"
    if backend == "gpu" and hopper and bf16_products and not settings.w4a4:
        return "mosaic"
    return "triton"


def quantized_matmul(x: jax.Array, w: QuantizedTensor, settings: MatmulSettings = MatmulSettings(),
                     out_dtype=None) -> jax.Array:
    """x[..., K] (f32/bf16/f16) @ w[K, N] (QuantizedTensor along K) -> out_dtype[..., N] (default x.dtype).

    The kernel is chosen by ``kernel_for``: on a Hopper GPU "pallas"/"auto" run the Mosaic GPU kernel
    where it applies, else the portable (Triton) one; on CPU "auto" runs the AVX-512 or AVX2 FFI kernel for a
    few rows (decoding) where it is usable, else the reference.
    """
    if (settings.w4a4 or settings.w4a8) and w.fmt not in KERNEL_FORMATS:
        raise ValueError(f"{'w4a4 emulation' if settings.w4a4 else 'w4a8'} applies to {KERNEL_FORMATS} weights, "
                         f"got fmt={w.fmt!r}")
    x = jnp.asarray(x)
    kernel = kernel_for(x.dtype, w, settings)
    if settings.w4a8:
        # the kernel takes any rows (a prefill too: each block decoded once per 64 rows)
        if kernel == "cpu" and len(w.shape) == 2 and w.axis == 0 and w.block_size % 4 == 0 and w.block_size <= 64:
            from jaxserve.kernels.cpu import fp4_w4a8_matmul_cpu
            return fp4_w4a8_matmul_cpu(x, w, out_dtype=out_dtype)
        from jaxserve.quant.w4a8 import w4a8_matmul_reference
        return w4a8_matmul_reference(x, w, out_dtype=out_dtype)
    if kernel == "cpu" and len(w.shape) == 2 and w.axis == 0 and math.prod(x.shape[:-1]) <= _FP4_KERNEL_MAX_ROWS:
        from jaxserve.kernels.cpu import fp4_matmul_cpu
        return fp4_matmul_cpu(x, w, out_dtype=out_dtype)
    if kernel == "mosaic":
        return fp4_matmul_mosaic(x, w, out_dtype=out_dtype)
    if kernel in ("triton", "portable"):
        return fp4_matmul(x, w, interpret=settings.interpret, w4a4=settings.w4a4,
                          precision=settings.precision, out_dtype=out_dtype)
    return fp4_matmul_reference(x, w, w4a4=settings.w4a4, out_dtype=out_dtype)


_state = threading.local()


def current_settings() -> MatmulSettings | None:
    """The innermost active ``use_quantized_matmul`` settings, or None outside any."""
    stack = getattr(_state, "stack", [])
    return stack[-1] if stack else None


def _layout_of(module: nn.Module):
    """The device layout of the model ``module`` is part of: its nearest ancestor's ``layout`` attribute
    (``jaxserve.models.transformer`` passes one down its modules), or None for one device."""
    m = module.parent
    while isinstance(m, nn.Module):
        if getattr(m, "layout", None) is not None:
            return m.layout
        m = m.parent
    return None


def _dense_interceptor(next_fun, args, kwargs, context):
    m = context.module
    if (context.method_name != "__call__" or not isinstance(m, nn.Dense)
            or not m.has_variable("params", "kernel")):
        return next_fun(*args, **kwargs)
    kernel = m.get_variable("params", "kernel")
    if not isinstance(kernel, QuantizedTensor):
        return next_fun(*args, **kwargs)
    x = args[0] if args else kwargs["inputs"]
    if kernel.shape != (x.shape[-1], m.features):
        raise ValueError(f"{'/'.join(m.scope.path)}: quantized kernel of shape {kernel.shape} does not fit "
                         f"inputs {x.shape} -> {m.features} features")
    dtype = m.dtype or jnp.result_type(x.dtype, jnp.dtype(kernel.dtype))
    layout = _layout_of(m)
    if layout is None:
        y = quantized_matmul(x.astype(dtype), kernel, current_settings(), out_dtype=dtype)
    else:  # per shard, split as the rule table placed the kernel (GSPMD would gather it for the kernel call)
        from jaxserve.quant.sharded import sharded_quantized_matmul
        path = "/".join(m.scope.path) + "/kernel"
        y = sharded_quantized_matmul(quantized_matmul, x.astype(dtype), kernel, current_settings(), layout, path,
                                     out_dtype=dtype)
    if m.use_bias:
        y = y + m.get_variable("params", "bias").astype(dtype)
    return y


def tied_matmul(x: jax.Array, e: QuantizedTensor, settings: MatmulSettings = MatmulSettings(),
                out_dtype=None) -> jax.Array:
    """x[..., E] @ e^T, e a QuantizedTensor [V, E] along E (a tied embedding as the LM head) -> out_dtype[..., V]
    (default x.dtype): where ``kernel_for`` picks "cpu", the CPU FFI kernel (``fp4_matmul_cpu``'s [N, K] layout),
    16 rows of x a call (a prefill too: no dequantized copy of the table); else dequantize, then a float32 dot."""
    x = jnp.asarray(x)
    settings = dataclasses.replace(settings, w4a8=False)  # W4A8 is for Dense kernels: a tied head stays weight-only
    if kernel_for(x.dtype, e, settings) == "cpu" and 128 % e.block_size == 0:
        from jaxserve.kernels.cpu import fp4_matmul_cpu
        x2 = x.reshape(-1, x.shape[-1])
        parts = [fp4_matmul_cpu(x2[i:i + _CPU_MAX_ROWS], e, out_dtype=out_dtype)
                 for i in range(0, max(x2.shape[0], 1), _CPU_MAX_ROWS)]
        y = parts[0] if len(parts) == 1 else jnp.concatenate(parts)
        return y.reshape(*x.shape[:-1], e.shape[0])
    y = jnp.dot(x.astype(jnp.float32), dequantize(e, jnp.float32).T, precision=jax.lax.Precision.HIGHEST)
    return y.astype(out_dtype or x.dtype)


def embedding_rows(e: QuantizedTensor, ids: jax.Array, dtype) -> jax.Array:
    """e[ids] dequantized: ids int[...] -> dtype[..., E], from the gathered codes and scales rows of e [V, E] (along
    E) only."""
    flat = ids.reshape(-1)
    rows = dataclasses.replace(e, data=jnp.take(e.data, flat, axis=0), scales=jnp.take(e.scales, flat, axis=0),
                               shape=(flat.shape[0], e.shape[1]))
    return dequantize(rows, dtype).reshape(*ids.shape, e.shape[1])


def _embed_interceptor(next_fun, args, kwargs, context):
    m = context.module
    table = m.get_variable("params", "embedding")
    if _layout_of(m) is not None:
        raise ValueError(f"{'/'.join(m.scope.path)}: a quantized embedding (quantize_lm_head) runs on one device only")
    if context.method_name == "setup":  # nn.Embed.setup's param check would reject the QuantizedTensor
        object.__setattr__(m, "embedding", table)
        return None
    if context.method_name == "__call__":
        ids = args[0] if args else kwargs["inputs"]
        return embedding_rows(table, jnp.asarray(ids), m.dtype or table.dtype)
    if context.method_name == "attend":
        x = args[0] if args else kwargs["query"]
        dtype = m.dtype or jnp.result_type(x.dtype, jnp.dtype(table.dtype))
        return tied_matmul(x.astype(dtype), table, current_settings(), out_dtype=dtype)
    return next_fun(*args, **kwargs)


def _interceptor(next_fun, args, kwargs, context):
    """Dense layers with QuantizedTensor kernels, and Embeds with a QuantizedTensor table, to the quantized paths."""
    m = context.module
    if isinstance(m, nn.Embed) and m.has_variable("params", "embedding") and isinstance(
            m.get_variable("params", "embedding"), QuantizedTensor):
        return _embed_interceptor(next_fun, args, kwargs, context)
    return _dense_interceptor(next_fun, args, kwargs, context)


@contextlib.contextmanager
def use_quantized_matmul(impl: str = "auto", *, w4a4: bool = False, interpret: bool | None = None,
                         precision: str = "float32", w4a8: bool = False):
    """Within this context, Dense layers with QuantizedTensor kernels run ``quantized_matmul``.

    Nested contexts: the innermost settings apply. Thread-local, like Flax's interceptor stack.
    """
    settings = MatmulSettings(impl, w4a4, interpret, precision, w4a8)
    stack = _state.__dict__.setdefault("stack", [])
    outermost = not stack
    stack.append(settings)
    try:
        if outermost:
            with nn.intercept_methods(_interceptor):
                yield settings
        else:
            yield settings
    finally:
        stack.pop()


def matmul_context(settings: MatmulSettings | None):
    """``use_quantized_matmul`` with ``settings``, or a no-op context for None (unquantized models)."""
    if settings is None:
        return contextlib.nullcontext()
    return use_quantized_matmul(settings.impl, w4a4=settings.w4a4, interpret=settings.interpret,
                                precision=settings.precision, w4a8=settings.w4a8)


def quantized_apply(fn, impl: str = "auto", *, w4a4: bool = False, interpret: bool | None = None,
                    precision: str = "float32", w4a8: bool = False):
    """``fn`` wrapped to run inside ``use_quantized_matmul(...)``; jit the result, not the other way round."""
    MatmulSettings(impl, w4a4, interpret, precision, w4a8)  # validate now, not at the first call

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with use_quantized_matmul(impl, w4a4=w4a4, interpret=interpret, precision=precision, w4a8=w4a8):
            return fn(*args, **kwargs)

    return wrapped
