"""Attention that cannot be poisoned: whatever the pool holds outside the live tokens (NaN, inf),
every implementation's output is unchanged and finite.

Block tables are padded with 0 as the engine pads them, and page 0 belongs to a live sequence, so a
padded entry aliases another sequence's page (its slots past that sequence's end poisoned too).
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.paged_attention import (
    paged_attention,
    paged_attention_online,
    paged_attention_reference,
    ragged_paged_attention,
    ragged_paged_attention_online,
    ragged_paged_attention_reference,
    tokens_minor,
    uniform_paged_attention_online,
    uniform_paged_attention_reference,
)

from jaxserve.kernels.cpu import attention as cpu_attention, build

HEADS, KV_HEADS, HEAD_DIM, PAGE = 4, 2, 16, 8
MAX_PAGES = 6  # wider than any sequence needs: padded entries in every row
FAST_COMPILE = {"xla_backend_optimization_level": 0}  # as in conftest.py: these programs are compile-bound


def _case(context_lens, num_queries, seed=0):
    """q f32[num_queries, H, D], clean pool [P, S, K, D], tables i32[B, M] padded with 0, a live mask."""
    rng = np.random.default_rng(seed)
    needed = [-(-n // PAGE) for n in context_lens]
    num_pages = sum(needed) + 3
    perm = rng.permutation(num_pages)
    perm = np.concatenate([[0], perm[perm != 0]])  # page 0 is a live page of the first sequence
    tables = np.zeros((len(context_lens), MAX_PAGES), np.int32)
    live = np.zeros((num_pages, PAGE), bool)
    at = 0
    for b, (n, m) in enumerate(zip(context_lens, needed)):
        tables[b, :m] = perm[at:at + m]
        at += m
        for pos in range(n):
            live[tables[b, pos // PAGE], pos % PAGE] = True
    shape = (num_pages, PAGE, KV_HEADS, HEAD_DIM)
    k, v = rng.standard_normal(shape, np.float32), rng.standard_normal(shape, np.float32)
    q = rng.standard_normal((num_queries, HEADS, HEAD_DIM), np.float32)
    return jnp.asarray(q), k, v, jnp.asarray(tables), live


def _poisoned(pages, live, value):
    return jnp.asarray(np.where(live[:, :, None, None], pages, np.float32(value)))


def _check_unpoisonable(attention, q, k, v, live, *args):
    fn = jax.jit(lambda q, k, v: attention(q, k, v, *args), compiler_options=FAST_COMPILE)
    clean = np.asarray(fn(q, jnp.asarray(k), jnp.asarray(v)))
    assert np.isfinite(clean).all()
    for value in (np.nan, np.inf, -np.inf):
        out = np.asarray(fn(q, _poisoned(k, live, value), _poisoned(v, live, value)))
        assert np.isfinite(out).all(), f"pool filled with {value} leaked into the output"
        np.testing.assert_array_equal(out, clean, err_msg=f"pool filled with {value} changed the output")


def _tokens_minor(fn):
    return lambda q, k, v, *a, **kw: fn(q, tokens_minor(k), v, *a, **kw)


needs_cpu_kernels = pytest.mark.skipif(build.unavailable_reason() is not None or build.load() is None,
                                       reason=f"CPU kernels unavailable: {build.unavailable_reason()}")


def _cpu(fn):
    return _tokens_minor(functools.partial(fn, threads=2))


def _impls(table):
    """The keys of an implementation table, the CPU kernel's skipped where it cannot be built."""
    return [pytest.param(k, marks=needs_cpu_kernels) if k.startswith("cpu") else k for k in table]


DECODE = {
    "reference": paged_attention_reference,
    "xla": _tokens_minor(paged_attention_online),
    "xla-loop": _tokens_minor(functools.partial(paged_attention_online, pages_per_step=1)),
    "pallas": functools.partial(paged_attention, interpret=True, pages_per_compute_block=2, num_splits=2),
    "cpu-kernel": _cpu(cpu_attention.paged_attention_cpu),
}
UNIFORM = {
    "reference": uniform_paged_attention_reference,
    "xla": _tokens_minor(uniform_paged_attention_online),
    "xla-loop": _tokens_minor(functools.partial(uniform_paged_attention_online, pages_per_step=2)),
    "cpu-kernel": _cpu(cpu_attention.uniform_paged_attention_cpu),
}
RAGGED = {
    "reference": ragged_paged_attention_reference,
    "xla": _tokens_minor(ragged_paged_attention_online),
    "xla-chunks": _tokens_minor(functools.partial(ragged_paged_attention_online, max_chunks=2)),
    "xla-loop": _tokens_minor(functools.partial(ragged_paged_attention_online, pages_per_step=1, tile=4)),
    "pallas": functools.partial(ragged_paged_attention, interpret=True, tile_q=4, pages_per_compute_block=2),
    "cpu-kernel": _cpu(cpu_attention.ragged_paged_attention_cpu),
}


@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("impl", _impls(DECODE))
def test_decode(impl, window):
    lengths = [13, 1, 0, 30]  # a partial last page, a one-token sequence, an idle padding row
    q, k, v, tables, live = _case(lengths, len(lengths))
    fn = functools.partial(DECODE[impl], sliding_window=window)
    _check_unpoisonable(fn, q, k, v, live, tables, jnp.asarray(lengths, jnp.int32))


@pytest.mark.parametrize("impl", _impls(UNIFORM))
def test_uniform(impl):
    q_len, lengths = 3, [3, 11, 20]
    q, k, v, tables, live = _case(lengths, q_len * len(lengths))
    _check_unpoisonable(UNIFORM[impl], q, k, v, live, tables, jnp.asarray(lengths, jnp.int32), q_len)


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("impl", _impls(RAGGED))
def test_ragged(impl, window):
    q_lens, lengths = [5, 1, 0, 9], [12, 7, 0, 9]  # a chunk on a prefix, a decode, idle, a fresh prompt
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    q, k, v, tables, live = _case(lengths, int(cu[-1]) + 3)  # 3 padding rows
    fn = functools.partial(RAGGED[impl], sliding_window=window)
    _check_unpoisonable(fn, q, k, v, live, tables, jnp.asarray(lengths, jnp.int32), jnp.asarray(cu))


@pytest.mark.parametrize("impl", ["xla", "xla-no-cpu-kernel", "reference", "pallas"])
def test_engine_with_a_nan_pool_gives_the_clean_greedy_tokens(impl, monkeypatch):
    """Every block of the pool starts as NaN: only what the engine writes may ever be read. ("xla" reads through
    the CPU attention kernel where it is usable; "xla-no-cpu-kernel" through the XLA loop.)"""
    if impl == "xla-no-cpu-kernel":
        monkeypatch.setenv(cpu_attention.ENV_SWITCH, "0")
        impl = "xla"
    from jaxserve import LLM, SamplingParams
    from jaxserve.models import get_preset, init_params

    config = get_preset("tiny-llama").replace(vocab_size=97, max_position_embeddings=128)
    params = init_params(config, jax.random.key(5))
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 97, int(n)).tolist() for n in (5, 11)]  # partial last blocks
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    engine = dict(block_size=4, max_num_seqs=2, max_num_batched_tokens=16, num_kv_blocks=16,
                  attention_impl=impl)

    def run(poison):
        llm = LLM.from_params(config, params, **engine)
        if poison:
            runner = llm.engine.runner
            runner.pool = jax.tree.map(lambda x: jnp.full_like(x, jnp.nan), runner.pool)
        first = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]
        # the second call reuses freed blocks (stale values, NaN tails) and aliases them with padding
        second = [o.outputs[0].token_ids for o in llm.generate(prompts[::-1], greedy, use_tqdm=False)]
        return first, second

    assert run(poison=True) == run(poison=False)
