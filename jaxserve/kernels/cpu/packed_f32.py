"""float32 Dense kernels packed once into 32-column groups, and the GEMM that reads them (``amx.cc``'s
``jaxserve_f32_gemm_packed``, ``packed_fma.h``'s ``gemm_packed_f32``): a float32 model's Dense layers in an engine on
a CPU with the kernels, at every row count.

Without it a float32 layer runs XLA's gemv at one row, ``f32_matmul`` at 2-16 rows and OpenBLAS's sgemm above
(``jaxserve.layers.f32_dot``): three summation orders, and sgemm packs the whole weight into its own panels on every
call, which at decode's 64 rows costs about what its FMAs do. The packed GEMM streams each 32-column group once per
call while every block of up to 12 rows (AVX-512; 2 with AVX2) holds its sums in registers, and each output is
float32 fused multiply-adds over k = 0, 1, .., K - 1 in that order from 0: a row gets the same bits alone or in any
batch, with 1 or more threads (the property bf16's ``PackedBf16`` gives a bf16 model).

Layout: ``data`` f32[ceil(N / 32), K * 32]; row g holds, for each k in order, the 32 columns [32 g, 32 g + 32) of w;
zeros pad N.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jaxserve.kernels.cpu import build
from jaxserve.kernels.cpu.matmul import default_threads

GROUP = 32  # columns of w per packed row (two AVX-512 vectors)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PackedF32:
    """A float32 [K, N] weight packed for ``f32_gemm_packed`` (see the module docstring): ``shape`` is the weight's."""
    data: jax.Array                                      # f32[ceil(N / 32), K * 32]
    shape: tuple[int, int] = dataclasses.field(metadata=dict(static=True))

    def unpack(self) -> jax.Array:
        """The [K, N] weight back, bit for bit."""
        k, n = self.shape
        g = self.data.shape[0]
        return self.data.reshape(g, k, GROUP).transpose(1, 0, 2).reshape(k, g * GROUP)[:, :n]

    def columns(self, ids: jax.Array) -> jax.Array:
        """Columns ``ids`` i32[...] of the [K, N] weight as rows f32[..., K], bit for bit (a packed tied embedding's
        lookup: ``packed.pack_tied_head``)."""
        k, _ = self.shape
        flat = ids.reshape(-1)
        rows = self.data.reshape(self.data.shape[0], k, GROUP)[flat // GROUP, :, flat % GROUP]  # [T, K]
        return rows.reshape(*ids.shape, k)


def pack_f32(w) -> PackedF32:
    """w f32[K, N] -> ``PackedF32``. Jittable; exact."""
    w = jnp.asarray(w)
    if w.ndim != 2 or w.dtype != jnp.float32:
        raise ValueError(f"pack_f32: w must be float32 [K, N], got {w.dtype}{tuple(w.shape)}")
    k, n = w.shape
    g = -(-n // GROUP)
    w = jnp.pad(w, ((0, 0), (0, g * GROUP - n)))
    return PackedF32(w.reshape(k, g, GROUP).transpose(1, 0, 2).reshape(g, k * GROUP), (k, n))


def f32_gemm_packed(x: jax.Array, w: PackedF32, *, threads: int | None = None) -> jax.Array:
    """x f32[M, K] @ w (a ``PackedF32`` of shape [K, N]) -> f32[M, N]: each output float32 fused multiply-adds over
    k in order (XLA's dot up to the summation order); a row's result does not depend on M or the threads.
    Differentiable in x and w (the JVP is XLA's dot on the unpacked weight); under vmap the call runs once per batch
    element."""
    x = jnp.asarray(x)
    k, n = w.shape
    if x.ndim != 2 or x.shape[1] != k or x.dtype != jnp.float32:
        raise ValueError(f"f32_gemm_packed: x must be float32 [M, {k}] for a [{k}, {n}] weight, got "
                         f"{x.dtype}{tuple(x.shape)}")
    if build.load() is None:
        raise RuntimeError("f32_gemm_packed: the CPU kernels are unavailable (see the logged warning)")
    return _gemm(x, w.data, w.shape, threads or default_threads())


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3))
def _gemm(x, data, shape, threads):
    call = jax.ffi.ffi_call("jaxserve_f32_gemm_packed", jax.ShapeDtypeStruct((x.shape[0], shape[1]), jnp.float32),
                            vmap_method="sequential")
    return call(x, data, threads=threads, n=shape[1])


@_gemm.defjvp
def _gemm_jvp(shape, threads, primals, tangents):
    _, tangent = jax.jvp(lambda x, data: x @ PackedF32(data, shape).unpack(), primals, tangents)
    return _gemm(*primals, shape, threads), tangent
