"""A row's norm does not depend on the rows beside it: the same bits for a token alone, in a batch, or in a
speculative verify pass (XLA:CPU reduces fewer than 8 rows in another order than 8 or more)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.layers import RMSNorm
from jaxserve.reductions import row_sum

ROW_COUNTS = [1, 2, 3, 7, 8, 9, 17]


@pytest.fixture(scope="module")
def rows():
    return np.random.default_rng(0).standard_normal((64, 576)).astype(np.float32) * 3


def test_row_sum_is_the_sum(rows):
    got = np.asarray(jax.jit(row_sum)(jnp.asarray(rows)))
    np.testing.assert_allclose(got, rows.astype(np.float64).sum(-1), rtol=1e-5, atol=1e-4)
    odd = rows[:5, :37]  # an odd length carries its last element at every halving
    np.testing.assert_allclose(np.asarray(row_sum(jnp.asarray(odd))), odd.astype(np.float64).sum(-1), rtol=1e-5,
                               atol=1e-4)
    assert row_sum(jnp.ones((2, 3, 1))).shape == (2, 3)


@pytest.mark.parametrize("count", ROW_COUNTS)
def test_rms_norm_rows_keep_their_bits_beside_other_rows(rows, count):
    """f32 in and out, so no bf16 rounding hides a changed sum; with ``jnp.mean`` the 1-, 2-, 3- and 7-row calls
    differed from the 64-row call in some rows."""
    norm = RMSNorm()
    params = {"params": {"scale": jnp.asarray(np.random.default_rng(1).standard_normal(576), jnp.float32)}}
    apply = jax.jit(norm.apply)
    batch = np.asarray(apply(params, jnp.asarray(rows)))
    for start in (0, 64 - count):
        alone = np.asarray(apply(params, jnp.asarray(rows[start:start + count])))
        np.testing.assert_array_equal(alone, batch[start:start + count])


@pytest.mark.parametrize("vocab", [512, 301])
def test_a_rows_log_prob_and_nucleus_do_not_depend_on_the_rows_beside_it(vocab):
    """The sampler's log-sum-exp and top-p mass (``row_sum``): with ``jnp.sum``, a row of a [32, 512] or [32, 301]
    batch here got other log-prob bits than alone (in an engine, a tiny float32 model's request alone and beside
    12 or more others)."""
    from jaxserve.sampling import filter_logits, token_logprobs
    rng = np.random.default_rng(vocab)
    logits = jnp.asarray(rng.standard_normal((32, vocab)).astype(np.float32) * 3)
    tokens = jnp.asarray(rng.integers(0, vocab, 32))
    top_k, top_p = jnp.asarray(rng.integers(0, 60, 32)), jnp.asarray(rng.uniform(0.5, 1.0, 32).astype(np.float32))
    logprobs, keep = jax.jit(token_logprobs), jax.jit(filter_logits)
    want = np.asarray(jax.nn.log_softmax(logits))
    np.testing.assert_allclose(np.asarray(logprobs(logits, tokens)), want[np.arange(32), np.asarray(tokens)],
                               rtol=1e-5, atol=1e-5)
    for count in (13, 18, 32):
        batch_lp, batch_keep = np.asarray(logprobs(logits[:count], tokens[:count])), np.asarray(
            keep(logits[:count], top_k[:count], top_p[:count]))
        for r in range(count):
            np.testing.assert_array_equal(np.asarray(logprobs(logits[r:r + 1], tokens[r:r + 1])), batch_lp[r:r + 1])
            np.testing.assert_array_equal(np.asarray(keep(logits[r:r + 1], top_k[r:r + 1], top_p[r:r + 1])),
                                          batch_keep[r:r + 1])
