"""The live-pages XLA path (online softmax over page chunks) equals the gather-everything references."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.paged_attention import online
from pallas_kernels.paged_attention import (
    paged_attention_online,
    paged_attention_reference,
    ragged_paged_attention_online,
    ragged_paged_attention_reference,
    tokens_minor,
    uniform_paged_attention_online,
    uniform_paged_attention_reference,
)


@pytest.mark.parametrize("lengths, page_size, pages_per_step, max_pages", [
    ([1, 5, 17, 40], 4, 1, None),       # one page per loop step
    ([3, 33, 64, 0], 8, 3, 9),          # table width not a multiple of the step; an empty sequence
    ([100, 7], 16, None, 12),           # default step size, a mostly padded table
])
def test_decode_equals_reference(decode_case, lengths, page_size, pages_per_step, max_pages):
    q, k, v, tables, lens = decode_case(lengths, heads=8, kv_heads=2, head_dim=16, page_size=page_size,
                                        max_pages=max_pages)
    want = paged_attention_reference(q, k, v, tables, lens)
    got = paged_attention_online(q, tokens_minor(k), v, tables, lens, pages_per_step=pages_per_step)
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("window, cap, dtype, atol", [(None, None, jnp.float32, 2e-6), (6, None, jnp.float32, 2e-6),
                                                      (None, 20.0, jnp.float32, 2e-6), (None, None, jnp.bfloat16, 2e-2)])
def test_decode_options(decode_case, window, cap, dtype, atol):
    q, k, v, tables, lens = decode_case([9, 30, 2], heads=4, kv_heads=4, head_dim=8, page_size=4, dtype=dtype)
    kw = dict(sliding_window=window, soft_cap=cap)
    want = paged_attention_reference(q, k, v, tables, lens, **kw)
    got = paged_attention_online(q, tokens_minor(k), v, tables, lens, pages_per_step=2, **kw)
    assert got.dtype == dtype
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), atol=atol)


@pytest.mark.parametrize("lengths, heads, window, cap", [
    ([13, 0], 2, None, None),  # batch x heads = 4: one whole-table step (an empty sequence gets zeros)
    ([21], 4, 5, 20.0),        # a single row, with a sliding window and a soft cap
    ([13, 7], 4, None, None),  # 8 query vectors: the page loop
])
def test_narrowest_decode_reads_the_table_in_one_step(decode_case, lengths, heads, window, cap):
    q, k, v, tables, lens = decode_case(lengths, heads=heads, kv_heads=1, head_dim=16, page_size=4, max_pages=6)
    kw = dict(sliding_window=window, soft_cap=cap)
    want = paged_attention_reference(q, k, v, tables, lens, **kw)
    got = paged_attention_online(q, tokens_minor(k), v, tables, lens, **kw)
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=1e-5)
    one_step = len(lengths) * heads <= online.WHOLE_TABLE_DECODE_ROWS
    jaxpr = str(jax.make_jaxpr(lambda *a: paged_attention_online(*a, **kw))(q, tokens_minor(k), v, tables, lens))
    assert ("while" not in jaxpr) == one_step


@pytest.mark.parametrize("q_len, window", [(1, None), (2, None), (5, None), (4, 3)])
@pytest.mark.parametrize("pages_per_step", [2, None])  # the page loop; one step over the 24-token table
def test_uniform_equals_reference(q_len, window, pages_per_step):
    rng = np.random.default_rng(q_len)
    pages, page, kv_heads, heads, dim, seqs, per_seq = 30, 4, 2, 4, 16, 4, 6
    k = jnp.asarray(rng.normal(size=(pages, page, kv_heads, dim)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(pages, page, kv_heads, dim)), jnp.float32)
    tables = jnp.asarray(rng.permutation(pages)[: seqs * per_seq].reshape(seqs, per_seq), jnp.int32)
    context = jnp.asarray([q_len, 9 + q_len, 23, 0], jnp.int32)
    q = jnp.asarray(rng.normal(size=(seqs * q_len, heads, dim)), jnp.float32)
    want = uniform_paged_attention_reference(q, k, v, tables, context, q_len, sliding_window=window)
    assert (pages_per_step is None) == online._whole_table(per_seq, page, pages_per_step)
    got = uniform_paged_attention_online(q, tokens_minor(k), v, tables, context, q_len,
                                         pages_per_step=pages_per_step, sliding_window=window)
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=1e-5)
    np.testing.assert_array_equal(got[3 * q_len:], 0)


def test_pages_past_the_longest_sequence_are_never_read(decode_case):
    """The loop stops at the longest live length: garbage in later table entries cannot matter."""
    q, k, v, tables, lens = decode_case([5, 11], heads=2, kv_heads=1, head_dim=8, page_size=4, max_pages=6)
    live = set(np.asarray(tables[:, :3]).ravel().tolist())
    spare = min(set(range(k.shape[0])) - live)
    k_bad = k.at[spare].set(jnp.nan)  # table entries past the live pages point at a poisoned page
    tables_bad = tables.at[:, 3:].set(spare)
    got = paged_attention_online(q, tokens_minor(k_bad), v, tables_bad, lens, pages_per_step=1)
    want = paged_attention_reference(q, k, v, tables, lens)
    np.testing.assert_allclose(got, want, atol=2e-6)


@pytest.mark.parametrize("q_lens, contexts, tile, window", [
    ([1, 7, 1, 20], [9, 7, 30, 44], 4, None),   # decode rows beside prefill chunks, a fresh prompt
    ([5, 0, 3], [12, 0, 3], 16, None),          # an empty sequence; tiles larger than any chunk
    ([6, 2], [25, 14], 4, 5),                   # sliding window
])
@pytest.mark.parametrize("max_chunks", [None, 2])  # every case has <= 2 multi-token sequences
def test_ragged_equals_reference(q_lens, contexts, tile, window, max_chunks):
    rng = np.random.default_rng(len(q_lens))
    pages, page, kv_heads, heads, dim, per_seq = 48, 4, 2, 4, 8, 12
    k = jnp.asarray(rng.normal(size=(pages, page, kv_heads, dim)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(pages, page, kv_heads, dim)), jnp.float32)
    seqs = len(q_lens)
    tables = jnp.asarray(rng.permutation(pages)[: seqs * per_seq].reshape(seqs, per_seq), jnp.int32)
    total = sum(q_lens)
    q = jnp.asarray(rng.normal(size=(total + 3, heads, dim)), jnp.float32)  # 3 padding rows
    cu = jnp.asarray(np.r_[0, np.cumsum(q_lens)], jnp.int32)
    context = jnp.asarray(contexts, jnp.int32)
    want = ragged_paged_attention_reference(q, k, v, tables, context, cu, sliding_window=window)
    got = ragged_paged_attention_online(q, tokens_minor(k), v, tables, context, cu, tile=tile, pages_per_step=2,
                                        sliding_window=window, max_chunks=max_chunks)
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=1e-5)
    np.testing.assert_array_equal(got[total:], 0)


# Multi-query calls on tables at most WHOLE_TABLE_TOKENS wide skip the loop when pages_per_step is not forced.
@pytest.mark.parametrize("lengths, page_size, window, cap", [
    ([1, 5, 17, 40, 0], 4, None, None),  # an empty sequence; width 40 tokens
    ([9, 30, 2], 8, 6, None),            # sliding window
    ([100, 7, 60], 16, None, 20.0),      # soft cap; a 112-token table
])
def test_whole_table_single_query_equals_reference(decode_case, lengths, page_size, window, cap):
    q, k, v, tables, lens = decode_case(lengths, heads=8, kv_heads=2, head_dim=16, page_size=page_size)
    assert online.WHOLE_TABLE_TOKENS >= tables.shape[1] * page_size  # the case exercises the whole-table path
    kw = dict(sliding_window=window, soft_cap=cap)
    want = paged_attention_reference(q, k, v, tables, lens, **kw)
    got = uniform_paged_attention_online(q, tokens_minor(k), v, tables, lens, 1, **kw)
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(got)[np.asarray(lens) == 0], 0)


def test_whole_table_ignores_what_unused_entries_point_at(decode_case):
    """The whole table is read, but pages past each sequence's length are masked (V zeroed): NaN there cannot leak."""
    q, k, v, tables, lens = decode_case([5, 11], heads=2, kv_heads=1, head_dim=8, page_size=4, max_pages=6)
    live = set(np.asarray(tables[:, :3]).ravel().tolist())
    spare = min(set(range(k.shape[0])) - live)
    tables_bad = tables.at[0, 2:].set(spare).at[1, 3:].set(spare)  # past each sequence's live pages
    k_bad, v_bad = k.at[spare].set(jnp.nan), v.at[spare].set(jnp.nan)
    want = paged_attention_reference(q, k, v, tables, lens)
    got = uniform_paged_attention_online(q, tokens_minor(k_bad), v_bad, tables_bad, lens, 1)
    np.testing.assert_allclose(got, want, atol=2e-6)
