"""A tiny Llama with biases (random, so a dropped bias shows) and its NVFP4 params, built once per session."""
import dataclasses

import jax
import numpy as np
import pytest

from jaxserve.models import get_preset, init_params
from jaxserve.quant import quantize_params


@pytest.fixture(scope="session")
def config():
    return dataclasses.replace(get_preset("tiny-llama"), qkv_bias=True, o_bias=True)


@pytest.fixture(scope="session")
def params(config):
    rng = np.random.default_rng(0)
    p = jax.jit(init_params, static_argnums=0)(config, jax.random.key(0))
    return jax.tree_util.tree_map_with_path(
        lambda path, x: x + rng.normal(0, 0.02, x.shape).astype(x.dtype) if path[-1].key == "bias" else x, p)


@pytest.fixture(scope="session")
def nvfp4_params(params):
    return quantize_params(params, "nvfp4")


@pytest.fixture(scope="session")
def tokens(config):
    return jax.random.randint(jax.random.key(1), (2, 8), 0, config.vocab_size)
