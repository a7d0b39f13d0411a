"""An LM head in int8 (W8A8): weights int8 with one scale per output row (vocabulary entry), activations quantized to
int8 in blocks of 32 (``jaxserve.kernels.cpu.q8``), products summed exactly in integers by AVX-512
VNNI (``vnni.cc``'s ``jaxserve_int8_head_matmul``) for up to ``MAX_ROWS`` rows, by the reference (the same numbers
dequantized, a float32 dot) for more.

Why: at batch 1 a bf16 tied head reads 57 MB a token on SmolLM2-135M, a quarter of a W4A8 decode step; int8 halves
that. ``EngineConfig.lm_head_quantization="int8"`` packs a model's head once (``pack_int8_head``) and keeps a tied
embedding as it is for the lookup (that reads a row a token).

Layout: ``data`` u8[ceil(N / 64) * 4, round_up(K, 32) * 16]; row p (a panel) holds columns 16 p .. 16 p + 15, k-group
j (k 4j .. 4j + 3) at bytes 64 j + 4 c + i: w[16 p + c, 4 j + i] + 128; past N and K: 128 (a zero weight).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax
import jax.numpy as jnp

from jaxserve.kernels.cpu.matmul import MAX_ROWS, default_threads, vnni_usable
from jaxserve.kernels.cpu.q8 import dequantize_activations, quantize_activations

X_BLOCK = 32  # k per scale of the activations


def _round_up(v: int, m: int) -> int:
    return -(-v // m) * m


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Int8Head:
    """A [N, K] head (N outputs: the vocabulary) in int8, packed for ``int8_head_matmul``: see the module docstring."""
    data: jax.Array                                      # u8[ceil(N / 64) * 4, round_up(K, 32) * 16]
    scale: jax.Array                                     # f32[N]: row n's weights are (q - 128) * scale[n]
    shape: tuple[int, int] = dataclasses.field(metadata=dict(static=True))

    def dequantize(self) -> jax.Array:
        """f32[N, K]: the weights the kernel multiplies."""
        n, k = self.shape
        kp = _round_up(k, X_BLOCK)
        panels = self.data.reshape(-1, kp // 4, 16, 4).transpose(0, 2, 1, 3).reshape(-1, kp)[:n, :k]
        return (panels.astype(jnp.float32) - 128) * self.scale[:, None]


def pack_int8_head(w) -> Int8Head:
    """w [N, K] float (a tied embedding, or an untied head's kernel transposed) -> ``Int8Head``: per row n,
    scale = max |w[n]| / 127 and q = round(w / scale) in [-127, 127] (a zero row: scale 0). Jittable."""
    w = jnp.asarray(w, jnp.float32)
    if w.ndim != 2:
        raise ValueError(f"pack_int8_head: w must be 2-D [N, K], got shape {w.shape}")
    n, k = w.shape
    amax = jnp.max(jnp.abs(w), axis=1)
    scale = amax / 127
    q = jnp.clip(jnp.round(w / jnp.where(scale > 0, scale, 1)[:, None]), -127, 127).astype(jnp.int32) + 128
    np_, kp = _round_up(n, 64), _round_up(k, X_BLOCK)
    q = jnp.pad(q, ((0, np_ - n), (0, kp - k)), constant_values=128).astype(jnp.uint8)
    data = q.reshape(np_ // 16, 16, kp // 4, 4).transpose(0, 2, 1, 3).reshape(np_ // 16, kp * 16)
    return Int8Head(data, scale, (n, k))


_pack_jit = jax.jit(pack_int8_head)


def with_int8_head(params: Mapping, tied: bool) -> dict:
    """params with ``int8_head/kernel``, the LM head packed (``pack_int8_head``), which the model then runs
    (``jaxserve.models.transformer.Transformer``): a tied embedding (``embed/embedding`` [V, E]) stays for the lookup;
    an untied ``lm_head/kernel`` [E, V] is replaced."""
    out = dict(params)
    if tied:
        w = params["embed"]["embedding"]
    else:
        w = out.pop("lm_head")["kernel"].T
    if not isinstance(w, jax.Array):
        raise ValueError(f"lm_head_quantization='int8' needs a float LM head, got {type(w).__name__}")
    out["int8_head"] = {"kernel": _pack_jit(w)}
    return out


def int8_head_reference(x: jax.Array, head: Int8Head) -> jax.Array:
    """x f32/bf16[M, K] -> f32[M, N]: x quantized to int8 in blocks of 32 (zeros past K), times the dequantized
    weights, a float32 dot: what the kernel computes, up to float32 rounding."""
    n, k = head.shape
    xp = jnp.pad(jnp.asarray(x, jnp.float32), ((0, 0), (0, _round_up(k, X_BLOCK) - k)))
    xq = dequantize_activations(*quantize_activations(xp, X_BLOCK))[:, :k]
    return jnp.dot(xq, head.dequantize().T, precision=jax.lax.Precision.HIGHEST)


def int8_head_matmul(x: jax.Array, head: Int8Head, *, threads: int | None = None) -> jax.Array:
    """x f32/bf16[M, K] -> f32[M, N] on the VNNI kernel (needs ``matmul.vnni_usable()``): each block's products
    summed exactly in integers, blocks scaled and summed in float32, times the row's scale."""
    n, k = head.shape
    if x.ndim != 2 or x.shape[1] != k:
        raise ValueError(f"int8_head_matmul: x must be [M, {k}] for a [{n}, {k}] head, got x{x.shape}")
    if not vnni_usable():
        raise RuntimeError("int8_head_matmul: the kernel is unavailable (the CPU kernels not built, or no "
                           "AVX-512 VNNI)")
    call = jax.ffi.ffi_call("jaxserve_int8_head_matmul", jax.ShapeDtypeStruct((x.shape[0], n), jnp.float32),
                            vmap_method="sequential")
    return call(x.astype(jnp.float32), head.data, head.scale, threads=threads or default_threads())


def int8_head_logits(head: Int8Head, x: jax.Array) -> jax.Array:
    """x [..., K] -> f32[..., N]: the kernel for up to ``MAX_ROWS`` rows where it runs, else the reference."""
    x2 = x.reshape(-1, x.shape[-1])
    few = x2.shape[0] <= MAX_ROWS and vnni_usable()
    y = int8_head_matmul(x2, head) if few else int8_head_reference(x2, head)
    return y.reshape(*x.shape[:-1], head.shape[0])
