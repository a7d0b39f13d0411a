"""The quantized matmul on a device mesh: every shard multiplies its own slice of the weight, in ``shard_map``.

Axis names: K input features, N output features (a Dense kernel is [K, N], quantized in blocks along K).

GSPMD cannot split a Pallas kernel call (nor, on CPU, see through its interpreted tile loops): given a sharded
``QuantizedTensor``, ``fp4_matmul`` would run on weights gathered whole. So under a layout
(``jaxserve.parallel.layout``) a Dense layer with a quantized kernel runs per shard, split as the rule table
(``jaxserve.parallel.sharding``) placed the kernel, whichever matmul ``kernel_for`` picks (Pallas portable, Triton,
Mosaic GPU, or the dequantize-then-dot reference):

- column-parallel (N split: q/k/v/gate/up): x [..., K] whole on every shard, each multiplies by its N/T columns and
  keeps its slice of y [..., N], as GSPMD leaves the float layer's output;
- row-parallel (K split: o/down): x [..., K] split on K (as the float layer's input arrives), each shard multiplies
  its K/T slice (its packed codes and whole scale blocks) and a ``psum`` over the axis adds the partial products:
  the one all-reduce the float layer has;
- no rule (a quantized lm_head, say): every device runs the whole matmul.

Tensor scales are whole on every device, so each shard dequantizes as one device does. NVFP4 W4A4 emulation scales
x by one amax over all of x: under a K split, x is fake-quantized whole (as ``fp4_matmul_reference`` does) before
the shards multiply, where a shard alone would see only its slice's amax.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from pallas_kernels.fp4 import QuantizedTensor, dequantize, quantize
from jaxserve.parallel.layout import Layout
from jaxserve.parallel.sharding import DEFAULT_RULES, axis_ways, quantized_spec, spec_for


def sharded_quantized_matmul(matmul: Callable, x: jax.Array, w: QuantizedTensor, settings, layout: Layout,
                             path: str, out_dtype=None) -> jax.Array:
    """``matmul`` (``jaxserve.quant.matmul.quantized_matmul``, passed in: that module's Dense interceptor calls
    this one) on every shard of ``layout``'s mesh: x [..., K] @ w [K, N] -> out_dtype[..., N].

    settings: its ``MatmulSettings``; path: the kernel's params path (e.g. "layers_0/attn/o_proj/kernel"), which
    picks its rule; each shard's matmul sees a QuantizedTensor of its local shape [K/ways, N/ways]."""
    mesh = layout.mesh
    spec = spec_for(path, w.shape, mesh, DEFAULT_RULES, layout.axis_map)
    k_axis, n_axis = tuple(spec) + (None,) * (2 - len(spec))
    w_specs = quantized_spec(path, w, P(k_axis, n_axis), mesh)
    local_shape = (w.shape[0] // axis_ways(k_axis, mesh), w.shape[1] // axis_ways(n_axis, mesh))
    lead = (None,) * (x.ndim - 1)
    if settings.w4a4 and w.fmt == "nvfp4" and k_axis is not None:
        x = dequantize(quantize(x.astype(jnp.float32), "nvfp4", axis=-1)).astype(x.dtype)
        settings = dataclasses.replace(settings, w4a4=False)

    def local(xs, ws):
        y = matmul(xs, ws.replace(shape=local_shape), settings, out_dtype=out_dtype)
        return y if k_axis is None else jax.lax.psum(y, k_axis)

    return jax.shard_map(local, mesh=mesh, in_specs=(P(*lead, k_axis), w_specs), out_specs=P(*lead, n_axis),
                         check_vma=False)(x, w)
