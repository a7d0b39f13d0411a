"""fp4_matmul (Pallas, interpret mode on CPU) against dequantize-then-dot, W4A4, bad inputs."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import fp4

REL_TOL = 1e-5


def _data(m, k, n, seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((m, k)), dtype)
    w = rng.standard_t(4, (k, n)).astype(np.float32)
    return x, w


def _assert_rel_close(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= REL_TOL * scale, np.abs(got - want).max() / scale
    assert np.linalg.norm(got - want) <= REL_TOL * np.linalg.norm(want)


# (M, K, N, format options, block_sizes, x dtype): M = 1, K and N off the tile, bf16, several tiles
SWEEP = [
    (1, 64, 48, {"fmt": "nvfp4"}, None, np.float32),
    (5, 80, 24, {"fmt": "nvfp4"}, (8, 16, 32), np.float32),         # K=80 pads to 96, N=24 to 32
    (33, 160, 40, {"fmt": "mxfp4"}, (16, 16, 64), np.float32),      # K=160 pads to 192
    (3, 96, 64, {"fmt": "mxfp4", "scale_rule": "ceil"}, (8, 32, 64), np.float32),
    (16, 128, 64, {"fmt": "nvfp4"}, None, jnp.bfloat16),
    (70, 48, 16, {"fmt": "nvfp4"}, (32, 16, 32), jnp.bfloat16),     # 3 M tiles, K=48 pads to 64
]


@pytest.mark.parametrize("m, k, n, fmt, block_sizes, dtype", SWEEP)
def test_kernel_matches_dequantize_then_dot(m, k, n, fmt, block_sizes, dtype):
    x, w = _data(m, k, n, seed=m * 1000 + k + n, dtype=dtype)
    qw = fp4.quantize(w, axis=0, **fmt)
    got = fp4.fp4_matmul(x, qw, block_sizes=block_sizes, out_dtype=jnp.float32)
    want = jnp.dot(x.astype(jnp.float32), fp4.dequantize(qw), precision=jax.lax.Precision.HIGHEST)
    _assert_rel_close(got, want)


def test_default_out_dtype_is_x_dtype_and_leading_axes_are_kept():
    x, w = _data(6, 64, 32, seed=1, dtype=jnp.bfloat16)
    qw = fp4.quantize(w, "nvfp4", axis=0)
    got = fp4.fp4_matmul(x.reshape(2, 3, 64), qw)
    assert got.dtype == jnp.bfloat16 and got.shape == (2, 3, 32)
    want = fp4.fp4_matmul_reference(x, qw, out_dtype=jnp.float32).reshape(2, 3, 32)
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=1e-2, atol=1e-2)


def _blockwise_w4a4(x, qw):
    """W4A4 as Transformer Engine's reference GEMM: per-block code products, scaled after, in float64."""
    qx = fp4.quantize(x, "nvfp4", axis=1)
    px, pw = np.asarray(qx.data), np.asarray(qw.data)
    cx = np.stack([px & 15, px >> 4], axis=-1).reshape(px.shape[0], -1)      # element 2i low nibble
    cw = np.stack([pw & 15, pw >> 4], axis=1).reshape(-1, pw.shape[1])
    cx, cw = fp4.E2M1_VALUES[cx].astype(np.float64), fp4.E2M1_VALUES[cw].astype(np.float64)
    sx = np.asarray(qx.scales).astype(np.float64)
    sw = np.asarray(qw.scales).astype(np.float64)
    y = sum(np.outer(sx[:, b], sw[b]) * (cx[:, 16 * b:16 * b + 16] @ cw[16 * b:16 * b + 16])
            for b in range(sx.shape[1]))
    return y * float(qx.tensor_scale) * float(qw.tensor_scale)


def test_w4a4_nvfp4_matches_blockwise_scaled_gemm():
    x, w = _data(7, 96, 40, seed=2)
    x = x.at[0].multiply(100.0)  # one outlier token: the activation tensor scale matters
    qw = fp4.quantize(w, "nvfp4", axis=0)
    got = fp4.fp4_matmul(x, qw, w4a4=True, block_sizes=(8, 16, 32))
    _assert_rel_close(got, _blockwise_w4a4(x, qw))
    _assert_rel_close(got, fp4.fp4_matmul_reference(x, qw, w4a4=True))
    assert np.abs(np.asarray(got) - np.asarray(fp4.fp4_matmul_reference(x, qw))).max() > 1e-3  # A4 is lossy


def test_w4a4_mxfp4_matches_reference():
    x, w = _data(4, 128, 32, seed=3)
    qw = fp4.quantize(w, "mxfp4", axis=0, scale_rule="ceil")
    got = fp4.fp4_matmul(x, qw, w4a4=True, block_sizes=(8, 16, 64))
    _assert_rel_close(got, fp4.fp4_matmul_reference(x, qw, w4a4=True))


def test_bfloat16_precision_mode_is_close():
    x, w = _data(4, 64, 32, seed=4)
    qw = fp4.quantize(w, "nvfp4", axis=0)
    got = fp4.fp4_matmul(x, qw, precision="bfloat16")
    want = fp4.fp4_matmul_reference(x, qw)
    assert np.linalg.norm(np.asarray(got) - want) <= 1e-2 * np.linalg.norm(want)


def test_quantized_weight_passes_through_jit_as_a_param():
    x, w = _data(2, 64, 16, seed=5)
    params = {"w": fp4.quantize(w, "nvfp4", axis=0)}
    got = jax.jit(lambda p, a: fp4.fp4_matmul(a, p["w"]))(params, x)
    _assert_rel_close(got, fp4.fp4_matmul_reference(x, params["w"]))


def test_block_size_table():
    assert fp4.pick_block_sizes(1, 8192, 8192) == (16, 64, 256)
    assert fp4.pick_block_sizes(128, 8192, 8192) == (128, 128, 128)
    assert fp4.pick_block_sizes(1, 24, 48) == (16, 32, 64)


@pytest.mark.parametrize("x, w_spec, kw, match", [
    (np.ones((2, 48), np.float32), ("nvfp4", 0), {}, r"shape mismatch.*\(2, 48\).*\(64, 32\)"),
    (np.ones((2, 64), np.int32), ("nvfp4", 0), {}, "dtype int32"),
    (np.ones((2, 64), np.float32), ("nvfp4", 1), {}, "quantized along K"),
    (np.ones((2, 64), np.float32), ("fp8", 0), {}, "fmt='fp8'"),
    (np.ones((2, 64), np.float32), None, {}, "QuantizedTensor"),
    (np.ones((2, 64), np.float32), ("mxfp4", 0), {"block_sizes": (8, 16, 48)}, "multiple"),
    (np.ones((2, 64), np.float32), ("nvfp4", 0), {"precision": "fp16"}, "precision"),
])
def test_bad_input_raises_a_clear_value_error(x, w_spec, kw, match):
    w = np.random.default_rng(6).standard_normal((64, 32)).astype(np.float32)
    w = w if w_spec is None else fp4.quantize(w, w_spec[0], axis=w_spec[1])
    with pytest.raises(ValueError, match=match):
        fp4.fp4_matmul(x, w, **kw)


def test_weight_k_not_a_multiple_of_the_block_size_is_rejected_at_quantize():
    with pytest.raises(ValueError, match="multiple of its block size 16"):
        fp4.quantize(np.ones((72, 8), np.float32), "nvfp4", axis=0)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 128])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_compiled_kernel_on_gpu_matches_reference(m, fmt):
    x, w = _data(m, 1024, 512, seed=m)
    qw = fp4.quantize(w, fmt, axis=0)
    got = fp4.fp4_matmul(x, qw, interpret=False)
    _assert_rel_close(got, fp4.fp4_matmul_reference(x, qw))
    got4 = fp4.fp4_matmul(x, qw, interpret=False, w4a4=True)
    _assert_rel_close(got4, fp4.fp4_matmul_reference(x, qw, w4a4=True))
