"""bf16 Dense kernels packed once into the layout AMX tiles load, and the GEMM that reads them (``amx.cc``'s
``jaxserve_bf16_gemm_packed``: on AMX tiles, or on float32 FMAs where the CPU has none, ``packed_fma.h``).

``bf16_gemm`` packs a [K, N] kernel into tile pairs on every call: at many rows that costs about what reading the
weights does, and at a few rows it is why ``bf16_matmul`` (vdpbf16ps) stayed faster. ``PackedBf16`` holds the kernel
already in that layout, so one GEMM serves every row count: decode rows, verify rows and prefill get the same bits for
the same row (neither implementation's sums depend on the other rows), and a weight is stored once.
``pack_dense_kernels`` packs a model's Dense kernels and fuses the projections of one input (``FUSIONS``: q/k/v,
gate/up) into one GEMM each.

The GEMM takes x in float32 or bf16 and writes float32 sums, the same sums rounded to bf16 (what a bf16 model's
Dense layer returns, without a float32 matrix written and converted), or for a fused gate/up weight a gated MLP's
act(gate) * up in bf16 (``activation``): the epilogues bf16 models run, each giving the bits of the unfused graph.

Two implementations (``impl``, by default ``matmul.packed_impl()``): "amx", the tiles' sums (their own order and
roundings); "fma", float32 FMAs in k order (a float32 loop over k, bit for bit: ``fma_reference``), for CPUs without
AMX (SmolLM2 bf16 at batch 64 on a 2-core Ice Lake VM, ``benchmarks/profile_step.py``: a decode step 195 ms against
283 with XLA's bf16 dot on the weights as stored; end to end: benchmarks/RESULTS.md).
Both give a row the same bits alone or in any batch; they agree with each other to float32 rounding.

Layout: ``data`` bf16[ceil(N / 32), round_up(K, 32) * 32]; row g holds columns [32 g, 32 g + 32) as the two B tiles of
each 32-wide k block in k order, every tile 16 rows of 16 (w[2p, n], w[2p + 1, n]) pairs; zeros pad K and N.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.kernels.cpu import build
from jaxserve.kernels.cpu.matmul import amx_granted, default_threads, packed_impl
from jaxserve.kernels.cpu.packed_f32 import pack_f32
from jaxserve.activations import ACTIVATIONS

TILE_K = 32  # bf16 k per A tile row
GROUP = 32   # columns of w per packed row (two B tiles of 16)


def _round_up(v: int, m: int) -> int:
    return -(-v // m) * m


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PackedBf16:
    """A bf16 [K, N] weight packed for ``bf16_gemm_packed`` (see the module docstring): ``shape`` is the weight's."""
    data: jax.Array                                      # bf16[ceil(N / 32), round_up(K, 32) * 32]
    shape: tuple[int, int] = dataclasses.field(metadata=dict(static=True))

    def unpack(self) -> jax.Array:
        """The [K, N] bf16 weight back, bit for bit."""
        k, n = self.shape
        kp, g = _round_up(k, TILE_K), self.data.shape[0]
        blocks = self.data.reshape(g, kp // TILE_K, 2, 16, 16, 2)          # [g, kb, tile, p, j, parity]
        w = blocks.transpose(1, 3, 5, 0, 2, 4).reshape(kp, g * GROUP)      # [kb, p, parity | g, tile, j]
        return w[:k, :n]

    def columns(self, ids: jax.Array) -> jax.Array:
        """Columns ``ids`` i32[...] of the [K, N] weight as rows bf16[..., K], bit for bit (a packed tied embedding's
        lookup: ``pack_tied_head``)."""
        k, _ = self.shape
        blocks = self.data.reshape(self.data.shape[0], -1, 2, 16, 16, 2)    # [g, kb, tile, p, j, parity]
        flat = ids.reshape(-1)
        rows = blocks[flat // GROUP, :, flat % GROUP // 16, :, flat % 16, :]  # [T, kb, p, parity]
        return rows.reshape(*ids.shape, -1)[..., :k]


def pack_bf16(w) -> PackedBf16:
    """w bf16[K, N] (any float dtype is rounded to bf16) -> ``PackedBf16``. Jittable; exact for bf16 w."""
    w = jnp.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"pack_bf16: w must be 2-D [K, N], got shape {w.shape}")
    k, n = w.shape
    kp, np_ = _round_up(k, TILE_K), _round_up(n, GROUP)
    w = jnp.pad(w.astype(jnp.bfloat16), ((0, kp - k), (0, np_ - n)))
    blocks = w.reshape(kp // TILE_K, 16, 2, np_ // GROUP, 2, 16)            # [kb, p, parity, g, tile, j]
    data = blocks.transpose(3, 0, 4, 1, 5, 2).reshape(np_ // GROUP, kp * GROUP)
    return PackedBf16(data, (k, n))


# Projections of one input a runner fuses into one packed GEMM, the parts' columns side by side: (the fused module's
# name, its parts in order). The model runs the fused module when its params hold it (jaxserve.models.transformer's
# Attention, jaxserve.layers.SwiGLU). A column's sums do not depend on its neighbours: the same bits, fewer calls.
FUSIONS = (("qkv_proj", ("q_proj", "k_proj", "v_proj")), ("gate_up_proj", ("gate_proj", "up_proj")))


def pack_dense_kernels(params, fuse: bool = True, dtype=jnp.bfloat16):
    """params with every Dense kernel of ``dtype`` (a leaf named ``kernel``: a 2-D array, [K, N]) packed: bf16 as
    ``PackedBf16``, float32 as ``packed_f32.PackedF32``; other leaves as they are. With ``fuse``, the parts of each of
    ``FUSIONS`` found side by side as such Dense layers (all with biases or none) become one fused layer. For a model
    whose Dense layers are ``jaxserve.layers.dense`` (``_Dense`` reads a packed kernel; a plain ``nn.Dense`` would
    refuse it: its param's shape check)."""
    dtype = jnp.dtype(dtype)
    pack = _packer(dtype)
    if pack is None:
        raise ValueError(f"pack_dense_kernels: dtype must be bfloat16 or float32, got {dtype}")

    def is_kernel(leaf):
        return isinstance(leaf, jax.Array) and leaf.ndim == 2 and leaf.dtype == dtype

    def walk(tree):
        if not isinstance(tree, Mapping):
            return tree
        out = dict(tree)
        for fused, parts in FUSIONS if fuse else ():
            layers = [out.get(p) for p in parts]
            if not all(isinstance(d, Mapping) and is_kernel(d.get("kernel")) and set(d) <= {"kernel", "bias"}
                       for d in layers) or len({frozenset(d) for d in layers}) != 1 or fused in out:
                continue
            out[fused] = {key: jnp.concatenate([d[key] for d in layers], axis=-1) for key in layers[0]}
            for p in parts:
                del out[p]
        return {name: pack(sub) if name == "kernel" and is_kernel(sub) else walk(sub) for name, sub in out.items()}
    return walk(params)


_pack_jit = jax.jit(pack_bf16)
_pack_f32_jit = jax.jit(pack_f32)


def _packer(dtype: jnp.dtype):
    """The jitted packing of a [K, N] kernel of ``dtype`` (bf16 or float32), or None for any other dtype."""
    return {jnp.dtype(jnp.bfloat16): _pack_jit, jnp.dtype(jnp.float32): _pack_f32_jit}.get(dtype)


def pack_tied_head(params, dtype=jnp.bfloat16):
    """params whose tied embedding (``embed/embedding`` [V, E]) of ``dtype`` is replaced by ``tied_head/kernel``, its
    transpose packed as ``pack_dense_kernels`` packs that dtype (bf16: ``PackedBf16`` [E, V]; float32:
    ``packed_f32.PackedF32``): the LM head then runs the packed GEMM (SmolLM2's [49152, 576] in bf16: 1.94 -> 1.27 ms
    at 1 row, 6.7 -> 3.2 ms at 64, the same bf16 logits bit for bit; in float32 at 64 rows 32 -> 23 ms against
    OpenBLAS's sgemm, which packs the whole matrix on every call) and a token's embedding is a column of it
    (``columns``): one copy of the matrix. The model runs it when its params hold ``tied_head``
    (``jaxserve.models.transformer.Transformer``); params without such an ``embed`` come back as they are."""
    dtype, pack = jnp.dtype(dtype), _packer(jnp.dtype(dtype))
    embedding = params.get("embed", {}).get("embedding") if isinstance(params, Mapping) else None
    if pack is None or not (isinstance(embedding, jax.Array) and embedding.ndim == 2 and embedding.dtype == dtype):
        return params
    out = {name: sub for name, sub in params.items() if name != "embed"}
    out["tied_head"] = {"kernel": pack(embedding.T)}
    return out


_EPILOGUES = {None: 0, "bf16": 1, "gated": 2, "argmax": 3, "residual": 4}  # amx.cc's Epilogue


@functools.lru_cache(maxsize=None)
def activation_table(activation: str) -> np.ndarray:
    """f32[65536]: ``ACTIVATIONS[activation]`` at every bf16 input (index: the input's bits), rounded to bf16 as a
    bf16 model's graph rounds it, computed by XLA itself on this backend (a compiled call, not constant folding), so
    the gated epilogue returns the bits of the unfused graph."""
    inputs = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(jnp.bfloat16)
    # Compiled ahead and called on a numpy array: it runs now, even while a caller is being traced; on the CPU
    # backend, whose bits the kernel must give, whatever the default device. Its result is the bf16 array itself,
    # widened here: a float32 cast inside the program would let XLA skip the last rounding.
    with jax.default_device(jax.devices("cpu")[0]):
        table = jax.jit(ACTIVATIONS[activation]).lower(inputs).compile()
        return np.asarray(table(inputs)).astype(np.float32)


def bf16_gemm_packed(x: jax.Array, w: PackedBf16, *, threads: int | None = None, out_dtype=jnp.float32,
                     activation: str | None = None, residual: jax.Array | None = None,
                     norm: tuple[jax.Array, jax.Array] | None = None, impl: str | None = None) -> jax.Array:
    """x f32/bf16[M, K] @ w (a ``PackedBf16`` of shape [K, N]) -> f32[M, N]: x rounded to bf16, exact products summed
    in float32: ``impl="amx"`` by AMX tiles, the sums ``bf16_gemm`` gives (bit for bit: the same tile ops in the same
    k order; needs ``matmul.amx_usable()``), ``impl="fma"`` by float32 FMAs in k order (``fma_reference``'s bits; any
    CPU the kernels run on); default ``matmul.packed_impl()``. A row's result does not depend on M or the threads.
    Differentiable in x (the JVP uses XLA's dot on the unpacked weight); under vmap the call runs once per batch
    element.

    ``out_dtype=bfloat16``: the sums rounded to bf16 in the kernel (the bits of ``.astype(bfloat16)``, without the
    float32 matrix). ``activation`` (a gated MLP's, ``ACTIVATIONS``): w is [gate | up] (N = 2 I, I a multiple of 32)
    and the result bf16[M, I] = act(gate) * up with gate and up rounded to bf16 and every op of the graph rounding
    to bf16, as a bf16 model computes it unfused (``activation_table``), bit for bit. ``residual`` (bf16[M, N], with
    ``out_dtype=bfloat16``): the result is ``residual + product`` in bf16, XLA's add of the two, bit for bit (a
    projection into the residual stream, without the projection written apart). ``norm`` (inv_rms f32[M], scale
    bf16[K], with bf16 x): the GEMM multiplies ``normed_reference(x, inv_rms, scale)``, an RMSNorm's output, instead
    of x, computing it as it reads the rows (its bits; the normed matrix is never written)."""
    x = jnp.asarray(x)
    k, n = w.shape
    if x.ndim != 2 or x.shape[1] != k:
        raise ValueError(f"bf16_gemm_packed: x must be [M, {k}] for a [{k}, {n}] weight, got x{x.shape}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"bf16_gemm_packed: x must be floating point, got {x.dtype}")
    out_dtype = jnp.dtype(out_dtype)
    if out_dtype not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
        raise ValueError(f"bf16_gemm_packed: out_dtype must be float32 or bfloat16, got {out_dtype}")
    if activation is not None:
        if activation not in ACTIVATIONS:
            raise ValueError(f"bf16_gemm_packed: activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        if n % 64:
            raise ValueError(f"bf16_gemm_packed: a gated weight's N must be 2 I with I a multiple of 32, got N={n}")
    if residual is not None and (activation is not None or out_dtype != jnp.bfloat16 or residual.dtype != jnp.bfloat16
                                 or residual.shape != (x.shape[0], n)):
        raise ValueError(f"bf16_gemm_packed: a residual must be bf16[{x.shape[0]}, {n}] with out_dtype=bfloat16 and "
                         f"no activation, got {residual.dtype}{tuple(residual.shape)}")
    if norm is not None:
        inv_rms, scale = (jnp.asarray(a) for a in norm)
        if (x.dtype != jnp.bfloat16 or inv_rms.dtype != jnp.float32 or inv_rms.shape != (x.shape[0],)
                or scale.dtype != jnp.bfloat16 or scale.shape != (k,)):
            raise ValueError(f"bf16_gemm_packed: a norm needs bf16 x [M, {k}], inv_rms f32[M] and scale bf16[{k}], "
                             f"got x {x.dtype}{tuple(x.shape)}, inv_rms {inv_rms.dtype}{tuple(inv_rms.shape)}, "
                             f"scale {scale.dtype}{tuple(scale.shape)}")
    else:
        inv_rms, scale = jnp.zeros((0,), jnp.float32), jnp.zeros((0,), jnp.bfloat16)
    impl = _impl("bf16_gemm_packed", impl)
    epilogue = ("gated" if activation else "residual" if residual is not None
                else None if out_dtype == jnp.float32 else "bf16")
    x = x if x.dtype == jnp.bfloat16 else x.astype(jnp.float32)
    aux = residual if residual is not None else jnp.zeros((0,), jnp.float32)
    return _gemm_x(x, w.data, aux, inv_rms, scale, w.shape, threads or default_threads(), epilogue, activation, impl)


def _impl(name: str, impl: str | None) -> str:
    """The packed GEMM's implementation to run (see the module docstring), checked to be runnable here."""
    impl = packed_impl() if impl is None else impl
    if impl not in ("amx", "fma"):
        raise ValueError(f"{name}: impl must be 'amx' or 'fma', got {impl!r}")
    if build.load() is None:
        raise RuntimeError(f"{name}: the CPU kernels are unavailable (see the logged warning)")
    if impl == "amx" and not amx_granted():
        raise RuntimeError(f"{name}: AMX tiles are unavailable (a CPU without AMX-BF16, or Linux refused the tile "
                           f"state); impl='fma' runs without them")
    return impl


def fma_reference(x: jax.Array, w: jax.Array) -> np.ndarray:
    """What ``impl="fma"`` computes, in numpy: bf16(x) [M, K] @ w bf16[K, N] -> f32[M, N], each output a float32 sum
    from 0 over k in order (every product exact; each addition rounded to nearest even)."""
    xb = np.asarray(jnp.asarray(x).astype(jnp.bfloat16), np.float32)
    wf = np.asarray(jnp.asarray(w).astype(jnp.bfloat16), np.float32)
    y = np.zeros((xb.shape[0], wf.shape[1]), np.float32)
    for k in range(xb.shape[1]):
        y += xb[:, k:k + 1] * wf[k]
    return y


def normed_reference(x: jax.Array, inv_rms: jax.Array, scale: jax.Array) -> jax.Array:
    """The rows the GEMM multiplies with ``norm=(inv_rms, scale)``: bf16 x [M, K] times its row's inv_rms f32[M],
    rounded to bf16, times scale bf16[K] (RMSNorm's last multiplies in a bf16 model: ``jaxserve.layers.NormedRows``)."""
    return scale * (x.astype(jnp.float32) * inv_rms[:, None]).astype(jnp.bfloat16)


def gated_reference(y: jax.Array, activation: str) -> jax.Array:
    """The unfused graph the gated epilogue computes: y f32[M, 2 I] -> bf16 act(gate) * up."""
    gate, up = jnp.split(y.astype(jnp.bfloat16), 2, axis=-1)
    return ACTIVATIONS[activation](gate) * up


@functools.partial(jax.custom_jvp, nondiff_argnums=(5, 6, 7, 8, 9))
def _gemm_x(x, data, aux, inv_rms, scale, shape, threads, epilogue, activation, impl):
    m, n = x.shape[0], shape[1]
    out = jax.ShapeDtypeStruct((m, n // 2 if epilogue == "gated" else n),
                               jnp.float32 if epilogue is None else jnp.bfloat16)
    if activation:
        aux = activation_table(activation)
    call = jax.ffi.ffi_call("jaxserve_bf16_gemm_packed", out, vmap_method="sequential")
    return call(x, data, aux, inv_rms, scale, threads=threads, epilogue=_EPILOGUES[epilogue], n=n,
                fma=int(impl == "fma"))


@_gemm_x.defjvp
def _gemm_x_jvp(shape, threads, epilogue, activation, impl, primals, tangents):
    def reference(x, data, aux, inv_rms, scale):  # the same function through XLA's dot on the unpacked weight
        if inv_rms.size:
            x = normed_reference(x, inv_rms, scale)
        y = jnp.dot(x.astype(jnp.float32), PackedBf16(data, shape).unpack().astype(jnp.float32))
        if epilogue == "gated":
            return gated_reference(y, activation)
        if epilogue == "residual":
            return aux + y.astype(jnp.bfloat16)
        return y.astype(jnp.float32 if epilogue is None else jnp.bfloat16)

    _, tangent = jax.jvp(reference, primals, tangents)
    return _gemm_x(*primals, shape, threads, epilogue, activation, impl), tangent


def packed_argmax(x: jax.Array, w: PackedBf16, *, threads: int | None = None, impl: str | None = None) -> jax.Array:
    """x f32/bf16[M, K] @ w (a ``PackedBf16`` [K, N]) -> i32[M]: each row's first column of the largest sum rounded to
    bf16, ``jnp.argmax(bf16_gemm_packed(x, w, out_dtype=bfloat16, impl=impl), -1)`` without the [M, N] matrix (a
    greedy LM head's tokens: the engine's all-greedy steps). Not differentiable."""
    x = jnp.asarray(x)
    k, n = w.shape
    if x.ndim != 2 or x.shape[1] != k or not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"packed_argmax: x must be floating point [M, {k}] for a [{k}, {n}] weight, "
                         f"got x{x.shape} {x.dtype}")
    if n == 0:
        raise ValueError("packed_argmax: the weight has no columns")
    impl = _impl("packed_argmax", impl)
    x = x if x.dtype == jnp.bfloat16 else x.astype(jnp.float32)
    call = jax.ffi.ffi_call("jaxserve_bf16_gemm_packed", jax.ShapeDtypeStruct((x.shape[0],), jnp.int32),
                            vmap_method="sequential")
    return call(jax.lax.stop_gradient(x), w.data, np.zeros(0, np.float32), np.zeros(0, np.float32),
                np.zeros(0, jnp.bfloat16), threads=threads or default_threads(), epilogue=_EPILOGUES["argmax"], n=n,
                fma=int(impl == "fma"))
