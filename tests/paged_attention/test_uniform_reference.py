"""The uniform-q-length reference equals the ragged reference on the same packed batch."""
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.paged_attention import ragged_paged_attention_reference, uniform_paged_attention_reference


@pytest.mark.parametrize("q_len, kv_heads, window, cap", [(1, 2, None, None), (4, 1, None, None),
                                                          (5, 2, 6, None), (3, 4, None, 20.0)])
def test_uniform_equals_ragged(q_len, kv_heads, window, cap):
    rng = np.random.default_rng(q_len)
    pages, page, heads, dim, seqs, per_seq = 24, 4, 4, 16, 4, 5
    k = jnp.asarray(rng.normal(size=(pages, page, kv_heads, dim)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(pages, page, kv_heads, dim)), jnp.float32)
    tables = jnp.asarray(rng.permutation(pages)[: seqs * per_seq].reshape(seqs, per_seq), jnp.int32)
    context = jnp.asarray([q_len, 7 + q_len, 20, 0], jnp.int32)  # includes an empty (padding) sequence
    q = jnp.asarray(rng.normal(size=(seqs * q_len, heads, dim)), jnp.float32)
    cu = jnp.asarray(np.r_[0, np.cumsum([q_len, q_len, q_len, 0])], jnp.int32)
    kw = dict(sliding_window=window, soft_cap=cap)
    ragged = ragged_paged_attention_reference(q, k, v, tables, context, cu, **kw)
    uniform = uniform_paged_attention_reference(q, k, v, tables, context, q_len, **kw)
    np.testing.assert_allclose(uniform[: 3 * q_len], ragged[: 3 * q_len], atol=1e-5)
    np.testing.assert_array_equal(uniform[3 * q_len:], 0)
