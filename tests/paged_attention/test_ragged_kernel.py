"""Ragged multi-query Pallas kernel (interpret mode) against the plain-jnp reference."""
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.paged_attention import (
    paged_attention,
    ragged_paged_attention,
    ragged_paged_attention_reference,
)

# (q_lens, context_lens): a chunk on a cached prefix, a decode step, an idle sequence, a long
# chunk spanning several tiles, and a fresh prefill.
MIXED = ([5, 1, 0, 37, 3], [20, 1, 4, 100, 3])


def _compare(fast_jit, assert_close, args, dtype, **opts):
    tiling = {k: opts.pop(k) for k in ("pages_per_compute_block", "tile_q") if k in opts}
    out = fast_jit(ragged_paged_attention, **opts, **tiling)(*args)
    assert_close(out, fast_jit(ragged_paged_attention_reference, **opts)(*args), dtype)
    return out


@pytest.mark.parametrize("dtype,heads,kv_heads,head_dim,page_size", [
    (jnp.float32, 4, 4, 64, 8),
    (jnp.bfloat16, 4, 4, 64, 8),
    (jnp.float32, 8, 1, 128, 16),
    (jnp.bfloat16, 8, 2, 64, 32),
    (jnp.float32, 2, 1, 256, 64),
], ids=["mha-s8", "mha-s8-bf16", "mqa8-s16-d128", "gqa4-s32-bf16", "d256-s64"])
def test_mixed_batch_matches_reference(ragged_case, fast_jit, assert_close, dtype, heads,
                                       kv_heads, head_dim, page_size):
    args = ragged_case(*MIXED, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                       page_size=page_size, dtype=dtype)
    out = _compare(fast_jit, assert_close, args, dtype, tile_q=8, pages_per_compute_block=2)
    assert not np.any(np.asarray(out[int(args[-1][-1]):]))  # padding rows are zeros


@pytest.mark.parametrize("dtype,soft_cap,sliding_window,tile_q", [
    (jnp.float32, 4.0, None, 1), (jnp.bfloat16, None, 7, 4), (jnp.float32, 2.5, 12, 16)])
def test_soft_cap_sliding_window_and_tiles(ragged_case, fast_jit, assert_close, dtype, soft_cap,
                                           sliding_window, tile_q):
    args = ragged_case(*MIXED, heads=8, kv_heads=2, head_dim=64, page_size=8, dtype=dtype)
    _compare(fast_jit, assert_close, args, dtype, soft_cap=soft_cap, sliding_window=sliding_window,
             tile_q=tile_q, pages_per_compute_block=1)


def test_speculative_verification_batch(ragged_case, fast_jit, assert_close):
    """γ+1 = 5 query tokens per sequence on top of cached prefixes of various lengths."""
    args = ragged_case([5, 5, 5, 5], [5, 16, 21, 64], heads=8, kv_heads=2, head_dim=64,
                       page_size=16, pad_tokens=0)
    _compare(fast_jit, assert_close, args, jnp.float32, tile_q=8)


def test_single_token_rows_equal_decode_kernel(ragged_case, fast_jit):
    """One new token per sequence is decode: both kernels must agree."""
    q, k, v, tables, ctx, cu = ragged_case([1, 1, 1], [1, 16, 29], heads=4, kv_heads=2,
                                           head_dim=64, page_size=8, pad_tokens=0)
    ragged = fast_jit(ragged_paged_attention, tile_q=2, pages_per_compute_block=2)(
        q, k, v, tables, ctx, cu)
    decode = fast_jit(paged_attention, num_splits=2, pages_per_compute_block=2)(
        q, k, v, tables, ctx)
    np.testing.assert_allclose(np.asarray(ragged), np.asarray(decode), atol=1e-5)
