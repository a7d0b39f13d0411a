"""W4A8: FP4 weights times activations quantized to int8 per weight block (llama.cpp's Q8 activations:
``jaxserve.kernels.cpu.q8``), the reference the CPU kernel (``jaxserve.kernels.cpu.fp4_w4a8_matmul_cpu``) is checked
against."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxserve.kernels.cpu.q8 import dequantize_activations, quantize_activations
from pallas_kernels.fp4 import QuantizedTensor, dequantize

__all__ = ["FORMATS", "dequantize_activations", "quantize_activations", "w4a8_matmul_reference"]

FORMATS = ("nvfp4", "mxfp4")


def w4a8_matmul_reference(x: jax.Array, w: QuantizedTensor, out_dtype=None) -> jax.Array:
    """x[..., K] @ w (nvfp4/mxfp4 [K, N] along K) with x quantized to int8 on w's blocks: a float32 dot of the
    dequantized operands -> out_dtype[..., N] (default x.dtype)."""
    if w.fmt not in FORMATS or w.axis != 0 or len(w.shape) != 2:
        raise ValueError(f"w4a8 needs a 2-D {FORMATS} weight quantized along axis 0, got fmt={w.fmt!r} "
                         f"axis={w.axis} shape={w.shape}")
    x = jnp.asarray(x)
    xq = dequantize_activations(*quantize_activations(x.astype(jnp.float32), w.block_size))
    y = jnp.dot(xq, dequantize(w, jnp.float32), precision=jax.lax.Precision.HIGHEST)
    return y.astype(out_dtype or x.dtype)
