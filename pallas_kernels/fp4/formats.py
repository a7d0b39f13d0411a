"""quantize / dequantize: validated entry points dispatching to the format modules.

Formats and their options (all quantize along one `axis`):
  "nvfp4"  16-element blocks, E4M3 block scales, FP32 tensor scale       (no options)
  "mxfp4"  32-element blocks, E8M0 block scales                           scale_rule="floor" | "ceil"
  "fp8"    E4M3 elements                                                  scaling="tensor" | "channel"
  "int4"   symmetric int4, one FP32 scale per group                       group_size=128
"""
import functools

import jax
import jax.numpy as jnp

from pallas_kernels.fp4.baselines import dequantize_fp8, dequantize_int4, quantize_fp8, quantize_int4
from pallas_kernels.fp4.mxfp4 import MXFP4_BLOCK, dequantize_mxfp4, quantize_mxfp4
from pallas_kernels.fp4.nvfp4 import NVFP4_BLOCK, dequantize_nvfp4, quantize_nvfp4
from pallas_kernels.fp4.quantized_tensor import QuantizedTensor

_QUANTIZE = {"nvfp4": quantize_nvfp4, "mxfp4": quantize_mxfp4, "fp8": quantize_fp8, "int4": quantize_int4}
_DEQUANTIZE = {"nvfp4": dequantize_nvfp4, "mxfp4": dequantize_mxfp4, "fp8": dequantize_fp8, "int4": dequantize_int4}
_OPTIONS = {"nvfp4": {}, "mxfp4": {"scale_rule": "floor"}, "fp8": {"scaling": "tensor"}, "int4": {"group_size": 128}}
FORMATS = tuple(_QUANTIZE)


def _block_size(fmt, opts):
    return {"nvfp4": NVFP4_BLOCK, "mxfp4": MXFP4_BLOCK, "int4": opts.get("group_size", 128)}.get(fmt, 1)


def _validate(x, fmt, axis, opts):
    if fmt not in _QUANTIZE:
        raise ValueError(f"unknown format {fmt!r}; expected one of {FORMATS}")
    unknown = set(opts) - set(_OPTIONS[fmt])
    if unknown:
        raise ValueError(f"format {fmt!r} takes options {sorted(_OPTIONS[fmt])}, got {sorted(unknown)}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"quantize needs a floating-point array, got dtype {x.dtype}")
    if x.ndim == 0 or not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis {axis} is out of range for an array of shape {x.shape}")
    axis %= x.ndim
    bs = _block_size(fmt, opts)
    if fmt == "int4" and (not isinstance(bs, int) or bs < 2 or bs % 2):
        raise ValueError(f"int4 group_size must be an even int >= 2, got {bs!r}")
    if x.shape[axis] % bs:
        raise ValueError(f"{fmt} needs the length along axis {axis} to be a multiple of its block size "
                         f"{bs}; got shape {x.shape}")
    return axis


def quantize(x, fmt, axis=-1, **opts) -> QuantizedTensor:
    """Quantize float x[...] in blocks along `axis` to format `fmt` (see the module docstring).

    Raises ValueError for an unknown format or option, a non-float dtype, a bad axis, or a
    length along `axis` that is not a multiple of the block size. Traceable under jit with
    `fmt`, `axis` and the options static.
    """
    x = jnp.asarray(x)
    axis = _validate(x, fmt, axis, opts)
    return _quantize_jit(x, fmt, axis, tuple(sorted(opts.items())))


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _quantize_jit(x, fmt, axis, opts):
    return _QUANTIZE[fmt](x, axis, **dict(opts))


@functools.partial(jax.jit, static_argnums=(1,))
def _dequantize_jit(qt, dtype):
    return _DEQUANTIZE[qt.fmt](qt).astype(dtype)


def dequantize(qt: QuantizedTensor, dtype=jnp.float32):
    """QuantizedTensor -> dtype[qt.shape] (float32 by default, computed in float32)."""
    if not isinstance(qt, QuantizedTensor):
        raise ValueError(f"dequantize needs a QuantizedTensor, got {type(qt).__name__}")
    return _dequantize_jit(qt, jnp.dtype(dtype))
