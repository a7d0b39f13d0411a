"""E2M1 / E4M3 / E8M0 codecs, nibble packing and the 128x4 scale layout."""
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fp4_numpy_ref as ref
from pallas_kernels import fp4

ALL_CODES = np.arange(16, dtype=np.uint8)


def test_decode_all_16_e2m1_codes_matches_ml_dtypes():
    got = np.asarray(fp4.decode_e2m1(ALL_CODES))
    want = ALL_CODES.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_encode_all_16_e2m1_values_round_trips_to_their_code():
    np.testing.assert_array_equal(np.asarray(fp4.encode_e2m1(fp4.E2M1_VALUES)), ALL_CODES)


@pytest.mark.parametrize("tie, want", [(0.25, 0.0), (0.75, 1.0), (1.25, 1.0), (1.75, 2.0),
                                       (2.5, 2.0), (3.5, 4.0), (5.0, 4.0)])
def test_e2m1_ties_round_to_even(tie, want):
    x = np.array([tie, -tie], np.float32)
    np.testing.assert_array_equal(np.asarray(fp4.decode_e2m1(fp4.encode_e2m1(x))), [want, -want])
    np.testing.assert_array_equal(np.asarray(fp4.round_e2m1(x)), [want, -want])


def test_e2m1_saturates_and_keeps_the_sign_of_zero():
    x = np.array([6.0, 6.5, 7.0, 1e30, np.inf, -1e30, -0.0, -0.1, 0.1], np.float32)
    got = np.asarray(fp4.decode_e2m1(fp4.encode_e2m1(x)))
    np.testing.assert_array_equal(got, [6, 6, 6, 6, 6, -6, 0, 0, 0])
    np.testing.assert_array_equal(np.signbit(got), [0, 0, 0, 0, 0, 1, 1, 1, 0])


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), log_scale=st.floats(-3, 2))
def test_e2m1_encode_matches_brute_force_and_ml_dtypes(seed, log_scale):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(512) * 10**log_scale).astype(np.float32)
    x[:14] = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0] * 2, np.float32) * np.repeat([1, -1], 7)
    want, _ = ref.e2m1_nearest(x)
    got = np.asarray(fp4.decode_e2m1(fp4.encode_e2m1(x)))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, x.astype(ml_dtypes.float4_e2m1fn).astype(np.float32))
    np.testing.assert_array_equal(np.asarray(fp4.round_e2m1(x)), want)


def test_all_256_e4m3_bytes_decode_like_ml_dtypes():
    b = np.arange(256, dtype=np.uint8)
    want = b.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    got = np.asarray(fp4.decode_e4m3_bytes(b))
    np.testing.assert_array_equal(got, want)  # NaN positions (0x7F, 0xFF) must agree too
    assert np.isnan(want).sum() == 2


def test_all_finite_e4m3_values_round_trip_to_their_byte():
    vals, bytes_ = ref.e4m3_finite_values()
    got = np.asarray(fp4.round_e4m3(vals)).view(np.uint8)
    np.testing.assert_array_equal(got, bytes_)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), log_scale=st.floats(-4, 2.7))
def test_e4m3_rounding_matches_brute_force_nearest(seed, log_scale):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(256) * 10**log_scale).astype(np.float32).clip(-448, 448)
    vals, _ = ref.e4m3_finite_values()
    midpoints = (np.sort(np.unique(vals))[:-1] + np.sort(np.unique(vals))[1:]) / 2
    x[:16] = rng.choice(midpoints, 16).astype(np.float32)  # exact ties (all midpoints fit in f32)
    got = np.asarray(fp4.round_e4m3(x)).astype(np.float32)
    want = np.asarray(ref.e4m3_nearest_byte(x)).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    np.testing.assert_array_equal(got, want)


def test_e4m3_clips_before_casting_where_a_plain_cast_gives_nan():
    x = np.array([448, 449, 464, 465, 1e6, np.inf, -465, np.nan], np.float32)
    assert np.isnan(np.asarray(jnp.asarray(x[3:4]).astype(jnp.float8_e4m3fn), np.float32)).all()
    got = np.asarray(fp4.round_e4m3(x)).astype(np.float32)
    np.testing.assert_array_equal(got[:7], [448, 448, 448, 448, 448, 448, -448])
    assert np.isnan(got[7])


def test_e8m0_bytes_decode_to_powers_of_two_and_255_is_nan():
    b = np.arange(1, 255, dtype=np.uint8)
    np.testing.assert_array_equal(np.asarray(fp4.decode_e8m0(b)), np.ldexp(1.0, b.astype(int) - 127).astype(np.float32))
    assert np.isnan(np.asarray(fp4.decode_e8m0(np.uint8(255))))
    np.testing.assert_array_equal(np.asarray(fp4.encode_e8m0(np.array([-200, -127, 0, 127, 300]))),
                                  [0, 0, 127, 254, 254])


def test_nibble_order_low_is_even_element():
    codes = np.array([1, 2, 3, 4, 15, 0], np.uint8)
    packed = np.asarray(fp4.pack_nibbles(codes))
    np.testing.assert_array_equal(packed, [0x21, 0x43, 0x0F])
    np.testing.assert_array_equal(np.asarray(fp4.unpack_nibbles(packed)), codes)


def test_nibble_packing_along_axis_0():
    codes = np.arange(24, dtype=np.uint8).reshape(4, 6) % 16
    packed = np.asarray(fp4.pack_nibbles(codes, axis=0))
    np.testing.assert_array_equal(packed, codes[0::2] | (codes[1::2] << 4))
    np.testing.assert_array_equal(np.asarray(fp4.unpack_nibbles(packed, axis=0)), codes)


@pytest.mark.parametrize("rows, cols", [(1, 1), (128, 4), (129, 5), (300, 12)])
def test_swizzle_128x4_round_trip(rows, cols):
    s = np.random.default_rng(rows * cols).integers(1, 256, (rows, cols), dtype=np.uint8)
    flat = fp4.swizzle_scales_128x4(jnp.asarray(s))
    assert flat.shape == (-(-rows // 128) * 128 * (-(-cols // 4) * 4),)
    np.testing.assert_array_equal(np.asarray(fp4.unswizzle_scales_128x4(flat, rows, cols)), s)


def test_swizzle_128x4_matches_the_cublas_offset_formula():
    rows, cols = 200, 6
    s = np.random.default_rng(0).integers(1, 256, (rows, cols), dtype=np.uint8)
    flat = np.asarray(fp4.swizzle_scales_128x4(jnp.asarray(s)))
    want = np.zeros(256 * 8, np.uint8)
    tiles_per_row = 8 // 4
    for r in range(rows):
        for c in range(cols):
            tile = (r // 128) * tiles_per_row + c // 4
            want[tile * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4] = s[r, c]
    np.testing.assert_array_equal(flat, want)


def test_cublas_scale_layout_of_a_weight_puts_n_on_rows():
    w = np.random.default_rng(1).standard_normal((64, 130)).astype(np.float32)
    qt = fp4.quantize(w, "nvfp4", axis=0)
    flat = fp4.cublas_scale_layout(qt)
    back = fp4.unswizzle_scales_128x4(flat, 130, 4)
    np.testing.assert_array_equal(np.asarray(back).view(np.uint8), np.asarray(qt.scales).T.view(np.uint8))
