"""Cached forward through the paged pool equals the uncached full-sequence forward."""
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.cache.kv_pool import init_kv_pool
from jaxserve.models.attention_backends import new_kv_pool
from jaxserve.models import AttentionMetadata, forward, get_preset, init_params
from tests.reference_forward import reference_logits

BLOCK = 4


def metadata(tables, starts, q_lens, decode_only=False):
    """Packed-batch metadata for sequences whose new tokens start at ``starts`` (host-side numpy)."""
    slots, cu = [], [0]
    for table, start, n in zip(tables, starts, q_lens):
        slots += [table[p // BLOCK] * BLOCK + p % BLOCK for p in range(start, start + n)]
        cu.append(cu[-1] + n)
    return AttentionMetadata(slot_mapping=jnp.array(slots, jnp.int32), block_tables=jnp.array(tables, jnp.int32),
                             context_lens=jnp.array(np.add(starts, q_lens), jnp.int32),
                             cu_q_lens=jnp.array(cu, jnp.int32), decode_only=decode_only)


@pytest.mark.parametrize("impl", ["xla", "reference"])  # the two pool layouts: K as [P, K, D, S] and [P, S, K, D]
@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3"])
def test_chunked_prefill_then_decode_equals_full_forward(preset, impl):
    run = jax.jit(forward, static_argnames=("config", "attention_impl"))  # one program a shape: eager ops cost more
    config = get_preset(preset)
    params = init_params(config, jax.random.key(0))
    rng = np.random.default_rng(0)
    lengths = [13, 7]
    total = [n + 5 for n in lengths]  # 5 decode steps after the prompt
    tokens = [rng.integers(0, config.vocab_size, t) for t in total]
    tables = rng.permutation(16)[:10].reshape(2, 5).tolist()  # scattered pages
    pool = new_kv_pool(config, 16, BLOCK, impl)

    got = [[], []]
    # prefill in two chunks per sequence, both sequences packed in one batch
    for lo, hi in [(0, 6), (6, None)]:
        chunks = [t[lo:(hi or n)] for t, n in zip(tokens, lengths)]
        meta = metadata(tables, [lo, lo], [len(c) for c in chunks])
        toks = jnp.array(np.concatenate(chunks), jnp.int32)
        pos = jnp.array(np.concatenate([np.arange(lo, lo + len(c)) for c in chunks]), jnp.int32)
        logits, pool = run(params, config, toks, pos, pool, meta, attention_impl=impl)
        for b, c in enumerate(np.split(np.asarray(logits), np.cumsum([len(c) for c in chunks])[:-1])):
            got[b].append(c)
    for step in range(5):
        pos = [n + step for n in lengths]
        meta = metadata(tables, pos, [1, 1], decode_only=True)
        toks = jnp.array([t[p] for t, p in zip(tokens, pos)], jnp.int32)
        logits, pool = run(params, config, toks, jnp.array(pos, jnp.int32), pool, meta, attention_impl=impl)
        for b in range(2):
            got[b].append(np.asarray(logits[b:b + 1]))

    for b in range(2):
        expected = reference_logits(params, config, tokens[b])[0]
        np.testing.assert_allclose(np.concatenate(got[b]), expected, atol=1e-5)


@pytest.mark.parametrize("impl", ["xla", "reference"])
def test_padding_tokens_do_not_touch_the_pool(impl):
    config = get_preset("tiny-llama")
    params = init_params(config, jax.random.key(1))
    pool = new_kv_pool(config, 4, BLOCK, impl)
    meta = metadata([[2, 3]], [0], [3])
    meta = meta.replace(slot_mapping=jnp.array([8, 9, 10, -1, -1], jnp.int32))
    toks = jnp.array([5, 6, 7, 0, 0], jnp.int32)
    _, pool = forward(params, config, toks, jnp.array([0, 1, 2, 0, 0], jnp.int32), pool, meta, attention_impl=impl)
    k, v = np.asarray(pool.layers[0].k), np.asarray(pool.layers[0].v)
    if pool.k_tokens_minor:
        k = k.transpose(0, 3, 1, 2)  # back to [P, S, K, D]
    for k in (k, v):
        assert np.all(k[[0, 1, 3]] == 0) and np.all(k[2, 3] == 0) and np.all(k[2, :3] != 0)


@pytest.mark.parametrize("impl", ["xla", "reference"])
def test_fresh_prompts_attend_without_the_pool_and_fill_it_alike(impl):
    """``fresh`` (whole right-padded prompts, nothing cached) skips the pool for attention: same logits at
    the real tokens as the full forward, and the same pool as the paged path writes."""
    config = get_preset("tiny-qwen3")
    params = init_params(config, jax.random.key(2))
    rng = np.random.default_rng(2)
    lp, lengths = 8, [8, 5]
    prompts = rng.integers(1, config.vocab_size, (2, lp))
    tables = [[3, 0, 5], [1, 4, 2]]
    slots = [[t[p // BLOCK] * BLOCK + p % BLOCK if p < n else -1 for p in range(lp)] for t, n in zip(tables, lengths)]
    pools, logits = {}, {}
    for fresh in (False, True):
        meta = AttentionMetadata(slot_mapping=jnp.array(slots, jnp.int32).reshape(-1), block_tables=jnp.array(tables),
                                 context_lens=jnp.full(2, lp, jnp.int32), cu_q_lens=jnp.arange(3, dtype=jnp.int32) * lp,
                                 uniform_q_len=lp, fresh=fresh)
        pool = new_kv_pool(config, 6, BLOCK, impl)
        out, pools[fresh] = forward(params, config, jnp.array(prompts.reshape(-1), jnp.int32),
                                    jnp.tile(jnp.arange(lp, dtype=jnp.int32), 2), pool, meta, attention_impl=impl)
        logits[fresh] = np.asarray(out).reshape(2, lp, -1)
    for b, n in enumerate(lengths):
        expected = reference_logits(params, config, prompts[b:b + 1, :n])[0]
        np.testing.assert_allclose(logits[True][b, :n], expected, atol=1e-5)
        np.testing.assert_allclose(logits[False][b, :n], expected, atol=1e-5)
    for layer, (l0, l1) in enumerate(zip(pools[False].layers, pools[True].layers)):
        for paged, fresh in ((l0.k, l1.k), (l0.v, l1.v)):  # layer 0's K/V precede any attention: bit-identical
            (np.testing.assert_array_equal if layer == 0 else partial(np.testing.assert_allclose, atol=1e-5))(
                np.asarray(fresh), np.asarray(paged))


def test_fresh_needs_uniform_rows():
    config = get_preset("tiny-llama")
    params = init_params(config, jax.random.key(3))
    pool = init_kv_pool(config.num_layers, 4, BLOCK, config.num_kv_heads, config.head_dim)
    meta = metadata([[0, 1]], [0], [3]).replace(fresh=True)
    with pytest.raises(ValueError, match="fresh needs uniform_q_len"):
        forward(params, config, jnp.array([5, 6, 7], jnp.int32), jnp.arange(3, dtype=jnp.int32), pool, meta,
                attention_impl="reference")


def test_bf16_model_pool_dtype_on_cpu_and_reads_the_same_values():
    """XLA:CPU widens a whole bf16 pool around every gather, so the xla backend stores a bf16 model's K/V in
    float32 there unless the C++ attention kernel reads the pool (``cpu_attention.available()``): then as bf16 bits
    (uint16), each element widened as it is read. The rows written are bf16-rounded, so the logits from float32,
    bf16 and bf16-bits pools are equal bit for bit (prefill, then decode steps reading the cache)."""
    from jaxserve.kernels.cpu import attention as cpu_attention
    from jaxserve.models.attention_backends import attention_backend
    run = jax.jit(forward, static_argnames=("config", "attention_impl"))
    config = get_preset("tiny-llama").replace(dtype="bfloat16")
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), init_params(config, jax.random.key(2)))
    chosen = new_kv_pool(config, 8, BLOCK, "xla").layers[0]
    if jax.default_backend() == "cpu":
        assert chosen.k.dtype == chosen.v.dtype == (jnp.uint16 if cpu_attention.available() else jnp.float32)
    minor = attention_backend("xla").k_tokens_minor
    pools = [init_kv_pool(config.num_layers, 8, BLOCK, config.num_kv_heads, config.head_dim, dt, k_tokens_minor=minor)
             for dt in (jnp.float32, jnp.bfloat16, jnp.uint16)]
    tokens = np.random.default_rng(2).integers(0, config.vocab_size, 11)
    table = [[5, 2, 7]]
    outs = []
    for pool in pools:
        got = []
        meta = metadata(table, [0], [8])
        logits, pool = run(params, config, jnp.array(tokens[:8], jnp.int32), jnp.arange(8, dtype=jnp.int32), pool,
                           meta, attention_impl="xla")
        got.append(np.asarray(logits))
        for p in range(8, 11):
            meta = metadata(table, [p], [1], decode_only=True)
            logits, pool = run(params, config, jnp.array(tokens[p:p + 1], jnp.int32), jnp.array([p], jnp.int32),
                               pool, meta, attention_impl="xla")
            got.append(np.asarray(logits))
        outs.append(np.concatenate(got))
    for other in outs[1:]:
        np.testing.assert_array_equal(other, outs[0])
