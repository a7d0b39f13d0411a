"""jaxserve.memory_maps (tests/conftest.py's guard) against XLA:CPU's per-kernel memory mappings reaching vm.max_map_count."""
import gc
import sys

import jax
import jax.numpy as jnp
import pytest

from jaxserve.memory_maps import memory_maps


@pytest.mark.skipif(not sys.platform.startswith("linux") or jax.default_backend() != "cpu", reason="XLA:CPU on Linux")
def test_clearing_jax_caches_unmaps_compiled_kernels():
    # a program of many unfused kernels (a dynamic loop of distinct ops) maps pages per kernel
    def program(x):
        for i in range(40):
            x = jax.lax.cond(x.sum() > i, lambda v, i=i: jnp.sin(v) * i, lambda v, i=i: jnp.cos(v) + i, x)
        return x
    jax.clear_caches()
    gc.collect()
    before = memory_maps()
    jax.jit(program)(jnp.ones(8)).block_until_ready()
    grown = memory_maps() - before
    jax.clear_caches()
    gc.collect()
    assert grown > 40, grown  # the guard's premise: compiled kernels hold mappings of their own
    assert memory_maps() - before < grown / 4  # ... and JAX's caches release them
