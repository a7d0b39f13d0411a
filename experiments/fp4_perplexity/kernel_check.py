"""The Pallas FP4 matmul (interpret mode off a GPU) against the reference on a model's real Dense inputs.

For each FP4 variant of the config (weights-only and ``_w4a4``) and each Dense layer of
``kernel_check_layers``: that layer's float kernel is quantized along K as ``quantize_params`` does,
and ``quantized_matmul`` runs on the layer's input (the first ``kernel_check_tokens`` tokens of the
first window, float32 model) with impl "pallas" and with impl "reference". ``rel_diff`` is
max |pallas - reference| / max |reference|. ``nudge_rel_diff`` is the same measure between the
reference on the input and on the input times (1 + 1e-6 N(0, 1)): how far a rounding-level change
of the input moves the output, the floor against which a W4A4 difference is judged (a one-ulp change
can move an activation across an FP4 rounding boundary).
"""
import jax
import jax.numpy as jnp

from jaxserve.quant import MatmulSettings, quantized_matmul
from jaxserve.quant.evaluate import dense_inputs
from jaxserve.quant.matmul import KERNEL_FORMATS
from pallas_kernels.fp4 import quantize
from pallas_kernels.fp4.quant_error import VARIANTS

NUDGE = 1e-6


ACTIVATION_SUFFIXES = ("_w4a4", "_w4a8")


def split_variant(name: str) -> tuple[str, str]:
    """The VARIANTS key and what the activations are quantized to: ("nvfp4", "w4a4") for "nvfp4_w4a4" (the weight's
    format), ("nvfp4", "w4a8") for "nvfp4_w4a8" (int8 on the weight's blocks: jaxserve.quant.w4a8), ("nvfp4", "")."""
    for suffix in ACTIVATION_SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix), suffix[1:]
    return name, ""


def variant_settings(impl: str, name: str, **kwargs) -> MatmulSettings:
    """The quantized matmul's settings for variant ``name`` under ``impl``."""
    acts = split_variant(name)[1]
    return MatmulSettings(impl, w4a4=acts == "w4a4", w4a8=acts == "w4a8", **kwargs)


def kernel_variants(variants) -> list[str]:
    """The variants whose weights the Pallas kernel reads (NVFP4 and MXFP4; W4A8 has no Pallas kernel)."""
    return [v for v in variants if VARIANTS[split_variant(v)[0]][0] in KERNEL_FORMATS and split_variant(v)[1] != "w4a8"]


def _kernel(params, path: str):
    node = params
    for key in path.split("/"):
        if key not in node:
            raise ValueError(f"kernel_check_layers: {path!r} is not a Dense layer of the model (no {key!r})")
        node = node[key]
    return node["kernel"]


def _rel(a, b) -> float:
    return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


def kernel_vs_reference(params, config, tokens, layers, variants) -> list[dict]:
    """Rows {variant, layer, M, K, N, rel_diff, nudge_rel_diff} on tokens i32[1, T] (see the module docstring)."""
    inputs = dense_inputs(params, config, tokens)
    rows = []
    for name in kernel_variants(variants):
        fmt, opts = VARIANTS[split_variant(name)[0]]
        for layer in layers:
            w = quantize(_kernel(params, layer), fmt, axis=0, **opts)
            x = jnp.asarray(inputs[layer])
            kernel = quantized_matmul(x, w, variant_settings("pallas", name, interpret=True))
            ref = quantized_matmul(x, w, variant_settings("reference", name))
            nudged = x * (1 + NUDGE * jax.random.normal(jax.random.key(0), x.shape))
            ref_nudged = quantized_matmul(nudged, w, variant_settings("reference", name))
            rows.append({"variant": name, "layer": layer, "M": x.shape[0], "K": w.shape[0], "N": w.shape[1],
                         "rel_diff": _rel(kernel, ref), "nudge_rel_diff": _rel(ref_nudged, ref)})
    return rows
