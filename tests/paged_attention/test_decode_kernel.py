"""Decode Pallas kernel (interpret mode) against the plain-jnp reference.

Kernel and reference run under one jit each (see conftest.fast_jit); input validation of concrete
values is covered by test_validation.py.
"""
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.paged_attention import paged_attention, paged_attention_reference

DTYPES = [jnp.float32, jnp.bfloat16]

# (heads, kv_heads, head_dim, page_size, lengths): GQA ratios 1/4/8, lengths of 1, exactly a page,
# several pages, and not a multiple of the page size.
SHAPES = {
    "mha-s8-d64": (4, 4, 64, 8, [1, 8, 13, 40]),
    "gqa4-s16-d128": (8, 2, 128, 16, [1, 16, 37, 100]),
    "mqa8-s32-d64": (8, 1, 64, 32, [32, 5, 70]),
}


def _compare(fast_jit, assert_close, args, dtype, **opts):
    tiling = {k: opts.pop(k) for k in ("pages_per_compute_block", "num_splits") if k in opts}
    out = fast_jit(paged_attention, **opts, **tiling)(*args)
    assert_close(out, fast_jit(paged_attention_reference, **opts)(*args), dtype)
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("name", SHAPES)
def test_matches_reference(decode_case, fast_jit, assert_close, name, dtype):
    heads, kv_heads, head_dim, page_size, lengths = SHAPES[name]
    args = decode_case(lengths, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                       page_size=page_size, dtype=dtype)
    _compare(fast_jit, assert_close, args, dtype, pages_per_compute_block=2, num_splits=2)


@pytest.mark.parametrize("dtype,heads,kv_heads,head_dim,page_size,lengths", [
    (jnp.float32, 4, 1, 128, 64, [64, 130]),
    (jnp.bfloat16, 8, 2, 64, 128, [1, 129]),
    (jnp.float32, 2, 1, 256, 16, [17, 48]),
], ids=["s64-d128", "s128-bf16", "d256"])
def test_large_pages_and_head_dims(decode_case, fast_jit, assert_close, dtype, heads, kv_heads,
                                   head_dim, page_size, lengths):
    args = decode_case(lengths, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                       page_size=page_size, dtype=dtype)
    _compare(fast_jit, assert_close, args, dtype)  # default tiling


@pytest.mark.parametrize("pages_per_compute_block,num_splits", [(1, 5), (4, 2)])
def test_split_k_tilings(decode_case, fast_jit, assert_close, pages_per_compute_block, num_splits):
    args = decode_case([1, 8, 23, 79, 0], heads=4, kv_heads=2, head_dim=64, page_size=8)
    _compare(fast_jit, assert_close, args, jnp.float32,
             pages_per_compute_block=pages_per_compute_block, num_splits=num_splits)


@pytest.mark.parametrize("dtype,soft_cap,sliding_window", [
    (jnp.float32, 5.0, None), (jnp.bfloat16, None, 6), (jnp.float32, 3.0, 20)])
def test_soft_cap_and_sliding_window(decode_case, fast_jit, assert_close, dtype, soft_cap,
                                     sliding_window):
    args = decode_case([1, 8, 13, 40], heads=8, kv_heads=2, head_dim=64, page_size=8, dtype=dtype)
    _compare(fast_jit, assert_close, args, dtype, soft_cap=soft_cap, sliding_window=sliding_window,
             pages_per_compute_block=1, num_splits=3)


def test_zero_length_gives_zeros(decode_case, fast_jit, assert_close):
    args = decode_case([0, 9, 0], heads=4, kv_heads=1, head_dim=64, page_size=8, max_pages=3)
    out = _compare(fast_jit, assert_close, args, jnp.float32, sm_scale=0.3, num_splits=2,
                   pages_per_compute_block=1)
    assert not np.any(np.asarray(out[0])) and not np.any(np.asarray(out[2]))
    assert np.all(np.isfinite(np.asarray(out)))
