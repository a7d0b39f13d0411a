"""The rejection sampler on its own: greedy rule, invariants, and exactness over >= 100k draws.

Exactness (Leviathan et al. 2023, Theorem 1): whatever the draft distribution q, every emitted
token is distributed as the target's p. Checked per position with context-free p_i, q_i (a row
reaches position i only if it accepted the i earlier drafts; given that, token i ~ p_i), and over
a two-round token stream with bigram (context-dependent) p and q.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_stats import assert_matches, assert_mismatch
from jaxserve.speculative.rejection import (PAD_TOKEN, draw, given_draft_uniforms, greedy_accept, probs_from_logits,
                                           rejection_sample)

V, G, N = 12, 3, 200_000  # every sampler call has this shape: one compile each


@jax.jit
def _sample(draft, q, p, u, greedy):
    return rejection_sample(draft, q, p, u, greedy)


@jax.jit
def _uniforms(key):
    return jax.random.uniform(key, (N, G + 1, V + 1), minval=jnp.finfo(jnp.float32).tiny)


@jax.jit
def _draft(q, u):
    """Draft tokens i32[N, G] from q f32[N, G, V] with the round's uniforms, as spec_round draws them."""
    return draw(q, u[:, :G, :-1], jnp.bool_(False))


def _filtered(logits, top_k, top_p, temperature=1.0):
    r = logits.shape[0]
    return probs_from_logits(logits, jnp.full(r, temperature), jnp.full(r, top_k, jnp.int32), jnp.full(r, top_p))


def _random_probs(rng, positions, scale=2.0):
    return jax.nn.softmax(jnp.asarray(rng.normal(size=(N, positions, V)) * scale, jnp.float32))


def test_greedy_accepts_while_draft_equals_target_argmax():
    rng = np.random.default_rng(0)
    p = _random_probs(rng, G + 1)
    argmax = np.asarray(jnp.argmax(p, -1))
    agree = rng.integers(0, G + 1, N)  # rows agree with the target on their first `agree` tokens
    prefix = np.arange(G)[None] < agree[:, None]
    draft = np.where(prefix, argmax[:, :G], (argmax[:, :G] + 1) % V)
    q = _random_probs(rng, G)  # greedy rows ignore q
    tokens, n = map(np.asarray, _sample(jnp.asarray(draft, jnp.int32), q, p, _uniforms(jax.random.key(0)),
                                        jnp.ones(N, bool)))
    np.testing.assert_array_equal(n, agree)
    np.testing.assert_array_equal(np.where(prefix, tokens[:, :G], -7), np.where(prefix, draft, -7))
    rows = np.arange(N)
    np.testing.assert_array_equal(tokens[rows, agree], argmax[rows, agree])  # correction or bonus
    assert ((tokens == PAD_TOKEN) == (np.arange(G + 1)[None] > agree[:, None])).all()
    # the all-greedy fast path (what a round runs when no row samples) reads the logits, not p or q
    fast_tokens, fast_n = map(np.asarray, jax.jit(greedy_accept)(jnp.asarray(draft, jnp.int32), jnp.log(p)))
    np.testing.assert_array_equal(fast_n, n)
    np.testing.assert_array_equal(fast_tokens, tokens)


def test_sampled_rows_keep_a_draft_prefix_and_correct_from_the_residual():
    rng = np.random.default_rng(1)
    p, q = _random_probs(rng, G + 1), _random_probs(rng, G)
    u = _uniforms(jax.random.key(1))
    draft = _draft(q, u)
    greedy = rng.random(N) < 0.25  # greedy and sampled rows mixed in one batch
    tokens, n = map(np.asarray, _sample(draft, q, p, u, jnp.asarray(greedy)))
    draft, p, q = np.asarray(draft), np.asarray(p), np.asarray(q)
    assert n.min() == 0 and n.max() == G  # acceptance differs per row
    prefix = np.arange(G)[None] < n[:, None]
    np.testing.assert_array_equal(np.where(prefix, tokens[:, :G], -7), np.where(prefix, draft, -7))
    assert ((tokens == PAD_TOKEN) == (np.arange(G + 1)[None] > n[:, None])).all()
    rows = np.arange(N)
    last = tokens[rows, n]
    q_pad = np.concatenate([q, np.zeros((N, 1, V), q.dtype)], 1)
    resid = p[rows, n, last] - q_pad[rows, n, last]
    sampled = ~greedy
    assert (resid[sampled] > 0).all(), "a correction was drawn where p <= q"
    argmax = p.argmax(-1)
    np.testing.assert_array_equal(last[greedy], argmax[rows, n][greedy])
    greedy_prefix = np.where(prefix, draft == argmax[:, :G], True)
    assert greedy_prefix[greedy].all()


@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (6, 1.0), (0, 0.7), (8, 0.85)])
def test_each_position_is_distributed_as_the_target(top_k, top_p):
    rng = np.random.default_rng(2 + top_k)
    target_logits = rng.normal(size=(G + 1, V)) * 1.5
    draft_logits = target_logits[:G] + rng.normal(size=(G, V))  # related, so many rows reach the bonus
    p1 = _filtered(jnp.asarray(target_logits, jnp.float32), top_k, top_p)  # f32[G+1, V]
    q1 = _filtered(jnp.asarray(draft_logits, jnp.float32), top_k, top_p)
    p = jnp.broadcast_to(p1, (N, G + 1, V))
    q = jnp.broadcast_to(q1, (N, G, V))
    u = _uniforms(jax.random.key(3))
    draft = _draft(q, u)
    tokens, n = map(np.asarray, _sample(draft, q, p, u, jnp.zeros(N, bool)))
    p1, q1 = np.asarray(p1), np.asarray(q1)
    for i in range(G + 1):
        reached = n >= i
        counts = np.bincount(tokens[reached, i], minlength=V)
        assert reached.sum() > 40_000
        assert_matches(counts, p1[i], max_tv=0.01)
    assert_mismatch(np.bincount(np.asarray(draft)[:, 0], minlength=V), p1[0])  # q's own draws fail


@jax.jit
def _bigram_round(ctx, u, p_table, q_table):
    """One round where the draft runs autoregressively on its own tokens and the target scores every prefix."""
    xs, qs, c = [], [], ctx
    for i in range(G):
        qi = q_table[c]
        c = draw(qi, u[:, i, :-1], jnp.bool_(False))
        xs.append(c)
        qs.append(qi)
    draft = jnp.stack(xs, 1)
    prev = jnp.concatenate([ctx[:, None], draft], 1)
    return rejection_sample(draft, jnp.stack(qs, 1), p_table[prev], u, jnp.zeros(ctx.shape[0], bool))


def test_token_stream_with_context_dependent_distributions():
    """Two rounds from a bigram target/draft: the first two stream tokens are jointly ~ p(a|c) p(b|a)."""
    rng = np.random.default_rng(5)
    p_table = np.asarray(jax.nn.softmax(rng.normal(size=(V, V)) * 1.5))
    q_table = np.asarray(jax.nn.softmax(rng.normal(size=(V, V)) * 1.5))  # unrelated draft
    context = rng.integers(0, V, N)

    p_dev, q_dev = jnp.asarray(p_table), jnp.asarray(q_table)

    def round_from(ctx, key):
        return map(np.asarray, _bigram_round(jnp.asarray(ctx), _uniforms(key), p_dev, q_dev))

    tokens1, n1 = round_from(context, jax.random.key(6))
    tokens2, _ = round_from(tokens1[:, 0], jax.random.key(7))
    a = tokens1[:, 0]
    b = np.where(n1 >= 1, tokens1[:, 1], tokens2[:, 0])
    for c in range(V):
        rows = context == c
        joint = p_table[c][:, None] * p_table  # P(a, b | c)
        counts = np.bincount(a[rows] * V + b[rows], minlength=V * V)
        assert_matches(counts, joint, max_tv=0.1)  # ~17k rows per context: chi2 is the sharp check
    expected_a = p_table[context].mean(0)
    expected_b = (p_table[context] @ p_table).mean(0)
    assert_matches(np.bincount(a, minlength=V), expected_a, max_tv=0.01)
    assert_matches(np.bincount(b, minlength=V), expected_b, max_tv=0.01)


def test_probs_from_logits_follows_the_sampling_settings():
    rng = np.random.default_rng(8)
    logits = jnp.asarray(rng.normal(size=(4, V)), jnp.float32)
    probs = np.asarray(probs_from_logits(logits, jnp.array([0.0, 1.0, 0.5, 1.0]), jnp.array([0, 0, 0, 3]),
                                         jnp.array([1.0, 1.0, 1.0, 1.0])))
    np.testing.assert_array_equal(probs[0], np.eye(V)[int(jnp.argmax(logits[0]))])
    np.testing.assert_allclose(probs[1], jax.nn.softmax(logits[1]), rtol=1e-6)
    np.testing.assert_allclose(probs[2], jax.nn.softmax(logits[2] / 0.5), rtol=1e-6)
    top3 = np.argsort(np.asarray(logits[3]))[-3:]
    assert set(np.flatnonzero(probs[3])) == set(top3)


@jax.jit
def _sample_lengths(draft, p, u, num_drafts):
    valid = jnp.arange(G)[None, :] < num_drafts[:, None]
    q = jnp.where(valid[..., None], jax.nn.one_hot(draft, V), 0.0)  # deterministic drafts: one-hot q
    return rejection_sample(draft, q, p, u, jnp.zeros(draft.shape[0], bool), valid)


def test_drafts_past_a_rows_length_are_never_accepted_and_the_stream_stays_exact():
    """Suffix decoding's rounds: row b proposes num_drafts[b] in [0, G] deterministic tokens; padding
    holds the target's likeliest token, which must still never be accepted, and the draw at the first
    padded slot is from p itself (a residual that removed the padding token would fail here)."""
    rng = np.random.default_rng(9)
    p1 = np.asarray(_filtered(jnp.asarray(rng.normal(size=(G + 1, V)) * 1.5, jnp.float32), 0, 1.0))
    favourite = p1[:G].argmax(-1)
    draft = np.broadcast_to(favourite, (N, G)).astype(np.int32)  # a good deterministic proposal
    lengths = rng.integers(0, G + 1, N)
    tokens, n = map(np.asarray, _sample_lengths(jnp.asarray(draft), jnp.broadcast_to(jnp.asarray(p1), (N, G + 1, V)),
                                                _uniforms(jax.random.key(10)), jnp.asarray(lengths, jnp.int32)))
    assert (n <= lengths).all() and (n == lengths).mean() > 0.1
    for i in range(G + 1):
        reached = n >= i
        assert_matches(np.bincount(tokens[reached, i], minlength=V), p1[i], max_tv=0.05)  # chi2 is the sharp check
        at_pad = n == lengths  # rows whose slot n is their first padded one: a plain draw from p_n
        assert_matches(np.bincount(tokens[at_pad & (lengths == i), i], minlength=V), p1[i], max_tv=0.05)


def test_given_draft_rounds_sample_the_same_tokens_at_every_width():
    """The engine narrows a suffix round to its batch's longest draft (bucketed): a row with a draft of
    length L must emit the same tokens in a round of any width W >= L (so a row's sample does not depend
    on the other rows), and those tokens must still follow the target (the per-row draw is new)."""
    rng = np.random.default_rng(13)
    n, g_max = 4096, 7
    lengths = jnp.asarray(rng.integers(0, 3, n), jnp.int32)  # every row fits the narrowest width below
    p = jnp.asarray(np.asarray(_filtered(jnp.asarray(rng.normal(size=(g_max + 1, V)) * 1.5, jnp.float32), 0, 1.0)))
    draft = jnp.broadcast_to(p[:g_max].argmax(-1).astype(jnp.int32), (n, g_max))
    seed, index, pos = (jnp.asarray(rng.integers(0, 2**31, n), jnp.uint32), jnp.zeros(n, jnp.int32),
                        jnp.asarray(rng.integers(0, 100, n), jnp.int32))

    @functools.partial(jax.jit, static_argnums=0)
    def round_at(width):
        u = given_draft_uniforms(seed, index, pos, width, g_max, V, jnp.bool_(False))
        valid = jnp.arange(width)[None, :] < lengths[:, None]
        q = jnp.where(valid[..., None], jax.nn.one_hot(draft[:, :width], V), 0.0)
        probs = jnp.broadcast_to(p[:width + 1], (n, width + 1, V))  # the target at each slot of the round
        return rejection_sample(draft[:, :width], q, probs, u, jnp.zeros(n, bool), valid)

    tokens = {w: tuple(map(np.asarray, round_at(w))) for w in (2, 4, g_max)}
    for w in (4, g_max):
        np.testing.assert_array_equal(tokens[w][1], tokens[2][1])  # accepted counts
        np.testing.assert_array_equal(tokens[w][0][:, :3], tokens[2][0])  # the emitted tokens
        assert (tokens[w][0][:, 3:] == PAD_TOKEN).all()
    toks, acc = tokens[2]
    last = toks[np.arange(n), acc]  # the correction / bonus token: from the residual, or p itself past the draft
    at_pad = acc == np.asarray(lengths)
    for length in range(3):
        rows = at_pad & (np.asarray(lengths) == length)
        assert_matches(np.bincount(last[rows], minlength=V), np.asarray(p[length]), max_tv=0.08)
