"""Grouped-matmul and capacity experts against a dense every-expert-on-every-token reference."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.moe import experts as ex

T, H, I, E, K = 24, 16, 12, 6, 2
# jitted: eager dispatch compiles every op on its own, several times slower on CPU
ragged_experts = jax.jit(ex.ragged_experts)
capacity_experts = jax.jit(ex.capacity_experts, static_argnames="capacity_factor")
expert_capacity = ex.expert_capacity


@jax.jit
def _problem(key):
    ks = jax.random.split(key, 5)
    x = jax.random.normal(ks[0], (T, H))
    w = [0.3 * jax.random.normal(k, s) for k, s in zip(ks[1:4], [(E, H, I), (E, H, I), (E, I, H)])]
    experts = jnp.argsort(jax.random.uniform(ks[4], (T, E)), axis=1)[:, :K]  # distinct per token
    return x, experts, jax.nn.softmax(jax.random.normal(ks[4], (T, K))), w


def problem(seed):
    return _problem(jax.random.key(seed))


@jax.jit
def dense_reference(x, experts, gates, wg, wu, wd):
    every = jnp.einsum("teh,ehi->tei", jnp.broadcast_to(x[:, None], (T, E, H)), wg)
    up = jnp.einsum("th,ehi->tei", x, wu)
    out = jnp.einsum("tei,eih->teh", jax.nn.silu(every) * up, wd)  # [T, E, H]
    weight = jnp.zeros((T, E)).at[jnp.arange(T)[:, None], experts].set(gates)
    return jnp.einsum("te,teh->th", weight, out)


@pytest.mark.parametrize("seed", [0, 1])
def test_ragged_experts_equal_dense_reference(seed):
    x, experts, gates, w = problem(seed)
    np.testing.assert_allclose(ragged_experts(x, experts, gates, *w), dense_reference(x, experts, gates, *w),
                               atol=1e-5)


def test_ragged_experts_gradients_equal_dense_reference():
    x, experts, gates, w = problem(2)
    loss = lambda fn: lambda x, g, w: jnp.sum(jnp.sin(fn(x, experts, g, *w)))
    got = jax.grad(loss(ragged_experts), argnums=(0, 1, 2))(x, gates, w)
    want = jax.grad(loss(dense_reference), argnums=(0, 1, 2))(x, gates, w)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), got, want)


def test_capacity_experts_without_overflow_equal_ragged():
    x, experts, gates, w = problem(3)
    y, dropped = capacity_experts(x, experts, gates, *w, capacity_factor=float(E))  # C = T * K: no drops
    assert int(dropped) == 0
    np.testing.assert_allclose(y, ragged_experts(x, experts, gates, *w), atol=1e-5)


def test_capacity_experts_drop_the_latest_tokens_and_count_them():
    x, experts, gates, w = problem(4)
    cap = expert_capacity(T, K, E, 0.5)
    y, dropped = capacity_experts(x, experts, gates, *w, capacity_factor=0.5)
    flat = np.asarray(experts).reshape(-1)
    kept = np.array([np.sum(flat[:a] == flat[a]) < cap for a in range(len(flat))]).reshape(T, K)
    assert int(dropped) == np.sum(~kept) > 0
    expected = dense_reference(x, experts, gates * kept, *w)  # dropped assignments contribute zero
    np.testing.assert_allclose(y, expected, atol=1e-5)
