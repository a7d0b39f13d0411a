"""The W4A8 CPU kernel (jaxserve/kernels/cpu/vnni.cc) against its reference (jaxserve.quant.w4a8), and the
reference's activation quantization against llama.cpp's Q8 rule. Kernel tests skip without AVX-512 VNNI."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.kernels.cpu import build
from jaxserve.kernels.cpu import matmul as cpu
from jaxserve.quant.w4a8 import dequantize_activations, quantize_activations, w4a8_matmul_reference
from pallas_kernels.fp4 import dequantize, fp4_matmul_reference, quantize

needs_w4a8 = pytest.mark.skipif(build.unavailable_reason() is not None or cpu.build.load() is None
                                or not cpu.vnni_usable(), reason="no W4A8 CPU kernel (needs AVX-512 VNNI)")


def _rel(got, want):
    return float(jnp.max(jnp.abs(got - want)) / jnp.maximum(jnp.max(jnp.abs(want)), 1e-30))


def test_quantize_activations_is_q8_per_block():
    """d = amax / 127, q = round(x / d) ties to even within [-127, 127]; zeros stay zeros; a NaN or an infinity
    makes its block's d NaN; the error is at most d / 2 an element."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    x[1, :16] = 0
    x[2, 16:32] = np.linspace(-2.54, 2.54, 16)  # amax 2.54: d = 0.02, x / d has exact .5 ties at +-0.5, 1.5 ...
    x[2, 32] = np.nan
    x[2, 48] = np.inf
    q, d = quantize_activations(jnp.asarray(x), 16)
    q, d = np.asarray(q), np.asarray(d)
    assert q.dtype == np.int8 and d.shape == (3, 4)
    blocks = x.reshape(3, 4, 16)
    amax = np.abs(blocks).max(-1)
    np.testing.assert_allclose(d[:2], (amax / np.float32(127))[:2], rtol=2e-7)  # XLA may divide by a reciprocal
    assert np.all(np.abs(q) <= 127) and np.all(q[1, :16] == 0) and d[1, 0] == 0
    assert np.isnan(d[2, 2]) and np.isnan(d[2, 3]) and not np.isnan(d[2, :2]).any()
    inv = np.float32(127) / amax[2, 1]
    np.testing.assert_array_equal(q[2, 16:32], np.round(x[2, 16:32] * inv))  # numpy rounds ties to even
    back = np.asarray(dequantize_activations(jnp.asarray(q), jnp.asarray(d)))
    ok = np.isfinite(np.repeat(d, 16, axis=1))
    assert np.all(np.abs(back - x)[ok] <= np.repeat(d, 16, axis=1)[ok] / 2 * (1 + 1e-6))


@needs_w4a8
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("m, k, n", [(1, 576, 576), (2, 64, 37), (5, 1536, 200), (16, 96, 17), (3, 32, 64),
                                     (4, 576, 1536), (7, 128, 65), (1, 32, 1), (70, 576, 200), (130, 64, 130)])
@pytest.mark.parametrize("x_dtype", [jnp.float32, jnp.bfloat16])
def test_w4a8_matches_reference(fmt, m, k, n, x_dtype):
    """Integer block sums are exact, so the kernel is the reference up to float32 rounding of the block sums; and
    W4A8 stays near the weight-only product (int8 activations lose ~1% of a dot product here)."""
    rng = np.random.default_rng(k + n + m)
    x = jnp.asarray(rng.standard_normal((m, k)), x_dtype)
    w = quantize(jnp.asarray(rng.standard_normal((k, n)) * 0.05, jnp.float32), fmt, axis=0)
    got = jax.jit(lambda x, w: cpu.fp4_w4a8_matmul_cpu(x, w, out_dtype=jnp.float32))(x, w)
    assert _rel(got, w4a8_matmul_reference(x, w, out_dtype=jnp.float32)) <= 3e-6
    assert _rel(got, fp4_matmul_reference(x, w, out_dtype=jnp.float32)) <= 3e-2


@needs_w4a8
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_w4a8_every_scale_byte(fmt):
    """Every scale byte (E4M3: subnormals, 448, the NaNs 0x7F / 0xFF; E8M0: 2^-127 .. 2^127, NaN 0xFF) decodes as
    dequantize's: a weight whose block scales walk through all 256 bytes."""
    rng = np.random.default_rng(5)
    k, n = 64, 256
    w = quantize(jnp.asarray(rng.standard_normal((k, n)), jnp.float32), fmt, axis=0)
    nb = w.scales.shape[0]
    # column c's blocks: bytes c, c + 4, c + 8, ... (nvfp4: the NaN bytes then fall in each of the 4 vectors a
    # kernel step decodes); mxfp4: c in every block (its extremes are left out below)
    step = 4 if fmt == "nvfp4" else 0
    byte = ((np.arange(n)[None, :] + step * np.arange(nb)[:, None]) % 256).astype(np.uint8)
    scales = jax.lax.bitcast_convert_type(jnp.asarray(byte), w.scales.dtype) if fmt == "nvfp4" else jnp.asarray(byte)
    w = dataclasses.replace(w, scales=scales, tensor_scale=jnp.float32(1.0) if fmt == "mxfp4" else w.tensor_scale)
    x = jnp.asarray(rng.standard_normal((1, k)), jnp.float32)
    got = np.asarray(cpu.fp4_w4a8_matmul_cpu(x, w))
    want = np.asarray(w4a8_matmul_reference(x, w))
    # E8M0's extremes under- or overflow float32 in either order of operations (a flushed subnormal, inf against
    # inf - inf): compare the columns whose products stay normal
    cols = np.arange(n) if fmt == "nvfp4" else np.arange(10, 250)
    np.testing.assert_array_equal(np.isnan(got[:, cols]), np.isnan(want[:, cols]))
    assert np.isnan(want[:, 0x7F]).all() if fmt == "nvfp4" else np.isnan(want[:, 0xFF]).all()
    # each column to the size of its products (sums of both signs cancel)
    xq = dequantize_activations(*quantize_activations(x, w.block_size))
    size = np.asarray(jnp.abs(xq) @ jnp.abs(dequantize(w, jnp.float32)))
    ok = np.isfinite(want[:, cols])
    assert ok.sum() > len(cols) // 2
    assert np.all(np.abs(got - want)[:, cols][ok] <= 3e-6 * size[:, cols][ok])


@needs_w4a8
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_w4a8_rows_do_not_depend_on_m_or_threads(fmt):
    rng = np.random.default_rng(28)
    x = jnp.asarray(rng.standard_normal((70, 576)), jnp.bfloat16)  # 70 rows: past 64, one decoding of the weights
    w = quantize(jnp.asarray(rng.standard_normal((576, 1000)) * 0.05, jnp.float32), fmt, axis=0)
    mm = lambda x, t: np.asarray(cpu.fp4_w4a8_matmul_cpu(x, w, out_dtype=jnp.float32, threads=t))  # noqa: E731
    full = mm(x, 2)
    np.testing.assert_array_equal(mm(x, 1), full)
    for rows in (slice(0, 1), slice(3, 5), slice(5, 12), slice(15, 16), slice(0, 16), slice(60, 70)):
        np.testing.assert_array_equal(mm(x[rows], 2), full[rows])


@needs_w4a8
def test_w4a8_zero_and_non_finite_activations():
    rng = np.random.default_rng(9)
    w = quantize(jnp.asarray(rng.standard_normal((64, 40)), jnp.float32), "nvfp4", axis=0)
    x = np.zeros((3, 64), np.float32)
    x[1] = rng.standard_normal(64)
    x[1, 17] = np.nan
    x[2] = rng.standard_normal(64)
    x[2, 5] = -np.inf
    got = np.asarray(cpu.fp4_w4a8_matmul_cpu(jnp.asarray(x), w))
    assert np.all(got[0] == 0) and np.all(np.isnan(got[1])) and np.all(np.isnan(got[2]))


@needs_w4a8
def test_w4a8_rejects_what_it_cannot_read():
    w = quantize(jnp.ones((32, 4)), "nvfp4", axis=0)
    with pytest.raises(ValueError, match="does not contract"):
        cpu.fp4_w4a8_matmul_cpu(jnp.zeros((1, 16)), w)
    with pytest.raises(ValueError, match="nvfp4/mxfp4 QuantizedTensor along axis 0"):
        cpu.fp4_w4a8_matmul_cpu(jnp.zeros((1, 32)), quantize(jnp.ones((32, 4)), "fp8", axis=0))
    with pytest.raises(ValueError, match="along axis 0"):
        cpu.fp4_w4a8_matmul_cpu(jnp.zeros((1, 4)), quantize(jnp.ones((4, 32)), "nvfp4", axis=1))
