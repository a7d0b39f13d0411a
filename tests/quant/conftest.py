"""A tiny Llama with biases (random, so a dropped bias shows) and its NVFP4 params, built once per session.

Params are drawn with numpy over ``param_shapes``: compiling ``init_params`` costs more than the tests.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.models import get_preset, param_shapes
from jaxserve.quant import quantize_params


@pytest.fixture(scope="session")
def config():
    return dataclasses.replace(get_preset("tiny-llama"), qkv_bias=True, o_bias=True)


@pytest.fixture(scope="session")
def params(config):
    rng = np.random.default_rng(0)

    def draw(path, s):
        if path[-1].key == "scale":  # RMSNorm
            return jnp.asarray(1 + rng.normal(0, 0.1, s.shape), s.dtype)
        return jnp.asarray(rng.normal(0, 0.02, s.shape), s.dtype)
    return jax.tree_util.tree_map_with_path(draw, param_shapes(config))


@pytest.fixture(scope="session")
def nvfp4_params(params):
    return quantize_params(params, "nvfp4")


@pytest.fixture(scope="session")
def tokens(config):
    return jax.random.randint(jax.random.key(1), (2, 8), 0, config.vocab_size)
