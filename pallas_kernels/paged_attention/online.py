"""Paged attention in plain XLA that reads only the live pages: the fast path where Pallas is absent.

The references in ``reference.py`` gather every sequence's whole block table ([B, M*S, K, D])
and then attend: simple and exact, but on a CPU the gathered copy outgrows the caches and the
cost follows the padded table width M rather than the tokens actually cached (at B = 64,
M = 32, S = 16 one layer took ~60 ms, of which the live 200 tokens needed a tenth). Here a
``lax.fori_loop`` walks the block tables a few pages at a time, only up to the longest live
sequence in the batch, and keeps a flash-attention running max / sum / accumulator, so each
step touches [B, pages_per_step * S, K, D] of K/V and the work follows the live length.

Axis names as in ``reference.py``: B sequences, Q new tokens per sequence, H query heads,
K kv heads, G = H // K, D head dim, P pages in the pool, S page size, M pages per table.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

_NEG_INF = -1e30
TOKENS_PER_STEP = 32  # K/V tokens per loop step: large enough to amortise the loop, small enough to stay in cache


def uniform_paged_attention_online(q, k_pages, v_pages, block_tables, context_lens, q_len, *,
                                   sm_scale=None, soft_cap=None, sliding_window=None, pages_per_step=None):
    """Each sequence has exactly ``q_len`` new tokens; q [B*q_len, H, D], rows grouped by sequence.

    Same contract as ``uniform_paged_attention_reference``: the i-th new token of sequence b sits
    at position ``context_lens[b] - q_len + i`` and sees keys at positions <= its own; sequences
    with context length 0 get zeros. Returns [B*q_len, H, D] in q's dtype.
    """
    sm_scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    b, m = block_tables.shape
    s_page, kv_heads = k_pages.shape[1], k_pages.shape[2]
    h, d = q.shape[1:]
    g = h // kv_heads
    chunk = pages_per_step or max(1, TOKENS_PER_STEP // s_page)
    tables = jnp.pad(block_tables, ((0, 0), (0, (-m) % chunk)))  # padding pages are masked out below
    qg = q.reshape(b, q_len, kv_heads, g, d).astype(jnp.float32) * sm_scale
    query_pos = context_lens[:, None] - q_len + jnp.arange(q_len)[None, :]  # [B, Q]
    num_steps = (jnp.max(context_lens) + chunk * s_page - 1) // (chunk * s_page)

    def step(i, carry):
        run_max, run_sum, acc = carry  # [B, K, G, Q], [B, K, G, Q], [B, K, G, Q, D]
        pages = jax.lax.dynamic_slice_in_dim(tables, i * chunk, chunk, axis=1)  # [B, C]
        k = k_pages[pages].reshape(b, chunk * s_page, kv_heads, d).astype(jnp.float32)
        v = v_pages[pages].reshape(b, chunk * s_page, kv_heads, d).astype(jnp.float32)
        s = jnp.einsum("bqkgd,blkd->bkgql", qg, k)
        if soft_cap is not None:
            s = soft_cap * jnp.tanh(s / soft_cap)
        key_pos = i * chunk * s_page + jnp.arange(chunk * s_page)
        mask = (key_pos[None, None, :] <= query_pos[:, :, None]) & (key_pos[None, None, :] < context_lens[:, None, None])
        if sliding_window is not None:
            mask &= key_pos[None, None, :] > query_pos[:, :, None] - sliding_window
        mask = mask[:, None, None]  # [B, 1, 1, Q, L]
        s = jnp.where(mask, s, _NEG_INF)
        new_max = jnp.maximum(run_max, jnp.max(s, axis=-1))
        scale = jnp.exp(run_max - new_max)
        p = jnp.exp(s - new_max[..., None]) * mask
        run_sum = run_sum * scale + jnp.sum(p, axis=-1)
        acc = acc * scale[..., None] + jnp.einsum("bkgql,blkd->bkgqd", p, v)
        return new_max, run_sum, acc

    init = (jnp.full((b, kv_heads, g, q_len), _NEG_INF, jnp.float32), jnp.zeros((b, kv_heads, g, q_len), jnp.float32),
            jnp.zeros((b, kv_heads, g, q_len, d), jnp.float32))
    _, run_sum, acc = jax.lax.fori_loop(0, num_steps, step, init)
    o = acc / jnp.maximum(run_sum, 1e-30)[..., None]  # [B, K, G, Q, D]; rows with nothing to see stay 0
    return o.transpose(0, 3, 1, 2, 4).reshape(b * q_len, h, d).astype(q.dtype)


def paged_attention_online(q, k_pages, v_pages, block_tables, lengths, **kwargs):
    """Decode attention (one query token per sequence), same contract as ``paged_attention_reference``."""
    return uniform_paged_attention_online(q, k_pages, v_pages, block_tables, lengths, 1, **kwargs)
