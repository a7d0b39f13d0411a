"""Randomised inputs (hypothesis): fixed shapes, so one compile per kernel, with fresh lengths,
query splits, page placement and data per example. Kept apart so that the kernel sweeps do not
need hypothesis installed (the GPU machine does not have it)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.paged_attention import (
    paged_attention,
    paged_attention_reference,
    ragged_paged_attention,
    ragged_paged_attention_reference,
)

hypothesis = pytest.importorskip("hypothesis")
given, settings, st = hypothesis.given, hypothesis.settings, hypothesis.strategies

_FAST = {"xla_backend_optimization_level": 0}
_decode_kernel = jax.jit(functools.partial(paged_attention, pages_per_compute_block=2,
                                           num_splits=2, sliding_window=17),
                         compiler_options=_FAST)
_decode_reference = jax.jit(functools.partial(paged_attention_reference, sliding_window=17),
                            compiler_options=_FAST)


@settings(max_examples=12, deadline=None)
@given(lengths=st.lists(st.integers(0, 48), min_size=3, max_size=3), seed=st.integers(0, 2**16))
def test_random_lengths_and_tables(lengths, seed):
    """Fixed shapes (one compile), fresh lengths, page placement and data per example."""
    rng = np.random.default_rng(seed)
    num_pages, max_pages, page_size, kv_heads, head_dim = 24, 6, 8, 2, 64
    tables = rng.permutation(num_pages)[:3 * max_pages].reshape(3, max_pages).astype(np.int32)
    k = jnp.asarray(rng.standard_normal((num_pages, page_size, kv_heads, head_dim)), jnp.float32)
    v = jnp.asarray(rng.standard_normal(k.shape), jnp.float32)
    q = jnp.asarray(rng.standard_normal((3, 4, head_dim)), jnp.float32)
    args = (q, k, v, jnp.asarray(tables), jnp.asarray(lengths, jnp.int32))
    assert float(jnp.max(jnp.abs(_decode_kernel(*args) - _decode_reference(*args)))) <= 1e-5


_ragged_kernel = jax.jit(functools.partial(ragged_paged_attention, tile_q=4,
                                           pages_per_compute_block=1, sliding_window=11),
                         compiler_options=_FAST)
_ragged_reference = jax.jit(functools.partial(ragged_paged_attention_reference, sliding_window=11),
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
    assert float(jnp.max(jnp.abs(_ragged_kernel(*args) - _ragged_reference(*args)))) <= 1e-5
