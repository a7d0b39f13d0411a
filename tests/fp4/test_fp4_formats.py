"""quantize / dequantize for nvfp4, mxfp4, fp8 and int4: against NumPy formulations, edge cases, pytree."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fp4_numpy_ref as ref
from pallas_kernels import fp4

SHAPE = (4, 128)  # quantized along the last axis: 8 NVFP4 / 4 MXFP4 blocks per row


def _sample(seed, log_scale, heavy):
    rng = np.random.default_rng(seed)
    x = rng.standard_t(3, SHAPE) if heavy else rng.standard_normal(SHAPE)
    return (x * 10.0**log_scale).astype(np.float32)


def _roundtrip(x, fmt, axis=-1, **opts):
    return np.asarray(fp4.dequantize(fp4.quantize(x, fmt, axis=axis, **opts)))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), log_scale=st.floats(-25, 25), heavy=st.booleans())
def test_nvfp4_matches_numpy_formulation(seed, log_scale, heavy):
    x = _sample(seed, log_scale, heavy)
    qt = fp4.quantize(x, "nvfp4")
    want, s_block, s_global = ref.nvfp4(x)
    np.testing.assert_array_equal(np.asarray(qt.scales).astype(np.float32), s_block)
    assert np.float32(qt.tensor_scale) == s_global
    np.testing.assert_array_equal(np.asarray(fp4.dequantize(qt)), want)


@pytest.mark.parametrize("scale_rule", ["floor", "ceil"])
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), log_scale=st.floats(-25, 25), heavy=st.booleans())
def test_mxfp4_matches_numpy_formulation(scale_rule, seed, log_scale, heavy):
    x = _sample(seed, log_scale, heavy)
    qt = fp4.quantize(x, "mxfp4", scale_rule=scale_rule)
    want, k = ref.mxfp4(x, scale_rule)
    np.testing.assert_array_equal(np.asarray(qt.scales).astype(np.int64) - 127, k)
    np.testing.assert_array_equal(np.asarray(fp4.dequantize(qt)), want)


def test_mxfp4_scale_rules_differ_as_documented():
    # block amax 7: floor gives 2^0 (7 saturates to 6), ceil gives 2^1 (7 -> 3.5 -> 4 -> 8)
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = 7.0
    np.testing.assert_array_equal(_roundtrip(x, "mxfp4", scale_rule="floor")[0, 0], 6.0)
    np.testing.assert_array_equal(_roundtrip(x, "mxfp4", scale_rule="ceil")[0, 0], 8.0)
    # amax exactly 6 * 2^k: both rules give 2^k and represent it exactly
    x[0, 0] = 12.0
    for rule in ("floor", "ceil"):
        assert _roundtrip(x, "mxfp4", scale_rule=rule)[0, 0] == 12.0


def test_nvfp4_packs_two_codes_per_byte_low_nibble_first():
    x = np.zeros((1, 16), np.float32)
    x[0, :4] = [1.0, -2.0, 6.0, 0.5]  # amax 6: s_block * s_global == 1 (up to an ulp)
    qt = fp4.quantize(x, "nvfp4")
    np.testing.assert_array_equal(np.asarray(qt.data)[0, :2], [0xC2, 0x17])
    qt0 = fp4.quantize(x.T, "nvfp4", axis=0)
    np.testing.assert_array_equal(np.asarray(qt0.data)[:2, 0], [0xC2, 0x17])


@pytest.mark.parametrize("fmt, opts", [("nvfp4", {}), ("mxfp4", {}), ("mxfp4", {"scale_rule": "ceil"}),
                                       ("int4", {"group_size": 32}), ("fp8", {"scaling": "channel"})])
def test_all_zero_tensor_and_zero_block_give_zeros_without_nan(fmt, opts):
    z = np.zeros(SHAPE, np.float32)
    np.testing.assert_array_equal(_roundtrip(z, fmt, **opts), z)
    x = _sample(0, 0, False)
    x[:, :32] = 0.0
    got = _roundtrip(x, fmt, **opts)
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got[:, :32], 0.0)


def test_nvfp4_zero_block_has_zero_scale_and_zero_tensor_has_unit_tensor_scale():
    qt = fp4.quantize(np.zeros(SHAPE, np.float32), "nvfp4")
    assert float(qt.tensor_scale) == 1.0
    np.testing.assert_array_equal(np.asarray(qt.scales).astype(np.float32), 0.0)


def test_nvfp4_subnormal_block_scales():
    x = _sample(1, 0, False).reshape(4, 8, 16)
    x /= np.abs(x).max(-1, keepdims=True)        # every block's amax is 1
    # s_global = 1 (amax 2688), so s_block ~ e4m3(block_amax / 6): subnormal below 6 * 2^-6
    x *= np.array([2688, 0.08, 0.07, 0.05, 0.03, 0.02, 0.015, 0.002], np.float32)[:, None]
    x = x.reshape(SHAPE)
    qt = fp4.quantize(x, "nvfp4")
    s_bytes = np.asarray(qt.scales).view(np.uint8)
    exp_field = (s_bytes >> 3) & 15
    assert ((exp_field == 0) & (s_bytes != 0))[:, 1:7].all()
    assert (s_bytes[:, 7] == 0).all()             # 0.002 / 6 < 2^-10 rounds to a zero scale
    want, _, _ = ref.nvfp4(x)
    np.testing.assert_array_equal(np.asarray(fp4.dequantize(qt)), want)


@pytest.mark.parametrize("amax", [1e38, np.finfo(np.float32).max, 1e-30])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "fp8", "int4"])
def test_extreme_amax_stays_finite_and_accurate(fmt, amax):
    x = _sample(2, 0, False)
    x = (x / np.abs(x).max() * np.float32(amax)).astype(np.float32)
    got = _roundtrip(x, fmt)
    assert np.isfinite(got).all()
    rel = np.linalg.norm((got - x).astype(np.float64)) / np.linalg.norm(x.astype(np.float64))
    assert rel < {"nvfp4": 0.2, "mxfp4": 0.25, "fp8": 0.05, "int4": 0.2}[fmt]


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "fp8", "int4"])
def test_subnormal_inputs_quantize_to_zero_without_nan(fmt):
    x = np.full(SHAPE, 1e-40, np.float32)  # float32 subnormals: XLA:CPU flushes them to zero
    got = _roundtrip(x, fmt)
    assert np.isfinite(got).all() and np.abs(got).max() <= 1e-38


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("fmt, blk", [("nvfp4", 16), ("mxfp4", 32), ("int4", 128), ("fp8", 1)])
def test_non_finite_poisons_only_its_block(fmt, blk, bad):
    x = _sample(3, 0, False)
    clean = x.copy()
    clean[1, 40] = 0.0
    x[1, 40] = bad
    got, want = _roundtrip(x, fmt), _roundtrip(clean, fmt)
    start = 40 // blk * blk
    assert np.isnan(got[1, start:start + blk]).all()
    mask = np.ones(SHAPE, bool)
    mask[1, start:start + blk] = False
    np.testing.assert_array_equal(got[mask], want[mask])


@pytest.mark.parametrize("scaling", ["tensor", "channel"])
def test_fp8_matches_ml_dtypes_cast(scaling):
    x = _sample(4, 1, True)
    amax = np.abs(x).max(axis=None if scaling == "tensor" else 0, keepdims=True)
    enc = (np.float32(448) / amax).astype(np.float32)
    want = ref.e4m3(np.clip(x * enc, -448, 448)) * (np.float32(1) / enc)
    np.testing.assert_array_equal(_roundtrip(x, "fp8", axis=0, scaling=scaling), want)


def test_int4_matches_numpy_formulation_and_uses_twos_complement_nibbles():
    x = _sample(5, 0, True)
    xb = x.reshape(4, 1, 128)
    enc = (np.float32(7) / np.abs(xb).max(-1, keepdims=True)).astype(np.float32)
    q = np.clip(np.round(xb * enc), -7, 7)
    np.testing.assert_array_equal(_roundtrip(x, "int4"), (q * (np.float32(1) / enc)).reshape(SHAPE))
    qt = fp4.quantize(x, "int4")
    lo = np.asarray(qt.data)[0, 0] & 15
    assert lo == (int(q[0, 0, 0]) & 15)


@pytest.mark.parametrize("fmt, bits", [("nvfp4", 4.5), ("mxfp4", 4.25), ("int4", 4.25), ("fp8", 8.0)])
def test_bits_per_element(fmt, bits):
    qt = fp4.quantize(np.ones((256, 256), np.float32), fmt, axis=0)
    assert abs(qt.bits_per_element - bits) < 0.01


def test_quantized_tensor_is_a_pytree_that_passes_through_jit():
    x = _sample(6, 0, False).T                    # [K=128, N=4], quantized along K
    qt = fp4.quantize(x, "nvfp4", axis=0)
    leaves, treedef = jax.tree_util.tree_flatten({"w": qt})
    assert len(leaves) == 3
    params = jax.tree_util.tree_unflatten(treedef, leaves)
    jitted = jax.jit(lambda p: fp4.dequantize(p["w"]))(params)
    np.testing.assert_array_equal(np.asarray(jitted), np.asarray(fp4.dequantize(qt)))
    traced = jax.jit(lambda a: fp4.quantize(a, "nvfp4", axis=0))(x)
    assert traced.shape == qt.shape and traced.axis == 0 and traced.fmt == "nvfp4"
    np.testing.assert_array_equal(np.asarray(traced.data), np.asarray(qt.data))


def test_bf16_input_is_quantized_from_its_exact_value():
    x = jnp.asarray(_sample(7, 0, False), jnp.bfloat16)
    got = _roundtrip(x, "nvfp4")
    want, _, _ = ref.nvfp4(np.asarray(x, np.float32))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("x, fmt, kw, match", [
    (np.ones((4, 40), np.float32), "nvfp4", {}, "multiple of its block size 16"),
    (np.ones((4, 48), np.float32), "mxfp4", {}, "multiple of its block size 32"),
    (np.ones((4, 64), np.float32), "int4", {}, "multiple of its block size 128"),
    (np.ones((4, 64), np.int32), "nvfp4", {}, "floating-point"),
    (np.ones((4, 64), np.float32), "nvfp8", {}, "unknown format"),
    (np.ones((4, 64), np.float32), "nvfp4", {"axis": 2}, "out of range"),
    (np.ones((4, 64), np.float32), "nvfp4", {"scale_rule": "ceil"}, "takes options"),
    (np.ones((4, 64), np.float32), "mxfp4", {"scale_rule": "nearest"}, "scale_rule"),
    (np.ones((4, 64), np.float32), "fp8", {"scaling": "block"}, "scaling"),
    (np.ones((4, 64), np.float32), "int4", {"group_size": 3}, "group_size"),
])
def test_bad_input_raises_a_clear_value_error(x, fmt, kw, match):
    with pytest.raises(ValueError, match=match):
        fp4.quantize(x, fmt, **kw)
