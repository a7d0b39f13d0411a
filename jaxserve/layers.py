"""Building blocks shared by the model family and the MoE layers: dense layers, RMSNorm, rotary embeddings,
the gated MLP. Below both ``jaxserve.models`` and ``jaxserve.moe`` (the MoE block builds its shared experts
from ``SwiGLU``), so neither package imports the other for them."""
from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxserve.activations import ACTIVATIONS
from jaxserve.reductions import row_sum

_CPU_MAX_ROWS = 16  # jaxserve.kernels.cpu.MAX_ROWS (not imported here: that module may build a library)
# Fewest rows a float32 weight goes to the CPU kernel with (jaxserve.kernels.cpu.f32_matmul, both layouts): at one
# row XLA's gemv already streams near the memory bound and the kernel was slower. Medians of 3 runs of
# `benchmarks/cpu_matmul.py --m 1,2,5,16 --threads 2 --iters 10 --shapes 2,3,4 --paths xla_f32,kernel_f32` on the
# 2-core AMD EPYC VM (AVX2; shared with other jobs, load average 1.0-1.8), us, XLA's dot / the kernel:
#   gate/up [576,1536]        M=1 149 / 169   M=2 213 / 162   M=5 356 / 194   M=16 451 / 335
#   down [1536,576]           M=1 151 / 171   M=2 226 / 187   M=5 321 / 194   M=16 500 / 382
#   tied head [49152,576]^T   M=1 4550 / 4741 M=2 8639 / 4828 M=5 9357 / 5383 M=16 13447 / 8807
# (An earlier set, on a quieter machine: tied head M=1 3226 / 3815, M=2 8143 / 4186.)
_CPU_F32_MIN_ROWS = 2
# Fewest rows a bf16 weight goes to the AMX GEMM (jaxserve.kernels.cpu.bf16_gemm) with, on a CPU with AMX tiles: a
# Dense kernel [K, N] / a tied embedding [N, K] read as the head. Fewer rows stay with bf16_matmul (vdpbf16ps), which
# streams the weights without packing them into tiles. Medians of 7 interleaved calls, 2 threads, on the 2-core Xeon
# VM (AMX, idle), `benchmarks/cpu_matmul.py --m 1,4,9,16,64 --threads 2 --fp4 "" --paths xla_bf16,kernel_bf16,amx_bf16
# --shapes 0,2,3`, us, XLA's dot / bf16_matmul / bf16_gemm:
#   q/o [576,576]       M=1 47 / 41 / 59    M=4 48 / 44 / 52    M=9 77 / 73 / 65     M=16 77 / 102 / 72   M=64 193 / 388 / 161
#   gate/up [576,1536]  M=1 60 / 58 / 93    M=4 99 / 96 / 123   M=9 151 / 126 / 123  M=16 137 / 209 / 126 M=64 262 / 812 / 270
#   down [1536,576]     M=1 77 / 68 / 124   M=4 107 / 98 / 133  M=9 147 / 177 / 150  M=16 151 / 225 / 145 M=64 323 / 755 / 289
#   tied head [49152,576]^T (--m 9,64 --shapes 4): M=9 24831 / 5130 / 2331, M=64 28231 / 26334 / 5241; at M=1 and 4
#   2225 / 2123 and 3249 / 2151 (bf16_matmul / bf16_gemm; an earlier build of the head, which then scattered its
#   outputs: few rows are bound by reading the table either way).
# The head's tiles are loaded straight from the embedding (so from one row: 2123 against 2225 us); a [K, N] kernel is
# packed into tile pairs on every call, which costs about what XLA's dot does at 64 rows. The engine therefore packs
# a bf16 model's Dense kernels once (jaxserve.kernels.cpu.packed, read by _Dense at every row count: end to end on
# SmolLM2 bf16 1.06-1.15x, benchmarks/RESULTS.md); these thresholds route [K, N] kernels outside it.
_CPU_AMX_MIN_ROWS = {0: 8, 1: 1}  # by the axis of K in the weight
# Above _CPU_MAX_ROWS float32 layers go to OpenBLAS's sgemm (jaxserve.kernels.cpu.f32_gemm, N split over 2 threads).
# Medians of 5 interleaved calls, `benchmarks/cpu_matmul.py --threads 1,2 --paths xla_f32,blas`, on the 2-core Zen 4
# (AVX2) shared with other jobs (load average 3.2-3.7 for q/o and k/v, 5-9 for the rest: far below an idle machine's
# rates, so only the ratios count), us, XLA's dot / OpenBLAS:
#   q/o [576,576]             M=17 552 / 416   M=32 739 / 644 (one thread: 556)   M=64 1022 / 944   M=256 3680 / 3057
#   k/v [576,192]             M=17 438 / 290   M=32 548 / 302
#   gate/up [576,1536]        M=64 4243 / 3443
#   down [1536,576]           M=64 10466 / 7782
#   tied head [49152,576]^T   M=64 316072 / 299992
# End to end on the idle VM (load 1.8-2.2), SmolLM2-135M float32, 64 requests, 3 rounds alternating:
# OpenBLAS 115.3 tok/s (112.0-119.2) vs XLA's dot 102.7 (99.4-107.8), 1.12x, every round faster
# (`python benchmarks/cpu_blas_ab.py --workloads batch64 --variants blas,xla --rounds 3`, 2026-12-03).


def dot_via(matmul_dtype):
    """``lax.dot_general`` with both operands rounded to ``matmul_dtype``, summed in float32, and the
    result in the operands' original dtype.

    What a bfloat16 GEMM does on GPUs and in PyTorch's CPU kernels (one rounding of f32 sums per
    Linear), and, for float32 operands, TPU's default matmul precision. XLA:CPU's bf16 -> bf16 dot is
    also ~2x slower than bf16 -> f32 on CPUs with AVX512-BF16.

    A one-row lhs is given a second row: XLA:CPU hands multi-row dots to YNNPACK, which reads the bf16
    kernel as it is, but runs one-row dots in its own float32 code, converting the whole kernel first, on
    every engine step (a loop hoists it). Batch-1 decoding on the 2-core Zen 4, one process alternating:
    a plain engine 554.7 ms (float32) / 753.5 (one row) / 467.6 (two rows); while-loop target-only
    537.0 / 615.5 / 433.4 ms (`git show f5419a8:benchmarks/RESULTS.md`, "bfloat16 matmuls").

    On CPU, with bfloat16 operands, up to 16 rows (decoding) go to ``jaxserve.kernels.cpu.bf16_matmul``
    instead (an XLA FFI call reading the bf16 kernel as stored, the same operands and float32 sums;
    ``JAXSERVE_CPU_KERNELS=0`` turns it off); on a CPU with AMX tiles, from ``_CPU_AMX_MIN_ROWS`` rows up to
    ``jaxserve.kernels.cpu.bf16_gemm`` (the same operands on AMX; ``JAXSERVE_CPU_AMX=0`` turns only it off); more
    rows elsewhere keep XLA's dot.
    """
    def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
        del preferred_element_type
        out_dtype = jnp.result_type(lhs.dtype, rhs.dtype)
        if jnp.dtype(matmul_dtype) == jnp.bfloat16:
            w = rhs.astype(jnp.bfloat16)
            route = _cpu_route(lhs, w, dimension_numbers)
            if route:
                return _cpu_matmul(lhs, w, False, route).astype(out_dtype)
        rows = lhs.shape[0] if lhs.ndim == 2 and dimension_numbers[0][0] == (1,) else None
        if rows == 1:
            lhs = jnp.concatenate([lhs, lhs])
        out = jax.lax.dot_general(lhs.astype(matmul_dtype), rhs.astype(matmul_dtype), dimension_numbers, precision,
                                  preferred_element_type=jnp.float32)
        return (out[:1] if rows == 1 else out).astype(out_dtype)
    return dot_general


def f32_dot(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    """``lax.dot_general`` of float32 layers; on CPU, 2 to 16 rows of x against a float32 [K, N] weight go to
    ``jaxserve.kernels.cpu.f32_matmul`` (float32 FMAs: XLA's dot up to the summation order;
    ``JAXSERVE_CPU_KERNELS=0`` turns it off), and more rows to ``jaxserve.kernels.cpu.f32_gemm`` (OpenBLAS's sgemm;
    ``JAXSERVE_CPU_BLAS=0`` turns only that off).

    XLA:CPU's float32 dot is far from the memory bound at 2-16 rows, while its one-row gemv is not: see the
    measurements at ``_CPU_F32_MIN_ROWS``; above 16 rows it is compute-bound, and slower than OpenBLAS: see
    the measurements below it. (The engine packs a float32 model's kernels instead, ``_Dense`` then running
    ``jaxserve.kernels.cpu.packed_f32`` at every row count; these routes serve the kernels as stored: the tied
    head, ``weight_layout="as_stored"``, a mesh, code outside the engine.)"""
    if lhs.dtype == rhs.dtype == jnp.float32:
        route = _cpu_route(lhs, rhs, dimension_numbers)
        if route:
            return _cpu_matmul(lhs, rhs, False, route)
    return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision, preferred_element_type=preferred_element_type)


def _cpu_route(lhs, rhs, dimension_numbers, k_axis: int = 0) -> str | None:
    """Where ``lhs[..., K] @ rhs`` (rhs a plain 2-D bf16 or float32 weight, [K, N], or [N, K] for k_axis=1) goes on
    CPU: "amx" (bf16, ``_CPU_AMX_MIN_ROWS`` rows or more, ``jaxserve.kernels.cpu.amx_usable``), "kernel" (bf16 up to
    ``MAX_ROWS`` rows; float32 from ``_CPU_F32_MIN_ROWS`` to ``MAX_ROWS``), "blas" (float32 above ``MAX_ROWS``,
    ``jaxserve.kernels.cpu.blas_usable``), or None: XLA's dot."""
    if rhs.ndim != 2 or lhs.ndim < 1 or dimension_numbers != (((lhs.ndim - 1,), (k_axis,)), ((), ())):
        return None
    rows = math.prod(lhs.shape[:-1])
    if rhs.dtype not in (jnp.bfloat16, jnp.float32):
        return None
    from jaxserve.kernels import cpu  # imported on first use: it may build the library
    if rhs.dtype == jnp.bfloat16:
        if rows >= _CPU_AMX_MIN_ROWS[k_axis] and cpu.amx_usable():
            return "amx"
        return "kernel" if rows <= _CPU_MAX_ROWS and cpu.usable() else None
    if rows < _CPU_F32_MIN_ROWS:
        return None
    if rows <= _CPU_MAX_ROWS:
        return "kernel" if cpu.usable() else None
    return "blas" if cpu.blas_usable() else None


def _cpu_matmul(x, w, transpose_w: bool, route: str):
    """x[..., K] @ w (w [K, N], transpose_w: [N, K]) -> f32[..., N], float32 sums, by ``_cpu_route``'s route. bf16 w:
    x rounded to bf16 first (the operands XLA's bf16 dot multiplies); float32 w: x as it is."""
    from jaxserve.kernels.cpu import bf16_gemm, bf16_matmul, f32_gemm, f32_matmul
    n = w.shape[0] if transpose_w else w.shape[1]
    x2 = x.reshape(-1, x.shape[-1])
    if w.dtype == jnp.bfloat16:
        y = (bf16_gemm if route == "amx" else bf16_matmul)(x2.astype(jnp.bfloat16), w, transpose_w=transpose_w)
    else:
        y = (f32_gemm if route == "blas" else f32_matmul)(x2, w, transpose_w=transpose_w)
    return y.reshape(*x.shape[:-1], n)


def tied_logits(embed: nn.Embed, x: jax.Array) -> jax.Array:
    """``embed.attend(x)``: x[..., E] @ embedding[V, E]^T in the embedding's dtype; a few rows of a bf16 or float32
    embedding go to the CPU kernel (as ``dot_via``'s and ``f32_dot``'s dense layers do), which reads it as stored
    (bf16: without a float32 copy), and more rows of a float32 one to OpenBLAS's sgemm (as ``f32_dot``'s)."""
    e = embed.embedding  # (a QuantizedTensor under use_quantized_matmul goes to its attend: jaxserve.quant.matmul)
    if isinstance(e, jax.Array) and e.dtype == jnp.dtype(embed.dtype) and e.dtype in (jnp.bfloat16, jnp.float32):
        route = _cpu_route(x, e, (((x.ndim - 1,), (1,)), ((), ())), k_axis=1)
        if route:
            return _cpu_matmul(x.astype(e.dtype), e, True, route).astype(embed.dtype)
    return embed.attend(x)


def packed_logits(kernel, x: jax.Array, dtype=jnp.float32) -> jax.Array:
    """x [..., E] @ a tied embedding packed as the LM head (``kernels.cpu.packed.pack_tied_head``: [E, V]) -> [..., V]
    in ``dtype``: for a ``PackedBf16``, float32 sums of bf16 x (or bfloat16, rounded in the kernel), the sums
    ``tied_logits`` takes of a bf16 embedding; for a ``PackedF32``, float32 FMAs over k in order of float32 x.
    One packed GEMM at every row count."""
    from jaxserve.kernels.cpu.packed import bf16_gemm_packed
    from jaxserve.kernels.cpu.packed_f32 import PackedF32, f32_gemm_packed
    rows = x.reshape(-1, x.shape[-1])
    if isinstance(kernel, PackedF32):
        y = f32_gemm_packed(rows.astype(jnp.float32), kernel)
    else:
        y = bf16_gemm_packed(rows.astype(jnp.bfloat16), kernel, out_dtype=_gemm_out(dtype))
    return y.reshape(*x.shape[:-1], kernel.shape[1]).astype(dtype)


def packed_head_logits(kernel, x: jax.Array) -> jax.Array | None:
    """x [..., E] @ an untied LM head a runner packed (``PackedBf16`` or ``PackedF32``: ``packed_logits``) ->
    f32[..., V]; None for any other kernel (the caller's own dot)."""
    if isinstance(kernel, jax.Array) or kernel is None:
        return None
    from jaxserve.kernels.cpu.packed import PackedBf16
    from jaxserve.kernels.cpu.packed_f32 import PackedF32
    return packed_logits(kernel, x, jnp.float32) if isinstance(kernel, (PackedBf16, PackedF32)) else None


def _gemm_out(dtype):
    """The packed GEMM's output for a result in ``dtype``: bf16 rounded in the kernel (the same bits as float32
    sums converted), else float32."""
    return jnp.bfloat16 if jnp.dtype(dtype) == jnp.bfloat16 else jnp.float32


def int8_logits(head, x: jax.Array) -> jax.Array:
    """x [..., E] @ an LM head in int8 (``kernels.cpu.int8_head``: W8A8, EngineConfig.lm_head_quantization) -> f32
    [..., V]."""
    from jaxserve.kernels.cpu.int8_head import int8_head_logits
    return int8_head_logits(head, x)


def dense(features: int, dtype, name: str, *, matmul_dtype=None, bias: bool = False,
          kernel_init=nn.initializers.lecun_normal()) -> nn.Dense:
    """An ``nn.Dense`` computing in ``dtype``, its dot in ``matmul_dtype`` (default: dtype) with float32 sums.

    A kernel is declared in the narrower of the two (its bias in ``dtype``): a bf16 kernel feeds a bf16 dot
    as it is, where a float32 one would be rounded again on every call (XLA hoists that out of a
    ``while_loop`` but not out of an engine step: a batch-1 decode step 1.86 -> 2.38 ms on the Zen 4)."""
    dtype, mm = jnp.dtype(dtype), jnp.dtype(matmul_dtype or dtype)
    return _Dense(features, use_bias=bias, dtype=dtype, param_dtype=min(dtype, mm, key=lambda d: d.itemsize),
                  kernel_init=kernel_init, dot_general=dense_dot(dtype, matmul_dtype), name=name)


def dense_dot(dtype, matmul_dtype=None):
    """The ``dot_general`` a ``dense`` layer computes with: ``f32_dot`` for float32 throughout, else ``dot_via``."""
    dtype, mm = jnp.dtype(dtype), jnp.dtype(matmul_dtype or dtype)
    return f32_dot if mm == jnp.float32 == dtype else dot_via(mm)


class _Dense(nn.Dense):
    """``nn.Dense`` whose bias is stored in the compute dtype when the kernel is narrower, and which also takes its
    kernel packed (``jaxserve.kernels.cpu.packed.PackedBf16``, what an engine on a CPU with the kernels runs a bf16
    model with): ``bf16_gemm_packed`` at every row count, the operands ``dot_via(bfloat16)`` multiplies; or, for a
    float32 model, ``packed_f32.PackedF32``: ``f32_gemm_packed`` at every row count."""

    @nn.compact
    def __call__(self, inputs):
        """inputs [..., K], or an RMSNorm's ``NormedRows``: a packed kernel applies the norm as it reads the rows
        (bf16 rows and layer), any other path takes its value."""
        kernel = self.get_variable("params", "kernel") if self.has_variable("params", "kernel") else None
        if kernel is not None and not isinstance(kernel, jax.Array):
            from jaxserve.kernels.cpu.packed import PackedBf16  # (any other kind: self.param's shape check refuses it)
            from jaxserve.kernels.cpu.packed_f32 import PackedF32
            if isinstance(kernel, PackedBf16):
                return self._packed(inputs, kernel)
            if isinstance(kernel, PackedF32):
                return self._packed_f32(inputs.value() if isinstance(inputs, NormedRows) else inputs, kernel)
        if isinstance(inputs, NormedRows):
            inputs = inputs.value()
        if not self.use_bias or self.param_dtype == self.dtype:
            return super().__call__(inputs)
        kernel = self.param("kernel", self.kernel_init, (inputs.shape[-1], self.features), self.param_dtype)
        bias = self.param("bias", self.bias_init, (self.features,), self.dtype)
        y = self.dot_general(inputs.astype(self.dtype), kernel.astype(self.dtype),
                             (((inputs.ndim - 1,), (0,)), ((), ())), precision=self.precision)
        return y + bias

    def _packed_f32(self, inputs, kernel):
        from jaxserve.kernels.cpu.packed_f32 import f32_gemm_packed
        if kernel.shape != (inputs.shape[-1], self.features) or jnp.dtype(self.dtype or inputs.dtype) != jnp.float32:
            raise ValueError(f"{'/'.join(self.scope.path)}: kernel PackedF32 of shape {kernel.shape} does not fit "
                             f"{inputs.dtype} inputs {inputs.shape} -> {self.features} of a float32 layer")
        y = f32_gemm_packed(inputs.astype(jnp.float32).reshape(-1, inputs.shape[-1]), kernel)
        y = y.reshape(*inputs.shape[:-1], self.features)
        if self.use_bias:
            y = y + self.get_variable("params", "bias").astype(jnp.float32)
        return y

    def _packed(self, inputs, kernel):
        from jaxserve.kernels.cpu.packed import bf16_gemm_packed
        if kernel.shape != (inputs.shape[-1], self.features):
            raise ValueError(f"{'/'.join(self.scope.path)}: kernel PackedBf16 of shape {kernel.shape} does not fit "
                             f"inputs {inputs.shape} -> {self.features}")
        dtype = self.dtype or jnp.result_type(inputs.dtype, jnp.bfloat16)
        norm = None
        if isinstance(inputs, NormedRows):
            inputs, norm = inputs.for_gemm(dtype)
        x = inputs.astype(dtype).reshape(-1, inputs.shape[-1]).astype(jnp.bfloat16)
        y = bf16_gemm_packed(x, kernel, out_dtype=_gemm_out(dtype), norm=norm)
        y = y.reshape(*inputs.shape[:-1], self.features).astype(dtype)
        if self.use_bias:
            y = y + self.get_variable("params", "bias").astype(dtype)
        return y


def holds_packed(module: nn.Module, *path: str) -> bool:
    """Whether ``module``'s params hold a Dense layer at ``path`` whose kernel is packed (``PackedBf16``): a layer
    that takes an RMSNorm's ``NormedRows`` and applies the norm itself. Other paths (XLA's dot, a quantized kernel,
    a method interceptor) get the norm's value."""
    tree = module.variables.get("params", {})
    for name in path:
        if not hasattr(tree, "get"):
            return False
        tree = tree.get(name, {})
    kernel = tree.get("kernel") if hasattr(tree, "get") else None
    if kernel is None or isinstance(kernel, jax.Array):
        return False
    from jaxserve.kernels.cpu.packed import PackedBf16
    return isinstance(kernel, PackedBf16)


def packed_residual(module: nn.Module, name: str, x: jax.Array, residual: jax.Array | None) -> jax.Array | None:
    """``residual + dense(x)`` for ``module``'s Dense layer ``name`` as one packed GEMM (``bf16_gemm_packed(...,
    residual=...)``: the bits of the bf16 add, without the projection written apart) when that layer holds a
    packed kernel (``PackedBf16``) without a bias and ``residual`` is bf16; else None (the caller adds)."""
    if residual is None or residual.dtype != jnp.bfloat16 or not module.has_variable("params", name):
        return None
    from jaxserve.kernels.cpu.packed import PackedBf16, bf16_gemm_packed
    layer = module.get_variable("params", name)
    kernel = layer.get("kernel")
    if not isinstance(kernel, PackedBf16) or "bias" in layer or kernel.shape != (x.shape[-1], residual.shape[-1]):
        return None
    y = bf16_gemm_packed(x.reshape(-1, x.shape[-1]).astype(jnp.bfloat16), kernel, out_dtype=jnp.bfloat16,
                         residual=residual.reshape(-1, residual.shape[-1]))
    return y.reshape(residual.shape)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class NormedRows:
    """An RMSNorm's output not yet computed (``RMSNorm(..., deferred=True)``): ``value()`` is the norm's result, bit
    for bit; a packed bf16 GEMM reading these rows (``_Dense``, ``SwiGLU``) applies the norm's last multiplies itself
    (``bf16_gemm_packed(norm=...)``), so the normed [T, E] matrix is never written (one XLA fusion fewer a norm:
    a batch-64 decode step's two a layer took ~0.7 of ~29 ms)."""
    x: jax.Array        # [..., E] the norm's input, in the model's dtype
    inv_rms: jax.Array  # f32[..., 1]
    scale: jax.Array    # [E] the norm's weight, in the model's dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.x.shape

    @property
    def dtype(self):
        return self.x.dtype

    def value(self) -> jax.Array:
        # Normalise in float32 and cast back before scaling, as HF Llama/Qwen do.
        return self.scale * (self.x.astype(jnp.float32) * self.inv_rms).astype(self.x.dtype)

    def for_gemm(self, dtype) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        """(rows, norm) for a packed GEMM computing in ``dtype``: the raw bf16 rows [..., E] and (inv_rms f32[T],
        scale bf16[E]) where the GEMM can apply the norm (bf16 throughout), else the value and None."""
        if not (jnp.dtype(dtype) == self.x.dtype == self.scale.dtype == jnp.bfloat16):
            return self.value(), None
        return self.x, (self.inv_rms.reshape(-1), self.scale)


class RMSNorm(nn.Module):
    eps: float = 1e-6
    dtype: jnp.dtype = jnp.float32
    unit_offset: bool = False  # Gemma: scale by (1 + weight), weights initialised to 0

    @nn.compact
    def __call__(self, x, deferred: bool = False):
        """x [..., E] -> normed; ``deferred``: a ``NormedRows`` for a consumer that may apply the last multiplies
        itself (without a unit offset; else the array)."""
        init = nn.initializers.zeros if self.unit_offset else nn.initializers.ones
        scale = self.param("scale", init, (x.shape[-1],), self.dtype)
        xf = x.astype(jnp.float32)
        inv_rms = jax.lax.rsqrt(row_sum(xf * xf)[..., None] / x.shape[-1] + self.eps)
        if self.unit_offset:  # Gemma scales in float32, then casts (HF transformers PR 29402)
            return (xf * inv_rms * (1.0 + scale.astype(jnp.float32))).astype(x.dtype)
        rows = NormedRows(x, inv_rms, scale)
        return rows if deferred else rows.value()


def rope_inv_freq(head_dim: int, theta: float, rope_type: str = "default", factor: float = 1.0,
                  low_freq_factor: float = 1.0, high_freq_factor: float = 4.0,
                  original_max_position: int = 8192) -> jax.Array:
    """RoPE inverse frequencies f32[D/2], as HF's ``ROPE_INIT_FUNCTIONS[rope_type]`` computes them.

    linear: all divided by ``factor``. llama3 (Llama 3.1): wavelengths longer than
    ``original_max_position / low_freq_factor`` divided by ``factor``, shorter than
    ``original_max_position / high_freq_factor`` kept, those between interpolated smoothly.
    """
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / factor
    if rope_type != "llama3":
        raise ValueError(f"unsupported rope_type {rope_type!r}")
    wavelen = 2 * jnp.pi / inv_freq
    low_wavelen, high_wavelen = original_max_position / low_freq_factor, original_max_position / high_freq_factor
    scaled = jnp.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_max_position / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return jnp.where(medium, smoothed, scaled)


def rope_tables(positions: jax.Array, inv_freq: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cos and sin f32[..., 1, D] of the angles ``positions`` i32[...] x ``inv_freq`` f32[D/2], each half repeated
    (HF's rotate-half layout), for ``rope``. A model computes them once per forward for each set of frequencies and
    hands them to every layer: recomputed per layer (for q and for k), they cost ~3% of a SmolLM2 batch-64 step."""
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [..., D/2]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    return jnp.concatenate([cos, cos], -1)[..., None, :], jnp.concatenate([sin, sin], -1)[..., None, :]


def rope(x: jax.Array, positions: jax.Array, theta: float, inv_freq: jax.Array | None = None,
         tables: tuple[jax.Array, jax.Array] | None = None) -> jax.Array:
    """Rotary embedding in HF's rotate-half layout: x [..., H, D], positions i32[...].

    ``inv_freq`` f32[D/2] (``rope_inv_freq``) replaces the unscaled frequencies of base ``theta``; ``tables``
    (``rope_tables`` of these positions and frequencies) replaces both."""
    d = x.shape[-1]
    if tables is None:
        tables = rope_tables(positions, rope_inv_freq(d, theta) if inv_freq is None else inv_freq)
    cos, sin = tables
    xf = x.astype(jnp.float32)
    rotated = jnp.concatenate([-xf[..., d // 2:], xf[..., : d // 2]], -1)
    return (xf * cos + rotated * sin).astype(x.dtype)


class SwiGLU(nn.Module):
    """The gated MLP: down(act(gate(x)) * up(x)); ``activation`` "silu" (SwiGLU) or "gelu_tanh" (GeGLU)."""
    hidden_size: int
    intermediate_size: int
    dtype: jnp.dtype = jnp.float32
    matmul_dtype: jnp.dtype | None = None
    activation: str = "silu"

    @nn.compact
    def __call__(self, x, residual=None):
        """x [..., hidden] -> the MLP's output; with ``residual`` (the stream it is added to): ``residual`` plus it,
        the add fused into the down projection's GEMM where its kernel is packed."""
        proj = lambda n, name: dense(n, self.dtype, name, matmul_dtype=self.matmul_dtype)  # noqa: E731
        act = ACTIVATIONS[self.activation]
        if self.has_variable("params", "gate_up_proj"):  # fused by a runner (jaxserve.kernels.cpu.packed.FUSIONS)
            fused = self.get_variable("params", "gate_up_proj")
            if self._gated_in_gemm(fused, x):
                from jaxserve.kernels.cpu.packed import bf16_gemm_packed
                rows, norm = x.for_gemm(self.dtype) if isinstance(x, NormedRows) else (x, None)
                h = bf16_gemm_packed(rows.reshape(-1, x.shape[-1]).astype(jnp.bfloat16), fused["kernel"],
                                     activation=self.activation, norm=norm)
                return self._down(proj, h.reshape(*x.shape[:-1], self.intermediate_size), residual)
            gate, up = jnp.split(proj(2 * self.intermediate_size, "gate_up_proj")(x), 2, axis=-1)
        else:
            x = x.value() if isinstance(x, NormedRows) else x
            gate, up = proj(self.intermediate_size, "gate_proj")(x), proj(self.intermediate_size, "up_proj")(x)
        return self._down(proj, act(gate) * up, residual)

    def _down(self, proj, h, residual):
        fused = packed_residual(self, "down_proj", h, residual)
        if fused is not None:
            return fused
        out = proj(self.hidden_size, "down_proj")(h)
        return out if residual is None else residual + out

    def _gated_in_gemm(self, fused, x) -> bool:
        """Whether the packed gate/up GEMM can apply the activation itself (``bf16_gemm_packed(activation=...)``: the
        unfused bf16 graph's bits, without the [T, 2 I] matrix): a bf16 model, a packed kernel, no bias, the
        halves on whole 32-column groups."""
        from jaxserve.kernels.cpu.packed import PackedBf16
        return (isinstance(fused.get("kernel"), PackedBf16) and "bias" not in fused
                and jnp.dtype(self.dtype) == jnp.bfloat16 and self.intermediate_size % 32 == 0
                and fused["kernel"].shape == (x.shape[-1], 2 * self.intermediate_size))
