"""Sampling: filters equal a sort-based reference; draws follow the filtered distribution."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.sampling import SamplingBatch, argmax_first, filter_logits, sample, token_logprobs


def reference_filter(logits, top_k, top_p):
    """Sort-based top-k then top-p (smallest prefix reaching top_p), row by row in numpy."""
    out = np.full_like(logits, -np.inf)
    for r, row in enumerate(logits):
        order = np.argsort(-row, kind="stable")
        k = top_k[r] if top_k[r] > 0 else len(row)
        kept = order[:k]
        p = np.exp(row[kept] - row[kept].max())
        p /= p.sum()
        if top_p[r] < 1:
            before = np.cumsum(p) - p
            kept = kept[before < top_p[r]]
        out[r, kept] = row[kept]
    return out


def batch(n, temperature, top_k=0, top_p=1.0, seed=0):
    return SamplingBatch(temperature=jnp.full(n, temperature, jnp.float32), top_k=jnp.full(n, top_k, jnp.int32),
                         top_p=jnp.full(n, top_p, jnp.float32), seed=jnp.full(n, seed, jnp.uint32),
                         index=jnp.zeros(n, jnp.int32), position=jnp.arange(n, dtype=jnp.int32))


def test_filter_matches_sort_reference():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(64, 300)).astype(np.float32) * rng.uniform(0.1, 5, (64, 1)).astype(np.float32)
    top_k = rng.choice([0, 1, 2, 7, 50, 300, 1000], 64).astype(np.int32)
    top_p = rng.choice([1.0, 0.999, 0.9, 0.5, 0.1, 1e-3], 64).astype(np.float32)
    got = np.asarray(filter_logits(jnp.asarray(logits), jnp.asarray(top_k), jnp.asarray(top_p)))
    expected = reference_filter(logits, top_k, top_p)
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(expected))
    np.testing.assert_array_equal(got[np.isfinite(got)], expected[np.isfinite(expected)])


def test_greedy_is_argmax_with_logprobs():
    logits = jax.random.normal(jax.random.key(1), (16, 50))
    tokens, logprobs = sample(logits, batch(16, 0.0))
    np.testing.assert_array_equal(tokens, jnp.argmax(logits, -1))
    np.testing.assert_allclose(logprobs, jnp.max(jax.nn.log_softmax(logits), -1), atol=1e-6)


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (0.9, 6, 0.7)])
def test_draws_follow_filtered_softmax(temperature, top_k, top_p):
    vocab, n = 8, 40_000
    row = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0], np.float32)
    expected_logits = reference_filter(row[None] / temperature, np.array([top_k]), np.array([top_p], np.float32))[0]
    expected = np.exp(expected_logits - expected_logits.max())
    expected /= expected.sum()
    tokens, _ = jax.jit(sample)(jnp.broadcast_to(jnp.asarray(row), (n, vocab)), batch(n, temperature, top_k, top_p))
    freq = np.bincount(np.asarray(tokens), minlength=vocab) / n
    assert np.all(freq[expected == 0] == 0)
    assert 0.5 * np.abs(freq - expected).sum() < 0.01


def test_same_seed_same_draws_different_seed_differs():
    logits = jnp.zeros((32, 100))
    a, _ = sample(logits, batch(32, 1.0, seed=5))
    b, _ = sample(logits, batch(32, 1.0, seed=5))
    c, _ = sample(logits, batch(32, 1.0, seed=6))
    np.testing.assert_array_equal(a, b)
    assert np.any(np.asarray(a) != np.asarray(c))


def test_argmax_first_and_token_logprobs_match_jnp():
    """The vectorisable forms equal jnp.argmax (first index on ties) and the log-softmax they replace."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.integers(0, 4, (64, 37)), jnp.float32)  # many exact ties
    x = x.at[3].set(-jnp.inf).at[5, 7].set(jnp.inf)
    np.testing.assert_array_equal(argmax_first(x), jnp.argmax(x, axis=-1))
    # whole chunks and a ragged tail, ties across and inside chunks, a max only in the tail, 3-D rows
    y = jnp.asarray(rng.integers(0, 6, (2, 9, 300)), jnp.float32)
    y = y.at[0, 0, 299].set(7.0).at[0, 1, 131].set(7.0).at[0, 1, 259].set(7.0).at[1, 2].set(-jnp.inf)
    for chunk in (1, 7, 128, 300, 512):
        np.testing.assert_array_equal(argmax_first(y, chunk), jnp.argmax(y, axis=-1))
    logits = jnp.asarray(rng.normal(size=(8, 50)) * 5, jnp.float32)
    tokens = jnp.asarray(rng.integers(0, 50, 8), jnp.int32)
    want = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), tokens[:, None], axis=-1)[:, 0]
    np.testing.assert_allclose(token_logprobs(logits, tokens), want, atol=1e-5)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_logprobs_skipped_when_not_wanted(temperature):
    """``want_logprobs`` false: the same tokens, NaN log-probs (not computed); true: ``token_logprobs``'s."""
    logits = jnp.asarray(np.random.default_rng(3).normal(size=(6, 50)).astype(np.float32))
    b = batch(6, temperature)
    step = jax.jit(sample)
    toks, lps = step(logits, b, jnp.bool_(True))
    skipped_toks, skipped = step(logits, b, jnp.bool_(False))
    np.testing.assert_array_equal(skipped_toks, toks)
    assert np.isnan(np.asarray(skipped)).all()
    np.testing.assert_array_equal(lps, token_logprobs(logits, toks))
    np.testing.assert_array_equal(sample(logits, b)[1], lps)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sample_rows_draws_what_the_gathered_logits_draw(temperature):
    """sample(logits, rows=r) (a greedy batch takes the argmaxes, then the rows) == sample(logits[r])."""
    rng = np.random.default_rng(3)
    logits = jnp.asarray(rng.normal(size=(6, 300)) * 3, jnp.float32)
    rows = jnp.asarray([4, 0, 0, 5, 2, 4, 1, 3], jnp.int32)  # forks repeat an entry; order is free
    for want in (True, jnp.bool_(True), jnp.bool_(False)):
        got = sample(logits, batch(8, temperature, seed=9), want, rows=rows)
        expected = sample(logits[rows], batch(8, temperature, seed=9), want)
        np.testing.assert_array_equal(got[0], expected[0])
        np.testing.assert_array_equal(got[1], expected[1])
