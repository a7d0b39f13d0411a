"""The experimental Mosaic GPU FP4 matmul (pallas_kernels/fp4/mosaic.py).

On CPU: it lowers through Pallas' Mosaic GPU rules for CUDA (an abstract H200, explicit Lane-semantics
compiler params), and it runs in Mosaic GPU's CPU interpreter against dequantize-then-dot: the same
TMA copies (the reordered weight slabs and repeated scale tiles), barriers, K pipeline, unpacking,
both WGMMAs and the output copy as compiled; only the register layouts are dropped there.
On a GPU (-m gpu): compiled for real (benchmarks/gpu_check.sh runs this file in its own step).
Tolerance: x in bf16 and the weights exact in bf16, so the products are exact and only the float32
summation order differs from the reference: 1e-5 of the output's max |value| (and in norm).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import _compat, fp4
from pallas_kernels.fp4 import mosaic

REL_TOL = 1e-5


def _data(m, k, n, seed, fmt, dtype=jnp.bfloat16, **opts):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((m, k)), dtype)
    w = rng.standard_t(4, (k, n)).astype(np.float32) * np.exp(rng.normal(0, 2, (k // 16, 1, n)).repeat(16, 1).reshape(k, n))
    return x, fp4.quantize(jnp.asarray(w, jnp.float32), fmt, axis=0, **opts)


def _assert_rel_close(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= REL_TOL * np.abs(want).max(), np.abs(got - want).max() / np.abs(want).max()
    assert np.linalg.norm(got - want) <= REL_TOL * np.linalg.norm(want)


def _reference(x, qw):
    """Dequantize, then a float32 dot, on x as the kernel reads it (bf16)."""
    return fp4.fp4_matmul_reference(x.astype(jnp.bfloat16), qw, out_dtype=jnp.float32)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("m,k,n,block_n,splits,stages", [
    (1, 1024, 256, 64, 2, 2), (48, 512, 384, 128, 1, 2), (100, 256, 64, 64, 1, 2)])
def test_lowers_for_cuda(fmt, m, k, n, block_n, splits, stages):
    x, qw = _data(m, k, n, seed=0, fmt=fmt)
    fn = jax.jit(lambda x, w: mosaic._fp4_matmul_mosaic_call(
        x, w, block_n=block_n, num_splits=splits, num_stages=stages, interpret=None, out_dtype=jnp.bfloat16))
    with _compat.abstract_gpu():
        text = fn.trace(jax.ShapeDtypeStruct(x.shape, x.dtype), qw).lower(lowering_platforms=("cuda",)).as_text()
    assert "custom_call @mosaic_gpu" in text


# (M, K, N, format options, block_n, num_splits, num_stages, x dtype)
INTERPRET_CASES = [
    (1, 512, 128, {"fmt": "nvfp4"}, 64, 2, 2, jnp.bfloat16),      # 4 steps over 2 splits, both slots
    (5, 288, 40, {"fmt": "mxfp4"}, 64, 1, 2, jnp.bfloat16),       # K pads to 512, N to 64
    (70, 256, 128, {"fmt": "nvfp4"}, 128, 1, 3, jnp.float32),     # two M tiles, f32 x rounded to bf16
    (8, 512, 64, {"fmt": "mxfp4", "scale_rule": "ceil"}, 64, 1, 3, jnp.bfloat16),
]


@pytest.mark.parametrize("m,k,n,opts,block_n,splits,stages,dtype", INTERPRET_CASES)
def test_interpreted_matches_reference(m, k, n, opts, block_n, splits, stages, dtype):
    x, qw = _data(m, k, n, seed=m + k + n, dtype=dtype, **opts)
    got = mosaic.fp4_matmul_mosaic(x, qw, block_n=block_n, num_splits=splits, num_stages=stages,
                                   interpret=_compat.mosaic_interpret_params(), out_dtype=jnp.float32)
    _assert_rel_close(got, _reference(x, qw))


def test_default_tiles_out_dtype_and_leading_axes():
    x, qw = _data(6, 256, 64, seed=1, fmt="nvfp4")
    got = mosaic.fp4_matmul_mosaic(x.reshape(2, 3, 256), qw)  # interpret=None: the interpreter on CPU
    assert got.dtype == jnp.bfloat16 and got.shape == (2, 3, 64)
    want = _reference(x, qw).reshape(2, 3, 64)
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=1e-2, atol=1e-2 * float(np.abs(want).max()))


def test_smem_estimate_is_what_lowering_counts():
    """The lowering's own check (it counts barriers too) fails just where smem_bytes says it would."""
    x = jax.ShapeDtypeStruct((8, 512), jnp.bfloat16)
    _, qw = _data(8, 512, 128, seed=4, fmt="mxfp4")
    with _compat.abstract_gpu(), pytest.raises(ValueError, match="exceeds available shared memory"):
        jax.jit(lambda x, w: mosaic._fp4_matmul_mosaic_call(
            x, w, block_n=128, num_splits=1, num_stages=3, interpret=None, out_dtype=jnp.bfloat16)
        ).trace(x, qw).lower(lowering_platforms=("cuda",))
    assert mosaic.smem_bytes("mxfp4", 128, 3) > mosaic.SMEM_BYTES >= mosaic.smem_bytes("mxfp4", 128, 2)


def test_minmax_e2m1_decode_equals_the_codec():
    codes = jnp.arange(256, dtype=jnp.int32)  # high bits are ignored, as the kernel's >> 4 relies on
    got, want = np.asarray(mosaic.decode_e2m1_minmax(codes)), np.asarray(fp4.decode_e2m1(codes))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_pick_tiles():
    assert mosaic.pick_tiles(1, 8192, 8192, "nvfp4") == (64, 2)     # 128 N tiles x 2 splits = 256 CTAs
    assert mosaic.pick_tiles(1, 2048, 8192, "nvfp4") == (64, 8)     # 32 x 8
    assert mosaic.pick_tiles(64, 8192, 256, "mxfp4") == (64, 1)     # one K step: no split


@pytest.mark.parametrize("kw, match", [
    ({"block_n": 96}, r"block_n must be one of \(64, 128\), got 96"),
    ({"num_splits": 0}, "num_splits must be an int >= 1, got 0"),
    ({"num_stages": 1}, "num_stages must be 2, 3 or 4, got 1"),
    ({"num_stages": 3, "block_n": 128, "fmt": "mxfp4"}, "num_stages=3 with block_n=128 for mxfp4 needs 294912 bytes"),
])
def test_bad_tiling_raises_a_clear_value_error(kw, match):
    x, qw = _data(2, 256, 64, seed=2, fmt=kw.pop("fmt", "nvfp4"))
    with pytest.raises(ValueError, match=match):
        mosaic.fp4_matmul_mosaic(x, qw, **kw)


def test_rejects_a_format_it_does_not_read():
    x, _ = _data(2, 256, 64, seed=3, fmt="nvfp4")
    qw = fp4.quantize(np.ones((256, 64), np.float32), "fp8", axis=0)
    with pytest.raises(ValueError, match="fmt='fp8'"):
        mosaic.fp4_matmul_mosaic(x, qw)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 64])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_compiled_matches_reference(m, fmt):
    x, qw = _data(m, 2048, 1024, seed=m, fmt=fmt)
    got = mosaic.fp4_matmul_mosaic(x, qw, out_dtype=jnp.float32)
    _assert_rel_close(got, _reference(x, qw))
