"""Paged attention in plain XLA that reads only the live pages: the fast path where Pallas is absent.

The references in ``reference.py`` gather every sequence's whole block table ([B, M*S, K, D])
and then attend: simple and exact, but on a CPU the gathered copy outgrows the caches and the
cost follows the padded table width M rather than the tokens actually cached (at B = 64,
M = 32, S = 16 one layer took ~60 ms, of which the live 200 tokens needed a tenth). Here a
``lax.fori_loop`` walks the block tables a few pages at a time, only up to the longest live
sequence in the batch, and keeps a flash-attention running max / sum / accumulator, so each
step touches [B, pages_per_step * S, K, D] of K/V and the work follows the live length.

K pool layout: tokens innermost, ``kt_pages [P, K, D, S]`` (vLLM's CUDA kernels use a close relative,
[P, K, D/x, S, x]); V stays ``[P, S, K, D]``. XLA:CPU vectorises along the minor axis only: with tokens minor, the
decode scores are a sum over D of [.., S]-vector multiply-adds, and with D minor the output is a sum
over tokens of [.., D]-vector ones. Written as explicit unrolled sums, both run on full SIMD vectors;
as ``dot_general`` or a ``reduce`` over D the same work took ~2x longer (B=64, 200 live tokens,
K=4, D=32: one layer 2.3-2.7 ms vs 4.2-4.6 ms with K as [P, S, K, D]; an uncommitted probe on the
idle 2-core Sapphire Rapids machine, 2026-11-29). The multi-query bodies keep ``einsum`` (there the
unrolled form was faster only from batch 16 up). Pools for this path are built with ``k_tokens_minor=True``
(``jaxserve.cache.kv_pool``); ``tokens_minor(k_pages)`` converts a [P, S, K, D] array.

Multi-query calls (``uniform_paged_attention_online``: a speculative verify, the draft's two-token
catch-up step) on narrow tables (at most ``WHOLE_TABLE_TOKENS`` = M*S tokens, e.g. the speculative
while-loop's 64-token prompt + 64 tokens + lookahead = 9 pages of 16) skip the loop: one step
gathers the whole table and masks what lies past each sequence. There the loop's fixed cost per
step outweighs the padding it avoids: six chained calls at batch 1, 5 queries, 100 live tokens of
a 144-token table took 0.30 ms with the loop and 0.14 ms in one step; the one step was never slower
at 144 tokens (even at 40 live tokens, 5 queries, batch 4-16), while at 256-token tables with 40 live
tokens it lost by up to 1.9x, so those are left to the loop
(``benchmarks/attention_whole_table.py``; figures in ``benchmarks/RESULTS.md``). Decode calls keep
the loop, except the narrowest: with at most ``WHOLE_TABLE_DECODE_ROWS`` = 4 query vectors in all
(batch x query heads, e.g. the 2-head draft model at batch 1) the loop's vectors are mostly empty and
its per-step cost dominates, so they take the one-step path too (the draft's γ 5 proposal at batch 1,
100 live tokens of a 144-token table: 0.342 -> 0.284 ms; the 8-head target's decode step at batch 1
was ~8% slower that way, and the draft's at batch 4 no faster).

Axis names as in ``reference.py``: B sequences, Q new tokens per sequence, H query heads,
K kv heads, G = H // K, D head dim, P pages in the pool, S page size, M pages per table.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

_NEG_INF = -1e30
TOKENS_PER_STEP = 32  # K/V tokens per loop step: large enough to amortise the loop, small enough to stay in cache
WHOLE_TABLE_TOKENS = 160  # tables up to this many tokens wide are read in one step, without the loop
WHOLE_TABLE_DECODE_ROWS = 4  # ... by decode calls too when batch x query heads is at most this


def _whole_table(m: int, s_page: int, pages_per_step: int | None) -> bool:
    """Whether to attend over the whole block table at once (an explicit ``pages_per_step`` asks for the loop)."""
    return pages_per_step is None and m * s_page <= WHOLE_TABLE_TOKENS


def tokens_minor(k_pages: jax.Array) -> jax.Array:
    """[P, S, K, D] -> [P, K, D, S], the K layout this module reads."""
    return k_pages.transpose(0, 2, 3, 1)


def uniform_paged_attention_online(q, kt_pages, v_pages, block_tables, context_lens, q_len, *,
                                   sm_scale=None, soft_cap=None, sliding_window=None, pages_per_step=None):
    """Each sequence has exactly ``q_len`` new tokens; q [B*q_len, H, D], rows grouped by sequence.

    Same contract as ``uniform_paged_attention_reference`` except K's layout (``kt_pages [P, K, D, S]``,
    module docstring): the i-th new token of sequence b sits
    at position ``context_lens[b] - q_len + i`` and sees keys at positions <= its own; sequences
    with context length 0 get zeros. Returns [B*q_len, H, D] in q's dtype.
    """
    sm_scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    b, m = block_tables.shape
    kv_heads, s_page = kt_pages.shape[1], kt_pages.shape[3]
    h, d = q.shape[1:]
    g = h // kv_heads
    qg = q.reshape(b, q_len, kv_heads, g, d).astype(jnp.float32) * sm_scale
    query_pos = context_lens[:, None] - q_len + jnp.arange(q_len)[None, :]  # [B, Q]
    if _whole_table(m, s_page, pages_per_step):
        o = _attend_whole_table(qg, kt_pages, v_pages, block_tables, query_pos, context_lens, soft_cap, sliding_window)
        return o.transpose(0, 3, 1, 2, 4).reshape(b * q_len, h, d).astype(q.dtype)
    chunk = pages_per_step or max(1, TOKENS_PER_STEP // s_page)
    tables = jnp.pad(block_tables, ((0, 0), (0, (-m) % chunk)))  # padding pages are masked out below
    num_steps = (jnp.max(context_lens) + chunk * s_page - 1) // (chunk * s_page)

    def step(i, carry):  # carry: running max, sum [B, K, G, Q] and accumulator [B, K, G, Q, D]
        pages = jax.lax.dynamic_slice_in_dim(tables, i * chunk, chunk, axis=1)  # [B, C]
        k = kt_pages[pages].astype(jnp.float32)  # [B, C, K, D, S]
        v = v_pages[pages].reshape(b, chunk * s_page, kv_heads, d).astype(jnp.float32)
        s = jnp.einsum("bqkgd,bckds->bkgqcs", qg, k).reshape(b, kv_heads, g, q_len, chunk * s_page)
        if soft_cap is not None:
            s = soft_cap * jnp.tanh(s / soft_cap)
        key_pos = i * chunk * s_page + jnp.arange(chunk * s_page)
        mask = (key_pos[None, None, :] <= query_pos[:, :, None]) & (key_pos[None, None, :] < context_lens[:, None, None])
        if sliding_window is not None:
            mask &= key_pos[None, None, :] > query_pos[:, :, None] - sliding_window
        v = _live_values(v, key_pos[None, :] < context_lens[:, None])
        return _online_update(carry, s, mask[:, None, None], v, "bkgql,blkd->bkgqd")  # mask [B, 1, 1, Q, L]

    init = (jnp.full((b, kv_heads, g, q_len), _NEG_INF, jnp.float32), jnp.zeros((b, kv_heads, g, q_len), jnp.float32),
            jnp.zeros((b, kv_heads, g, q_len, d), jnp.float32))
    _, run_sum, acc = jax.lax.fori_loop(0, num_steps, step, init)
    o = acc / jnp.maximum(run_sum, 1e-30)[..., None]  # [B, K, G, Q, D]; rows with nothing to see stay 0
    return o.transpose(0, 3, 1, 2, 4).reshape(b * q_len, h, d).astype(q.dtype)


def paged_attention_online(q, kt_pages, v_pages, block_tables, lengths, *, sm_scale=None, soft_cap=None,
                           sliding_window=None, pages_per_step=None):
    """Decode attention (one query token per sequence): the contract of ``paged_attention_reference``
    with K as ``kt_pages [P, K, D, S]``.

    The throughput-critical path, so its loop body is written for XLA:CPU's vectoriser (module
    docstring): scores as D unrolled multiply-adds of [B, C, K, G, S] vectors, the output as C*S
    unrolled multiply-adds of [B, K, G, D] vectors. The unrolling grows the program with D and
    pages_per_step * S, which is fine at the head dims served on CPU.
    """
    sm_scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    b, m = block_tables.shape
    kv_heads, d, s_page = kt_pages.shape[1:]
    h = q.shape[1]
    if _whole_table(m, s_page, pages_per_step) and b * h <= WHOLE_TABLE_DECODE_ROWS:
        return uniform_paged_attention_online(q, kt_pages, v_pages, block_tables, lengths, 1, sm_scale=sm_scale,
                                              soft_cap=soft_cap, sliding_window=sliding_window)
    g = h // kv_heads
    chunk = pages_per_step or max(1, TOKENS_PER_STEP // s_page)
    width = chunk * s_page
    tables = jnp.pad(block_tables, ((0, 0), (0, (-m) % chunk)))
    qg = q.reshape(b, 1, kv_heads, g, d, 1).astype(jnp.float32) * sm_scale  # broadcast over C and S
    query_pos = lengths - 1
    num_steps = (jnp.max(lengths) + width - 1) // width

    def step(i, carry):
        run_max, run_sum, acc = carry  # [B, K, G], [B, K, G], [B, K, G, D]
        pages = jax.lax.dynamic_slice_in_dim(tables, i * chunk, chunk, axis=1)  # [B, C]
        k = kt_pages[pages][:, :, :, None].astype(jnp.float32)  # [B, C, K, 1, D, S]
        v = v_pages[pages].astype(jnp.float32)  # [B, C, S, K, D]
        s = sum(qg[..., j, :] * k[..., j, :] for j in range(d))  # [B, C, K, G, S]
        if soft_cap is not None:
            s = soft_cap * jnp.tanh(s / soft_cap)
        key_pos = i * width + jnp.arange(width).reshape(chunk, s_page)
        mask = key_pos[None] <= query_pos[:, None, None]
        if sliding_window is not None:
            mask &= key_pos[None] > query_pos[:, None, None] - sliding_window
        v = _live_values(v, key_pos[None] <= query_pos[:, None, None])  # [B, C, S] live keys
        mask = mask[:, :, None, None, :]  # [B, C, 1, 1, S]
        s = jnp.where(mask, s, _NEG_INF)
        new_max = jnp.maximum(run_max, jnp.max(s, axis=(1, 4)))
        scale = jnp.exp(run_max - new_max)
        p = jnp.where(mask, jnp.exp(s - new_max[:, None, :, :, None]), 0.0)
        run_sum = run_sum * scale + jnp.sum(p, axis=(1, 4))
        pv = sum(p[:, c, :, :, j, None] * v[:, c, j, :, None, :] for c in range(chunk) for j in range(s_page))
        return new_max, run_sum, acc * scale[..., None] + pv

    init = (jnp.full((b, kv_heads, g), _NEG_INF, jnp.float32), jnp.zeros((b, kv_heads, g), jnp.float32),
            jnp.zeros((b, kv_heads, g, d), jnp.float32))
    _, run_sum, acc = jax.lax.fori_loop(0, num_steps, step, init)
    o = acc / jnp.maximum(run_sum, 1e-30)[..., None]
    return o.reshape(b, h, d).astype(q.dtype)


def ragged_paged_attention_online(q, kt_pages, v_pages, block_tables, context_lens, cu_q_lens, *, sm_scale=None,
                                  soft_cap=None, sliding_window=None, tile=16, pages_per_step=None, max_chunks=None):
    """Packed multi-query attention: the contract of ``ragged_paged_attention_reference`` with K as
    ``kt_pages [P, K, D, S]``.

    A mixed step packs decode tokens and prefill chunks of different lengths. The packed rows are
    regrouped into tiles of ``tile`` rows that each belong to one sequence (a 100-token chunk
    fills 7 tiles), so every tile gathers its sequence's pages once per loop step instead of once
    per row, and the tiles run through the loop of ``uniform_paged_attention_online`` with their
    own block-table rows and query positions.

    Without ``max_chunks`` every sequence is tiled (a decode token takes a whole tile) and
    ceil(T / tile) + B tiles always suffice: each sequence wastes less than one tile. With
    ``max_chunks`` (the caller guarantees at most that many sequences have more than one new
    token: the scheduler's ``max_num_partial_prefills``) single-token sequences go through the
    decode body instead, one row each, and only ceil(T / tile) + max_chunks tiles are built. At
    B = 64 and T = 512 that is 40 tiles instead of 96, and a lone 64-token prompt in a 64-seat
    engine gets 4 + max_chunks tiles instead of 68.
    """
    t = q.shape[0]
    num_seqs = block_tables.shape[0]
    rows = jnp.arange(t)
    seq = jnp.clip(jnp.searchsorted(cu_q_lens, rows, side="right") - 1, 0, num_seqs - 1)
    valid = rows < cu_q_lens[num_seqs]
    kw = dict(sm_scale=sm_scale, soft_cap=soft_cap, sliding_window=sliding_window, pages_per_step=pages_per_step)
    if max_chunks is None:
        return _tiled(q, kt_pages, v_pages, block_tables, context_lens, cu_q_lens, seq, valid,
                      jnp.ones(num_seqs, bool), -(-t // tile) + num_seqs, tile, **kw)
    single = (cu_q_lens[1:] - cu_q_lens[:-1]) == 1  # [B]
    last_rows = jnp.clip(cu_q_lens[1:] - 1, 0, t - 1)
    decoded = paged_attention_online(q[last_rows], kt_pages, v_pages, block_tables,
                                     jnp.where(single, context_lens, 0), **kw)  # [B, H, D]
    tiled = _tiled(q, kt_pages, v_pages, block_tables, context_lens, cu_q_lens, seq, valid, ~single,
                   -(-t // tile) + min(max_chunks, num_seqs), tile, **kw)
    return jnp.where((valid & single[seq])[:, None, None], decoded[seq], tiled)


def _tiled(q, kt_pages, v_pages, block_tables, context_lens, cu_q_lens, seq, valid, tiled_seqs, num_tiles, tile, *,
           sm_scale, soft_cap, sliding_window, pages_per_step):
    """The tiled body of ``ragged_paged_attention_online`` for the valid rows (bool[T]; row t belongs
    to sequence ``seq[t]``) of the sequences ``tiled_seqs`` bool[B]; ``num_tiles`` must cover them.
    Other rows get zeros."""
    sm_scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    t, h, d = q.shape
    num_seqs, m = block_tables.shape
    kv_heads, s_page = kt_pages.shape[1], kt_pages.shape[3]
    g = h // kv_heads
    chunk = pages_per_step or max(1, TOKENS_PER_STEP // s_page)
    width = chunk * s_page

    rows = jnp.arange(t)
    q_lens = cu_q_lens[1:] - cu_q_lens[:-1]
    in_tiles = valid & tiled_seqs[seq]
    seq_tiles = jnp.where(tiled_seqs, -(-q_lens // tile), 0)
    first_tile = jnp.cumsum(seq_tiles) - seq_tiles  # exclusive prefix sum, [B]
    local = rows - cu_q_lens[seq]
    tile_id = jnp.where(in_tiles, first_tile[seq] + local // tile, num_tiles)  # other rows fall off the end
    slot = local % tile
    query_pos = context_lens[seq] - q_lens[seq] + local

    q_tiles = jnp.zeros((num_tiles, tile, h, d), q.dtype).at[tile_id, slot].set(q, mode="drop")
    pos_tiles = jnp.full((num_tiles, tile), -1, jnp.int32).at[tile_id, slot].set(query_pos, mode="drop")  # -1: empty
    tables = block_tables[jnp.zeros(num_tiles, jnp.int32).at[tile_id].set(seq, mode="drop")]  # [NT, M]
    tables = jnp.pad(tables, ((0, 0), (0, (-m) % chunk)))
    qg = q_tiles.reshape(num_tiles, tile, kv_heads, g, d).astype(jnp.float32) * sm_scale
    num_steps = (jnp.max(jnp.where(in_tiles, query_pos, -1)) + width) // width  # keys up to the last query
    last_pos = jnp.max(pos_tiles, axis=1)  # [NT]: keys up to each tile's last query are live

    def step(i, carry):  # carry: running max, sum [NT, K, G, tile] and accumulator [NT, K, G, tile, D]
        pages = jax.lax.dynamic_slice_in_dim(tables, i * chunk, chunk, axis=1)
        k = kt_pages[pages].astype(jnp.float32)  # [NT, C, K, D, S]
        v = v_pages[pages].reshape(num_tiles, width, kv_heads, d).astype(jnp.float32)
        s = jnp.einsum("tqkgd,tckds->tkgqcs", qg, k).reshape(num_tiles, kv_heads, g, tile, width)
        if soft_cap is not None:
            s = soft_cap * jnp.tanh(s / soft_cap)
        key_pos = i * width + jnp.arange(width)
        mask = key_pos[None, None, :] <= pos_tiles[:, :, None]  # [NT, tile, W]; empty rows see nothing
        if sliding_window is not None:
            mask &= key_pos[None, None, :] > pos_tiles[:, :, None] - sliding_window
        v = _live_values(v, key_pos[None, :] <= last_pos[:, None])
        return _online_update(carry, s, mask[:, None, None], v, "tkgqw,twkd->tkgqd")

    init = (jnp.full((num_tiles, kv_heads, g, tile), _NEG_INF, jnp.float32),
            jnp.zeros((num_tiles, kv_heads, g, tile), jnp.float32),
            jnp.zeros((num_tiles, kv_heads, g, tile, d), jnp.float32))
    _, run_sum, acc = jax.lax.fori_loop(0, num_steps, step, init)
    o = acc / jnp.maximum(run_sum, 1e-30)[..., None]  # [NT, K, G, tile, D]
    o = o.transpose(0, 3, 1, 2, 4).reshape(num_tiles, tile, h, d)
    out = o.at[tile_id, slot].get(mode="fill", fill_value=0)
    return out.astype(q.dtype)


def _attend_whole_table(qg, kt_pages, v_pages, block_tables, query_pos, context_lens, soft_cap, sliding_window):
    """Attention of scaled queries ``qg [B, Q, K, G, D]`` at ``query_pos i32[B, Q]`` over every page of
    each sequence's table at once -> [B, K, G, Q, D] (zeros for a query that sees no key).

    Keys at or past ``context_lens`` are masked, and their V rows zeroed, so whatever the table's
    unused entries point at (stale or even non-finite pages) cannot leak in.
    """
    b, q_len, kv_heads, g, d = qg.shape
    width = block_tables.shape[1] * kt_pages.shape[3]
    k = kt_pages[block_tables].astype(jnp.float32)  # [B, M, K, D, S]
    s = jnp.einsum("bqkgd,bmkds->bkgqms", qg, k).reshape(b, kv_heads, g, q_len, width)
    if soft_cap is not None:
        s = soft_cap * jnp.tanh(s / soft_cap)
    key_pos = jnp.arange(width)
    live = key_pos[None, :] < context_lens[:, None]  # [B, W]
    mask = (key_pos[None, None, :] <= query_pos[:, :, None]) & live[:, None, :]  # [B, Q, W]
    if sliding_window is not None:
        mask &= key_pos[None, None, :] > query_pos[:, :, None] - sliding_window
    mask = mask[:, None, None]  # [B, 1, 1, Q, W]
    s = jnp.where(mask, s, _NEG_INF)
    p = jnp.where(mask, jnp.exp(s - jnp.max(s, axis=-1, keepdims=True)), 0.0)
    v = _live_values(v_pages[block_tables].reshape(b, width, kv_heads, d).astype(jnp.float32), live)
    o = jnp.einsum("bkgqw,bwkd->bkgqd", p, v)
    return o / jnp.maximum(jnp.sum(p, axis=-1), 1e-30)[..., None]


def _online_update(carry, s, mask, v, pv_einsum):
    """One loop step of the online softmax for the multi-query bodies: scores ``s [..., Q, L]``
    (``mask`` broadcastable to it) folded into (running max, running sum, accumulator)."""
    run_max, run_sum, acc = carry
    s = jnp.where(mask, s, _NEG_INF)
    new_max = jnp.maximum(run_max, jnp.max(s, axis=-1))
    scale = jnp.exp(run_max - new_max)
    p = jnp.where(mask, jnp.exp(s - new_max[..., None]), 0.0)
    run_sum = run_sum * scale + jnp.sum(p, axis=-1)
    acc = acc * scale[..., None] + jnp.einsum(pv_einsum, p, v)
    return new_max, run_sum, acc


def _live_values(v, live):
    """V rows ``v [*live.shape, K, D]`` with those of unwritten keys (``live`` False) set to exactly zero.

    A masked key's probability is 0, but 0 * NaN = NaN: what a page holds past a sequence's end (a
    freed block's stale values, a padded table entry's page) must be selected away, not multiplied."""
    return jnp.where(live[..., None, None], v, 0.0)
