"""Accuracy of a quantized model: validation perplexity and weight quantization error.

Axis names: W windows, L window length (seq_len + 1), B batch of windows.
"""
from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import numpy as np

from jaxserve.config import ModelConfig
from jaxserve.models import forward_full
from jaxserve.models.likelihood import token_nll
from jaxserve.quant.matmul import MatmulSettings, matmul_context
from jaxserve.quant.params import DEFAULT_EXCLUDE, QUANTIZE, kernel_plan, leaf_path, path_matches
from pallas_kernels.fp4.quant_error import VARIANTS, quantization_error


@functools.lru_cache(maxsize=32)
def _row_nll(config: ModelConfig, settings: MatmulSettings | None):
    # One jitted function per (config, settings): the settings are fixed at trace time, so two
    # settings must never share a jit cache (see jaxserve/quant/matmul.py).
    def fn(params, windows):
        with matmul_context(settings):
            return token_nll(params, config, windows).sum(axis=-1)
    return jax.jit(fn)


def perplexity(params, config: ModelConfig, windows: np.ndarray, settings: MatmulSettings | None = None,
               batch_size: int = 8) -> dict:
    """Mean next-token NLL and perplexity over windows i32[W, L]; quantized params need ``settings``.

    Same definition as ``jaxserve.train.step.evaluate`` (float64 accumulation on the host), plus
    ``window_loss``: the mean NLL of each window (for paired comparisons between variants).
    """
    fn, rows = _row_nll(config, settings), []
    for i in range(0, len(windows), batch_size):
        chunk = windows[i:i + batch_size]
        padded = np.resize(chunk, (batch_size,) + chunk.shape[1:])  # one compiled shape
        rows.append(np.asarray(fn(params, padded), np.float64)[:len(chunk)])
    rows = np.concatenate(rows)
    n = rows.size * (windows.shape[1] - 1)
    mean = float(rows.sum()) / n
    return {"val_loss": mean, "val_ppl": math.exp(mean), "val_tokens": n,
            "window_loss": (rows / (windows.shape[1] - 1)).tolist()}


def weight_error(params, variant: str, *, include=None, exclude=DEFAULT_EXCLUDE) -> dict:
    """Quantization error of the Dense kernels ``quantize_params`` would select for ``variant``.

    variant: a ``pallas_kernels.fp4.quant_error.VARIANTS`` key. Returns the pooled MSE and SQNR
    (10 log10 of sum x^2 over sum err^2, all selected kernels together), the lowest per-kernel SQNR
    and its path, and how many kernels were measured (NaN figures when none is selected).
    """
    fmt, opts = VARIANTS[variant]
    plan = kernel_plan(params, fmt, include=include, exclude=exclude, **opts)
    leaves = {leaf_path(p): x for p, x in jax.tree_util.tree_leaves_with_path(params)}
    signal = noise = count = 0.0
    worst = (math.inf, "")
    for path, what in plan.items():
        if what != QUANTIZE:
            continue
        x = np.asarray(leaves[path], np.float64)
        e = quantization_error(leaves[path], variant, axis=0)
        signal, noise, count = signal + np.sum(x * x), noise + e["mse"] * x.size, count + x.size
        worst = min(worst, (e["sqnr_db"], path))
    if not count:  # e.g. int4_g128 on a model whose K are all below 128
        return {"mse": math.nan, "sqnr_db": math.nan, "min_sqnr_db": math.nan, "min_sqnr_kernel": "",
                "num_kernels": 0, "num_dense_kernels": len(plan)}
    return {"mse": noise / count, "sqnr_db": 10 * math.log10(signal / noise), "min_sqnr_db": float(worst[0]),
            "min_sqnr_kernel": worst[1], "num_kernels": sum(v == QUANTIZE for v in plan.values()),
            "num_dense_kernels": len(plan)}


def dense_inputs(params, config: ModelConfig, tokens) -> dict[str, np.ndarray]:
    """The input f32[B*L, K] of every Dense layer in ``forward_full(params, config, tokens i32[B, L])``.

    Keyed by module path (``layers_0/attn/q_proj``).
    """
    def run(params, tokens):
        seen = {}

        def record(next_fun, args, kwargs, context):
            if isinstance(context.module, nn.Dense) and context.method_name == "__call__":
                seen["/".join(context.module.scope.path)] = args[0] if args else kwargs["inputs"]
            return next_fun(*args, **kwargs)

        with nn.intercept_methods(record):
            forward_full(params, config, tokens)
        return seen

    return {k: np.asarray(x, np.float32).reshape(-1, x.shape[-1]) for k, x in jax.jit(run)(params, tokens).items()}


def activation_error(inputs: dict[str, np.ndarray], variant: str, exclude=DEFAULT_EXCLUDE) -> dict:
    """Pooled MSE/SQNR of ``variant`` on Dense inputs f32[M, K] quantized along K, as W4A4 would.

    Inputs of layers matching ``exclude`` (as in quantize_params), or whose K is not a multiple of
    the variant's block size, are left out; ``num_inputs`` counts the rest.
    """
    signal = noise = count = 0.0
    used = 0
    for path, x in inputs.items():
        if any(path_matches(path, pat) for pat in exclude):
            continue
        try:
            e = quantization_error(x, variant, axis=-1)
        except ValueError:  # K not a multiple of the block size
            continue
        x64 = x.astype(np.float64)
        signal, noise, count, used = signal + np.sum(x64 * x64), noise + e["mse"] * x.size, count + x.size, used + 1
    if not count:
        return {"mse": math.nan, "sqnr_db": math.nan, "num_inputs": 0}
    return {"mse": noise / count, "sqnr_db": 10 * math.log10(signal / noise), "num_inputs": used}
