"""quantization_error: the measure used by experiments/fp4_quant_error."""
import numpy as np
import pytest

from pallas_kernels import fp4
from pallas_kernels.fp4.quant_error import VARIANTS, quantization_error


def test_mse_and_sqnr_match_a_direct_computation():
    x = np.random.default_rng(0).standard_t(4, (128, 64)).astype(np.float32)
    got = quantization_error(x, "mxfp4_floor")
    err = np.asarray(fp4.dequantize(fp4.quantize(x, "mxfp4", axis=0)), np.float64) - x
    assert got["mse"] == pytest.approx(np.mean(err**2), rel=1e-12)
    assert got["sqnr_db"] == pytest.approx(10 * np.log10(np.sum(x.astype(np.float64)**2) / np.sum(err**2)), rel=1e-12)


def test_every_variant_runs_and_fp8_beats_the_4_bit_formats():
    x = np.random.default_rng(1).standard_normal((128, 64)).astype(np.float32)
    sqnr = {v: quantization_error(x, v)["sqnr_db"] for v in VARIANTS}
    assert min(sqnr["fp8_tensor"], sqnr["fp8_channel"]) > max(sqnr[v] for v in VARIANTS if not v.startswith("fp8"))


def test_unknown_variant_is_rejected():
    with pytest.raises(ValueError, match="unknown variant"):
        quantization_error(np.ones((128, 1), np.float32), "nvfp8")
