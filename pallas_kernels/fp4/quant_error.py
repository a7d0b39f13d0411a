"""Quantization error of the formats on any array: MSE and SQNR (dB), for experiments.

`quantization_error(x, variant)` works on any float array (synthetic matrices today, model
weights and activations later); `VARIANTS` names every format/option pair the experiment compares.
"""
import numpy as np

from pallas_kernels.fp4.formats import dequantize, quantize

# name -> (fmt, options)
VARIANTS = {
    "nvfp4": ("nvfp4", {}),
    "mxfp4_floor": ("mxfp4", {"scale_rule": "floor"}),
    "mxfp4_ceil": ("mxfp4", {"scale_rule": "ceil"}),
    "fp8_tensor": ("fp8", {"scaling": "tensor"}),
    "fp8_channel": ("fp8", {"scaling": "channel"}),
    "int4_g128": ("int4", {"group_size": 128}),
}


def quantization_error(x, variant, axis=0):
    """Round-trip x through `variant` (a VARIANTS key) along `axis`.

    Returns {"mse", "sqnr_db", "bits_per_element"}; SQNR = 10 log10(sum x^2 / sum (x - x_hat)^2),
    both sums in float64.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; expected one of {sorted(VARIANTS)}")
    fmt, opts = VARIANTS[variant]
    qt = quantize(x, fmt, axis=axis, **opts)
    x64 = np.asarray(x, np.float64)
    err = np.asarray(dequantize(qt), np.float64) - x64
    noise = float(np.sum(err**2))
    signal = float(np.sum(x64**2))
    sqnr = float("inf") if noise == 0 else 10.0 * np.log10(signal / noise)
    return {"mse": noise / x64.size, "sqnr_db": sqnr, "bits_per_element": qt.bits_per_element}
