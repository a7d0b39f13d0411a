"""Plain-jnp paged attention: the oracle for the Pallas kernels and the XLA path on CPU.

Axis names: B sequences, T packed query tokens, H query heads, K kv heads, D head dim,
P pages (blocks) in the pool, S page size (block size), M pages per sequence in a block table.

Pool layout (one layer): ``k_pages, v_pages: [P, S, K, D]``. A sequence's token at position
``p`` lives in page ``block_tables[b, p // S]`` at offset ``p % S``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

_NEG_INF = -1e30


def _gather_pages(pages, block_tables):
    """[P, S, K, D] through i32[..., M] -> [..., M*S, K, D]."""
    g = pages[block_tables]  # [..., M, S, K, D]
    return g.reshape(*block_tables.shape[:-1], -1, *pages.shape[2:])


def _attend(q, k, v, mask, sm_scale, soft_cap):
    """q [N, H, D], k/v [N, L, K, D], mask bool[N, L] -> [N, H, D] (float32 softmax).

    Masked keys contribute exactly zero whatever the pages hold (NaN included): their scores and
    values are selected away, not multiplied by a zero probability."""
    n, h, d = q.shape
    kv_heads = k.shape[2]
    qg = q.reshape(n, kv_heads, h // kv_heads, d).astype(jnp.float32)
    s = jnp.einsum("nkgd,nlkd->nkgl", qg, k.astype(jnp.float32)) * sm_scale
    if soft_cap is not None:
        s = soft_cap * jnp.tanh(s / soft_cap)
    s = jnp.where(mask[:, None, None, :], s, _NEG_INF)
    m = jnp.max(s, axis=-1, keepdims=True)
    p = jnp.where(mask[:, None, None, :], jnp.exp(s - m), 0.0)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    v = jnp.where(mask[:, :, None, None], v.astype(jnp.float32), 0.0)
    o = jnp.einsum("nkgl,nlkd->nkgd", p, v) / jnp.maximum(denom, 1e-30)
    return o.reshape(n, h, d).astype(q.dtype)


def _window_mask(key_pos, query_pos, length, sliding_window):
    mask = (key_pos <= query_pos) & (key_pos < length)
    if sliding_window is not None:
        mask &= key_pos > query_pos - sliding_window
    return mask


def paged_attention_reference(q, k_pages, v_pages, block_tables, lengths, *,
                              sm_scale=None, soft_cap=None, sliding_window=None):
    """Decode attention: one query token per sequence.

    q: [B, H, D]; k_pages, v_pages: [P, S, K, D]; block_tables: i32[B, M]; lengths: i32[B]
    (number of cached tokens, the query's own included). Returns [B, H, D] in q's dtype;
    sequences with length 0 get zeros.
    """
    sm_scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    k = _gather_pages(k_pages, block_tables)
    v = _gather_pages(v_pages, block_tables)
    key_pos = jnp.arange(k.shape[1])[None, :]
    query_pos = (lengths - 1)[:, None]
    mask = _window_mask(key_pos, query_pos, lengths[:, None], sliding_window)
    return _attend(q, k, v, mask, sm_scale, soft_cap)


def uniform_paged_attention_reference(q, k_pages, v_pages, block_tables, context_lens, q_len, *,
                                      sm_scale=None, soft_cap=None, sliding_window=None):
    """Every sequence has exactly ``q_len`` new tokens: q [B*q_len, H, D], rows grouped by sequence.

    The ragged layout with ``cu_q_lens = arange(B+1) * q_len``, but each sequence's pages are
    gathered once for all its queries (the ragged reference gathers them per token), which is
    what a speculative verification pass (q_len = gamma + 1) or a padded prefill needs.
    Sequences with context length 0 get zeros.
    """
    sm_scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    b = block_tables.shape[0]
    h, d = q.shape[1:]
    k = _gather_pages(k_pages, block_tables)  # [B, L, K, D]
    v = _gather_pages(v_pages, block_tables)
    kv_heads = k.shape[2]
    qg = q.reshape(b, q_len, kv_heads, h // kv_heads, d).astype(jnp.float32)
    s = jnp.einsum("bqkgd,blkd->bkgql", qg, k.astype(jnp.float32)) * sm_scale
    if soft_cap is not None:
        s = soft_cap * jnp.tanh(s / soft_cap)
    query_pos = context_lens[:, None] - q_len + jnp.arange(q_len)[None, :]  # [B, Q]
    key_pos = jnp.arange(k.shape[1])
    mask = _window_mask(key_pos[None, None, :], query_pos[:, :, None], context_lens[:, None, None], sliding_window)
    mask = mask[:, None, None]  # [B, 1, 1, Q, L]
    s = jnp.where(mask, s, _NEG_INF)
    p = jnp.where(mask, jnp.exp(s - jnp.max(s, axis=-1, keepdims=True)), 0.0)
    live = key_pos[None, :] < context_lens[:, None]  # [B, L]: past it pages may hold anything (NaN)
    v = jnp.where(live[:, :, None, None], v.astype(jnp.float32), 0.0)
    o = jnp.einsum("bkgql,blkd->bqkgd", p, v)
    o = o / jnp.maximum(jnp.sum(p, axis=-1), 1e-30).transpose(0, 3, 1, 2)[..., None]
    return o.reshape(b * q_len, h, d).astype(q.dtype)


def ragged_paged_attention_reference(q, k_pages, v_pages, block_tables, context_lens, cu_q_lens, *,
                                     sm_scale=None, soft_cap=None, sliding_window=None,
                                     token_chunk=64):
    """Multi-query attention over a packed batch, causal within each sequence's new tokens.

    q: [T, H, D] packed: sequence b owns rows ``cu_q_lens[b]:cu_q_lens[b+1]``; block_tables: i32[B, M];
    context_lens: i32[B], the sequence's total length after this step (cached prefix + new tokens,
    whose K/V must already be written to the pool); cu_q_lens: i32[B+1]. The i-th new token of
    sequence b sits at position ``context_lens[b] - q_len_b + i``. Rows at or past ``cu_q_lens[B]``
    are padding and get zeros. Returns [T, H, D] in q's dtype.

    Tokens are processed ``token_chunk`` at a time so the gathered K/V stay bounded.
    """
    sm_scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    t = q.shape[0]
    num_seqs = block_tables.shape[0]
    rows = jnp.arange(t)
    seq = jnp.clip(jnp.searchsorted(cu_q_lens, rows, side="right") - 1, 0, num_seqs - 1)
    q_lens = cu_q_lens[1:] - cu_q_lens[:-1]
    valid = rows < cu_q_lens[num_seqs]
    query_pos = context_lens[seq] - q_lens[seq] + (rows - cu_q_lens[seq])
    length = jnp.where(valid, context_lens[seq], 0)

    chunk = min(token_chunk, t)
    pad = (-t) % chunk

    def run_chunk(args):
        q_c, seq_c, qpos_c, len_c = args
        k = _gather_pages(k_pages, block_tables[seq_c])
        v = _gather_pages(v_pages, block_tables[seq_c])
        key_pos = jnp.arange(k.shape[1])[None, :]
        mask = _window_mask(key_pos, qpos_c[:, None], len_c[:, None], sliding_window)
        return _attend(q_c, k, v, mask, sm_scale, soft_cap)

    def padded(x):
        return jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)).reshape(-1, chunk, *x.shape[1:])

    out = jax.lax.map(run_chunk, (padded(q), padded(seq), padded(query_pos), padded(length)))
    return out.reshape(-1, *q.shape[1:])[:t]
