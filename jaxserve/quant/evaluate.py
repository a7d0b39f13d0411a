"""Accuracy of a quantized model: validation perplexity and weight quantization error.

Axis names: W windows, L window length (seq_len + 1), B batch of windows.
"""
from __future__ import annotations

import functools
import math

import jax
import numpy as np

from jaxserve.config import ModelConfig
from jaxserve.quant.matmul import MatmulSettings, matmul_context
from jaxserve.quant.params import DEFAULT_EXCLUDE, kernel_plan, QUANTIZE
from jaxserve.train.step import token_nll
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

    Same definition as ``jaxserve.train.step.evaluate`` (float64 accumulation on the host).
    """
    fn, total, n = _row_nll(config, settings), 0.0, 0
    for i in range(0, len(windows), batch_size):
        chunk = windows[i:i + batch_size]
        padded = np.resize(chunk, (batch_size,) + chunk.shape[1:])  # one compiled shape
        total += float(np.asarray(fn(params, padded), np.float64)[:len(chunk)].sum())
        n += chunk.shape[0] * (chunk.shape[1] - 1)
    return {"val_loss": total / n, "val_ppl": math.exp(total / n), "val_tokens": n}


def weight_error(params, variant: str, *, include=None, exclude=DEFAULT_EXCLUDE) -> dict:
    """Quantization error of the Dense kernels ``quantize_params`` would select for ``variant``.

    variant: a ``pallas_kernels.fp4.quant_error.VARIANTS`` key. Returns the pooled MSE and SQNR
    (10 log10 of sum x^2 over sum err^2, all selected kernels together), the lowest per-kernel SQNR
    and its path, and how many kernels were measured (NaN figures when none is selected).
    """
    fmt, opts = VARIANTS[variant]
    plan = kernel_plan(params, fmt, include=include, exclude=exclude, **opts)
    leaves = {"/".join(str(k.key) for k in p): x for p, x in jax.tree_util.tree_leaves_with_path(params)}
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
