"""Loss-free bias balancing, MaxVio and the auxiliary-loss baselines."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.models.transformer import Transformer, init_params
from jaxserve.moe import (accumulate_loads, aux_loss, expert_load, init_router_state, layer_loads, max_violation, route,
                          sequence_aux_loss, switch_aux_loss, update_bias, update_router_state)
from tests.moe.conftest import moe_config


def test_max_violation_and_bias_step():
    load = jnp.array([10.0, 2.0, 6.0, 6.0])
    assert float(max_violation(load)) == pytest.approx((10 - 6) / 6)
    assert float(max_violation(jnp.full(4, 3.0))) == 0.0
    np.testing.assert_allclose(update_bias(jnp.zeros(4), load, 0.01), [-0.01, 0.01, 0.0, 0.0])


@pytest.mark.parametrize("router", ["deepseek_v3", "qwen3_moe"])
def test_bias_updates_balance_a_skewed_router(router):
    """A router that prefers low-numbered experts; each step routes fresh tokens and nudges the bias."""
    config = moe_config(num_experts=8, num_experts_per_tok=2, router=router)
    w = jax.random.normal(jax.random.key(0), (16, 8))
    skew = jnp.linspace(1.5, -1.5, 8)
    rate = 0.01 if router == "deepseek_v3" else 0.002  # softmax probs live on a smaller scale

    def step(bias, key):
        logits = jax.random.normal(key, (256, 16)) @ w * 0.3 + skew
        load = expert_load(route(logits, config, bias).experts, 8)
        return update_bias(bias, load, rate), max_violation(load)

    bias, vio = jax.lax.scan(step, jnp.zeros(8), jax.random.split(jax.random.key(1), 300))
    first, last = float(jnp.mean(vio[:10])), float(jnp.mean(vio[-50:]))
    assert first > 1.0 and last < 0.25 * first, (first, last)
    assert np.all(np.diff(np.asarray(bias)) > -0.05)  # favoured experts got the lowest biases
    assert float(bias[0]) < float(bias[-1])


def test_switch_aux_loss():
    probs = jnp.full((12, 4), 0.25)
    uniform = jnp.stack([jnp.arange(12) % 4, (jnp.arange(12) + 1) % 4], 1)
    assert float(switch_aux_loss(probs, uniform, alpha=0.01)) == pytest.approx(0.01)
    skewed_probs = jax.nn.softmax(jnp.array([3.0, 0.0, 0.0, 0.0]) * jnp.ones((12, 1)))
    skewed = jnp.zeros((12, 2), jnp.int32).at[:, 1].set(1)
    p = skewed_probs[0]  # f = [1/2, 1/2, 0, 0]: above the balanced value alpha
    assert float(switch_aux_loss(skewed_probs, skewed, alpha=0.01)) == pytest.approx(0.04 * (p[0] + p[1]) / 2)
    assert float(switch_aux_loss(skewed_probs, skewed, alpha=0.01)) > 0.01


def test_sequence_aux_loss_matches_formula():
    rng = np.random.default_rng(0)
    b, length, e, k = 3, 10, 6, 2
    probs = rng.dirichlet(np.ones(e), size=(b, length)).astype(np.float32)
    experts = np.argsort(-probs, axis=-1)[..., :k]
    expected = 0.0
    for s in range(b):
        f = np.array([(experts[s] == i).any(-1).sum() for i in range(e)]) * e / (k * length)
        expected += np.sum(f * probs[s].mean(0)) / b
    assert float(sequence_aux_loss(jnp.asarray(probs), jnp.asarray(experts), alpha=0.1)) == \
        pytest.approx(0.1 * expected, rel=1e-5)


def test_router_state_round_trip_through_the_model():
    config = moe_config(router="deepseek_v3")
    params = jax.jit(init_params, static_argnums=0)(config, jax.random.key(0))
    state = init_router_state(config)
    assert sorted(state) == ["layers_0", "layers_1"]
    tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, config.vocab_size)
    positions = jnp.broadcast_to(jnp.arange(9), (2, 9))
    apply = jax.jit(lambda v: Transformer(config).apply(v, tokens, positions, mutable=["moe_stats"]))
    (logits, _), stats = apply({"params": params, "router_state": state})
    loads = layer_loads(stats["moe_stats"])
    assert all(float(v.sum()) == 2 * 9 * config.num_experts_per_tok for v in loads.values())
    total = accumulate_loads(accumulate_loads(None, loads), loads)
    np.testing.assert_array_equal(total["layers_1"], 2 * loads["layers_1"])
    new_state = update_router_state(state, loads, rate=0.5)
    assert jax.tree_util.tree_structure(new_state) == jax.tree_util.tree_structure(state)
    np.testing.assert_allclose(new_state["layers_1"]["mlp"]["bias"],
                               0.5 * np.sign(loads["layers_1"].mean() - loads["layers_1"]))
    (moved, _), _ = apply({"params": params, "router_state": new_state})
    assert not np.allclose(moved[0], logits[0])  # the bias reaches the routers

    layers = [stats["moe_stats"][n]["mlp"]["stats"][0] for n in ("layers_0", "layers_1")]
    want = sum(switch_aux_loss(s.probs, s.experts, 0.01) for s in layers)
    assert float(aux_loss(stats["moe_stats"], "switch", 0.01)) == pytest.approx(float(want), rel=1e-6)
    want = sum(sequence_aux_loss(s.probs.reshape(2, 9, -1), s.experts.reshape(2, 9, -1), 0.01) for s in layers)
    assert float(aux_loss(stats["moe_stats"], "sequence", 0.01, batch_size=2)) == pytest.approx(float(want), rel=1e-6)
    with pytest.raises(ValueError, match="aux loss kind must be one of"):
        aux_loss(stats["moe_stats"], "z-loss", 0.01)
