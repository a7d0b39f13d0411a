"""Ragged multi-query paged attention as a Pallas kernel: several new tokens per sequence packed
in one batch (chunked prefill, mixed prefill + decode, speculative verification with γ+1 tokens),
causal within the new tokens, attending to the cached prefix through the block table.

Axis names: T packed query tokens, B sequences, H query heads, K kv heads, G = H // K, D head dim,
P pages, S page size, M pages per sequence, Q tokens per query tile, W tiles.

Each sequence's new tokens are cut into tiles of Q tokens (a sequence boundary always starts a new
tile), so there are at most W = (T + B*(Q-1)) // Q tiles. Grid: (W, K). Program (w, h) attends the
Q x G query rows of tile w for kv head h to the keys up to the tile's last query position, a compute
block of pages at a time, online softmax in float32. Each tile writes its own output slot, so no
two programs write the same memory; an XLA gather puts rows back in packed order.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.paged_attention import _common as common
from pallas_kernels.paged_attention import _validate

_TARGET_BLOCK_K = 128


def _ragged_kernel(seq_ref, start_ref, pos_ref, nq_ref, ctx_ref, tables_ref, q_ref, k_ref, v_ref,
                   o_ref, *, sm_scale, soft_cap, sliding_window, pages_per_block):
    """Per tile (block (1,) each): seq_ref sequence, start_ref first packed row, pos_ref position of
    the first query, nq_ref number of real queries, ctx_ref context length. tables_ref i32[B, M'];
    q_ref [T', G', D] (this kv head); k_ref/v_ref [P, S, D]; o_ref [Q, G', D]."""
    tile_q, group, head_dim = o_ref.shape
    rows = tile_q * group
    block_k = pages_per_block * k_ref.shape[1]
    seq, pos0, ctx = seq_ref[0], pos_ref[0], ctx_ref[0]
    hi = jnp.minimum(ctx, pos0 + nq_ref[0])  # keys past the tile's last query are never needed
    lo = 0 if sliding_window is None else jnp.maximum(pos0 - sliding_window + 1, 0)
    first, last = lo // block_k, pl.cdiv(hi, block_k)
    q = q_ref[pl.ds(start_ref[0], tile_q)].reshape(rows, head_dim)
    q_pos = pos0 + lax.broadcasted_iota(jnp.int32, (rows, block_k), 0) // group

    def body(i, carry):
        pages = tables_ref[seq, pl.ds(i * pages_per_block, pages_per_block)]
        k = common.load_pages(k_ref, pages, head_dim)
        v = common.load_pages(v_ref, pages, head_dim)
        key_pos = i * block_k + lax.broadcasted_iota(jnp.int32, (rows, block_k), 1)
        mask = (key_pos <= q_pos) & (key_pos < ctx)
        if sliding_window is not None:
            mask &= key_pos > q_pos - sliding_window
        live = i * block_k + lax.broadcasted_iota(jnp.int32, (block_k, 1), 0) < hi
        return common.online_softmax_step(carry, q, k, v, mask, live, sm_scale=sm_scale, soft_cap=soft_cap)

    carry = lax.fori_loop(first, jnp.maximum(first, last), body, common.init_carry(rows, head_dim))
    out, _ = common.finish(carry)
    o_ref[...] = out.reshape(tile_q, group, head_dim).astype(o_ref.dtype)


def _tiles(context_lens, cu_q_lens, num_tiles, tile_q):
    """Per-tile metadata, i32[W] each: sequence, first packed row, first query position, number
    of real queries, context length; plus cu_tiles i32[B+1]. Tiles past the last are empty."""
    num_seqs = context_lens.shape[0]
    q_lens = cu_q_lens[1:] - cu_q_lens[:-1]
    cu_tiles = jnp.concatenate([jnp.zeros((1,), jnp.int32),
                                jnp.cumsum(pl.cdiv(q_lens, tile_q)).astype(jnp.int32)])
    w = jnp.arange(num_tiles, dtype=jnp.int32)
    seq = jnp.clip(jnp.searchsorted(cu_tiles, w, side="right") - 1, 0, num_seqs - 1).astype(jnp.int32)
    offset = (w - cu_tiles[seq]) * tile_q
    real = w < cu_tiles[num_seqs]
    start = jnp.where(real, cu_q_lens[seq] + offset, 0)
    pos0 = context_lens[seq] - q_lens[seq] + offset
    nq = jnp.where(real, jnp.minimum(tile_q, q_lens[seq] - offset), 0)
    ctx = jnp.where(real, context_lens[seq], 0)
    return (seq, start, pos0, nq, ctx), cu_tiles


def _unpack(out, cu_q_lens, cu_tiles, tile_q, num_tokens):
    """[W, Q, K, G', D] tile outputs -> [T, K, G', D] in packed order; padding rows are zeros."""
    num_seqs = cu_tiles.shape[0] - 1
    rows = jnp.arange(num_tokens, dtype=jnp.int32)
    seq = jnp.clip(jnp.searchsorted(cu_q_lens, rows, side="right") - 1, 0, num_seqs - 1)
    local = rows - cu_q_lens[seq]
    gathered = out[cu_tiles[seq] + local // tile_q, local % tile_q]
    valid = rows < cu_q_lens[num_seqs]
    return jnp.where(valid[:, None, None, None], gathered, 0)


@functools.partial(jax.jit, static_argnames=(
    "sm_scale", "soft_cap", "sliding_window", "tile_q", "pages_per_compute_block", "interpret"))
def _ragged_paged_attention(q, k_pages, v_pages, block_tables, context_lens, cu_q_lens, *,
                            sm_scale, soft_cap, sliding_window, tile_q, pages_per_compute_block,
                            interpret):
    num_tokens, num_heads, head_dim = q.shape
    num_pages, page_size, kv_heads, _ = k_pages.shape
    num_seqs, max_pages = block_tables.shape
    group = num_heads // kv_heads
    ppb = common.pages_per_block(pages_per_compute_block, page_size, max_pages, interpret,
                                 _TARGET_BLOCK_K)
    num_tiles = max(1, (num_tokens + num_seqs * (tile_q - 1)) // tile_q)

    # Triton wants power-of-two tiles and dots with at least 16 rows: pad the head group there.
    # Pad tokens so that every tile's Q-row window is in bounds, and the table so that every
    # compute block is.
    rows = group if interpret else max(common.next_power_of_2(group), pl.cdiv(16, tile_q))
    q4 = q.reshape(num_tokens, kv_heads, group, head_dim)
    q4 = jnp.pad(q4, ((0, tile_q), (0, 0), (0, rows - group), (0, 0)))
    tables = jnp.clip(block_tables, 0, num_pages - 1)
    tables = jnp.pad(tables, ((0, 0), (0, (-max_pages) % ppb)))
    meta, cu_tiles = _tiles(context_lens, cu_q_lens, num_tiles, tile_q)

    kernel = functools.partial(_ragged_kernel, sm_scale=sm_scale, soft_cap=soft_cap,
                               sliding_window=sliding_window, pages_per_block=ppb)
    scalar_spec = pl.BlockSpec((1,), lambda w, h: (w,))
    pool_spec = pl.BlockSpec((num_pages, page_size, None, head_dim), lambda w, h: (0, 0, h, 0))
    out = pl.pallas_call(
        kernel,
        grid=(num_tiles, kv_heads),
        in_specs=[scalar_spec] * 5 + [
            pl.BlockSpec(tables.shape, lambda w, h: (0, 0)),
            pl.BlockSpec((q4.shape[0], None, rows, head_dim), lambda w, h: (0, h, 0, 0)),
            pool_spec,
            pool_spec,
        ],
        out_specs=pl.BlockSpec((None, tile_q, None, rows, head_dim), lambda w, h: (w, 0, h, 0, 0)),
        out_shape=jax.ShapeDtypeStruct((num_tiles, tile_q, kv_heads, rows, head_dim), q.dtype),
        interpret=interpret,
        compiler_params=common.compiler_params(interpret, num_warps=4, num_stages=2),
        name="paged_attention_ragged",
    )(*meta, tables, q4, k_pages, v_pages)
    out = _unpack(out, cu_q_lens, cu_tiles, tile_q, num_tokens)[:, :, :group]
    return out.reshape(num_tokens, num_heads, head_dim)


def ragged_paged_attention(q, k_pages, v_pages, block_tables, context_lens, cu_q_lens, *,
                           sm_scale=None, soft_cap=None, sliding_window=None, tile_q=16,
                           pages_per_compute_block=None, interpret=None):
    """Causal multi-query attention over a paged KV cache for a packed batch of new tokens.

    q: [T, H, D] packed, sequence b owning rows ``cu_q_lens[b]:cu_q_lens[b+1]``; k_pages, v_pages:
    [P, S, K, D] (H a multiple of K, one float dtype) already holding the new tokens' K/V;
    block_tables: i32[B, M]; context_lens: i32[B], each sequence's length after this step;
    cu_q_lens: i32[B+1], starting at 0. The i-th new token of sequence b sits at position
    ``context_lens[b] - q_len_b + i``. Rows at or past ``cu_q_lens[B]`` are padding (zeros).
    Returns [T, H, D] in q's dtype.

    tile_q: query tokens per program (a power of two on GPU; 16/8 suit prefill/verification).
    pages_per_compute_block: pages per key block (default: 128 keys). interpret: None compiles on
    GPU and interprets elsewhere.
    """
    _validate.check_ragged(q, k_pages, v_pages, block_tables, context_lens, cu_q_lens)
    _validate.check_options(sm_scale, soft_cap, sliding_window)
    if int(tile_q) < 1:
        raise ValueError(f"tile_q must be positive, got {tile_q}")
    return _ragged_paged_attention(
        q, k_pages, v_pages, block_tables, context_lens, cu_q_lens,
        sm_scale=float(q.shape[-1] ** -0.5 if sm_scale is None else sm_scale),
        soft_cap=None if soft_cap is None else float(soft_cap),
        sliding_window=None if sliding_window is None else int(sliding_window),
        tile_q=int(tile_q), pages_per_compute_block=pages_per_compute_block,
        interpret=common.resolve_interpret(interpret))
