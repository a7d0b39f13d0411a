"""Paged-attention test fixtures: random pools with scattered pages, and the GPU skip.

Builders return numpy-seeded jnp arrays: q, k_pages, v_pages [P, S, K, D], block tables whose
pages are a random permutation of the pool (unused entries set to -1, which kernels must ignore).
"""
import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

_HERE = pathlib.Path(__file__).parent

# Interpret-mode kernels are small programs whose CPU compile time dominates the run; LLVM -O0
# cuts it by about a quarter without changing what is computed.
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def fast_jit(fn, **static_kwargs):
    """jit(fn with static_kwargs bound) compiled for test speed; values inside are traced."""
    return jax.jit(functools.partial(fn, **static_kwargs), compiler_options=FAST_COMPILE)


def pytest_collection_modifyitems(config, items):
    if jax.default_backend() == "gpu":
        return
    skip = pytest.mark.skip(reason="needs a GPU backend (interpret=False); run by benchmarks/gpu_check.sh")
    for item in items:
        if "gpu" in item.keywords and _HERE in pathlib.Path(str(item.fspath)).parents:
            item.add_marker(skip)


def _pool(rng, lengths, page_size, kv_heads, head_dim, dtype, max_pages=None, spare=3):
    """Pool with each sequence's pages scattered at random; returns (k, v, tables i32[B, M])."""
    needed = [-(-int(n) // page_size) for n in lengths]
    max_pages = max_pages or max(1, max(needed))
    num_pages = sum(needed) + spare
    perm = rng.permutation(num_pages)
    tables = np.full((len(lengths), max_pages), -1, np.int32)
    at = 0
    for b, n in enumerate(needed):
        tables[b, :n] = perm[at:at + n]
        at += n
    shape = (num_pages, page_size, kv_heads, head_dim)
    k = jnp.asarray(rng.standard_normal(shape), dtype)
    v = jnp.asarray(rng.standard_normal(shape), dtype)
    return k, v, jnp.asarray(tables)


@pytest.fixture
def decode_case():
    def build(lengths, *, heads, kv_heads, head_dim, page_size, dtype=jnp.float32, seed=0,
              max_pages=None):
        rng = np.random.default_rng(seed)
        k, v, tables = _pool(rng, lengths, page_size, kv_heads, head_dim, dtype, max_pages)
        q = jnp.asarray(rng.standard_normal((len(lengths), heads, head_dim)), dtype)
        return q, k, v, tables, jnp.asarray(lengths, jnp.int32)
    return build


@pytest.fixture
def ragged_case():
    def build(q_lens, context_lens, *, heads, kv_heads, head_dim, page_size, dtype=jnp.float32,
              seed=0, pad_tokens=3, max_pages=None):
        rng = np.random.default_rng(seed)
        k, v, tables = _pool(rng, context_lens, page_size, kv_heads, head_dim, dtype, max_pages)
        cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        q = jnp.asarray(rng.standard_normal((int(cu[-1]) + pad_tokens, heads, head_dim)), dtype)
        return q, k, v, tables, jnp.asarray(context_lens, jnp.int32), jnp.asarray(cu)
    return build


def max_err(a, b):
    return float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))


TOL = {jnp.float32: 1e-5, jnp.bfloat16: 2e-2}


@pytest.fixture(name="fast_jit")
def fast_jit_fixture():
    return fast_jit


@pytest.fixture
def assert_close():
    def check(out, ref, dtype):
        assert out.shape == ref.shape and out.dtype == ref.dtype
        err = max_err(out, ref)
        assert err <= TOL[dtype], f"max abs err {err} > {TOL[dtype]} ({jnp.dtype(dtype).name})"
    return check
