"""The MoE training step carries the router state: loss-free updates move only the biases' way."""
import jax
import numpy as np
import optax
import pytest

from jaxserve.models.transformer import init_params
from jaxserve.moe import init_router_state
from jaxserve.train.moe import make_moe_train_step
from tests.moe.conftest import moe_config


def test_loss_free_step_updates_biases_outside_the_optimizer():
    config = moe_config(num_layers=1, router="deepseek_v3")
    params = jax.jit(init_params, static_argnums=0)(config, jax.random.key(0))
    opt = optax.sgd(0.1)
    step = make_moe_train_step(config, opt, "loss_free", rate=0.01)
    state, opt_state = init_router_state(config), opt.init(params)
    windows = np.random.default_rng(0).integers(0, config.vocab_size, (4, 9))
    new_params, new_state, _, metrics = step(params, state, opt_state, windows)
    bias = np.asarray(new_state["layers_0"]["mlp"]["bias"])
    assert np.all(np.isclose(np.abs(bias), 0.01) | (bias == 0)) and np.any(bias != 0)
    assert "router_state" not in new_params and float(metrics["max_vio"]) > 0
    assert not np.allclose(new_params["layers_0"]["mlp"]["router"], params["layers_0"]["mlp"]["router"])
    with pytest.raises(ValueError, match="balancing must be one of"):
        make_moe_train_step(config, opt, "z-loss")
