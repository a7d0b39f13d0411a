"""Ragged multi-query Pallas kernel (interpret mode) against the plain-jnp reference."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

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


_FAST = {"xla_backend_optimization_level": 0}
_hyp_kernel = jax.jit(functools.partial(ragged_paged_attention, tile_q=4, pages_per_compute_block=1,
                                        sliding_window=11), compiler_options=_FAST)
_hyp_reference = jax.jit(functools.partial(ragged_paged_attention_reference, sliding_window=11),
                         compiler_options=_FAST)


@settings(max_examples=10, deadline=None)
@given(q_lens=st.lists(st.integers(0, 9), min_size=3, max_size=3),
       cached=st.lists(st.integers(0, 20), min_size=3, max_size=3), seed=st.integers(0, 2**16))
def test_random_ragged_batches(q_lens, cached, seed):
    """Fixed shapes (one compile), fresh split of 30 rows, prefixes and page placement per example."""
    rng = np.random.default_rng(seed)
    num_pages, max_pages, page_size, tokens = 24, 4, 8, 30
    tables = rng.permutation(num_pages)[:3 * max_pages].reshape(3, max_pages).astype(np.int32)
    k = jnp.asarray(rng.standard_normal((num_pages, page_size, 2, 64)), jnp.float32)
    v = jnp.asarray(rng.standard_normal(k.shape), jnp.float32)
    q = jnp.asarray(rng.standard_normal((tokens, 4, 64)), jnp.float32)
    ctx = jnp.asarray([a + b for a, b in zip(q_lens, cached)], jnp.int32)
    cu = jnp.asarray(np.concatenate([[0], np.cumsum(q_lens)]), jnp.int32)
    args = (q, k, v, jnp.asarray(tables), ctx, cu)
    assert float(jnp.max(jnp.abs(_hyp_kernel(*args) - _hyp_reference(*args)))) <= 1e-5
