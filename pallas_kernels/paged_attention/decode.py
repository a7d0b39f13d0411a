"""Decode paged attention as a Pallas kernel: one query token per sequence, K/V read through the
block table inside the kernel, split-k (flash-decoding) over the key axis.

Axis names: B sequences, H query heads, K kv heads, G = H // K query heads per kv head,
D head dim, P pages in the pool, S page size, M pages per sequence in a block table,
N splits of the key axis.

Grid: (B, K, N). Program (b, h, n) attends the G query heads of kv head h of sequence b to the
keys of split n, a compute block (``pages_per_compute_block`` pages) at a time, with an online
softmax in float32. Each split writes its normalised output and log-sum-exp; a small XLA epilogue
merges the splits.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.paged_attention import _common as common
from pallas_kernels.paged_attention import _validate

# On GPU, aim for at least this many programs so that small batches still fill the SMs (H200: 132).
_TARGET_PROGRAMS = 264
_TARGET_BLOCK_K = 128


def _decode_kernel(lengths_ref, tables_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *,
                   sm_scale, soft_cap, sliding_window, pages_per_block, blocks_per_split):
    """lengths_ref i32[1]; tables_ref i32[pages_per_split]; q_ref [G', D];
    k_ref/v_ref [P, S, D] (this kv head's slice of the pool); o_ref f32[G', D]; lse_ref f32[G']."""
    rows, head_dim = q_ref.shape
    page_size = k_ref.shape[1]
    block_k = pages_per_block * page_size
    length = lengths_ref[0]
    split_start = pl.program_id(2) * blocks_per_split * block_k
    lo = 0 if sliding_window is None else jnp.maximum(length - sliding_window, 0)
    first = jnp.maximum(lo - split_start, 0) // block_k
    last = jnp.clip(pl.cdiv(length - split_start, block_k), 0, blocks_per_split)
    q = q_ref[...]

    def body(i, carry):
        pages = tables_ref[pl.ds(i * pages_per_block, pages_per_block)]
        k = common.load_pages(k_ref, pages, head_dim)
        v = common.load_pages(v_ref, pages, head_dim)
        key_pos = split_start + i * block_k + lax.broadcasted_iota(jnp.int32, (rows, block_k), 1)
        mask = (key_pos < length) & (key_pos >= lo)
        live = split_start + i * block_k + lax.broadcasted_iota(jnp.int32, (block_k, 1), 0) < length
        return common.online_softmax_step(carry, q, k, v, mask, live, sm_scale=sm_scale, soft_cap=soft_cap)

    carry = lax.fori_loop(first, jnp.maximum(first, last), body,
                          common.init_carry(rows, head_dim))
    out, lse = common.finish(carry)
    o_ref[...] = out
    lse_ref[...] = lse


def _split_plan(num_seqs, kv_heads, max_pages, page_size, pages_per_compute_block, num_splits,
                interpret):
    """Static tiling of the key axis: (pages_per_block, blocks_per_split, num_splits)."""
    ppb = common.pages_per_block(pages_per_compute_block, page_size, max_pages, interpret,
                                 _TARGET_BLOCK_K)
    num_blocks = pl.cdiv(max_pages, ppb)
    if num_splits is None:
        num_splits = pl.cdiv(_TARGET_PROGRAMS, num_seqs * kv_heads)
    num_splits = max(1, min(num_splits, num_blocks))
    blocks_per_split = pl.cdiv(num_blocks, num_splits)
    return ppb, blocks_per_split, pl.cdiv(num_blocks, blocks_per_split)


def _merge_splits(out, lse):
    """out f32[B, K, N, G', D], lse f32[B, K, N, G'] -> f32[B, K, G', D] (log-sum-exp weights)."""
    w = jnp.exp(lse - jnp.max(lse, axis=2, keepdims=True))
    return jnp.sum(w[..., None] * out, axis=2) / jnp.sum(w, axis=2)[..., None]


@functools.partial(jax.jit, static_argnames=(
    "sm_scale", "soft_cap", "sliding_window", "pages_per_compute_block", "num_splits", "interpret"))
def _paged_attention(q, k_pages, v_pages, block_tables, lengths, *, sm_scale, soft_cap,
                     sliding_window, pages_per_compute_block, num_splits, interpret):
    num_seqs, num_heads, head_dim = q.shape
    num_pages, page_size, kv_heads, _ = k_pages.shape
    group = num_heads // kv_heads
    ppb, blocks_per_split, num_splits = _split_plan(
        num_seqs, kv_heads, block_tables.shape[1], page_size, pages_per_compute_block, num_splits,
        interpret)
    pages_per_split = blocks_per_split * ppb

    # Triton wants power-of-two tiles and dots with at least 16 rows: pad the head group there.
    rows = group if interpret else max(16, common.next_power_of_2(group))
    q4 = q.reshape(num_seqs, kv_heads, group, head_dim)
    if rows != group:
        q4 = jnp.pad(q4, ((0, 0), (0, 0), (0, rows - group), (0, 0)))
    # Entries past a sequence's last page are never attended but may be loaded with their compute
    # block: clip them into the pool. Padding to N*pages_per_split keeps every load in bounds.
    tables = jnp.clip(block_tables, 0, num_pages - 1)
    tables = jnp.pad(tables, ((0, 0), (0, num_splits * pages_per_split - tables.shape[1])))
    tables = tables.reshape(num_seqs, num_splits, pages_per_split)

    kernel = functools.partial(
        _decode_kernel, sm_scale=sm_scale, soft_cap=soft_cap, sliding_window=sliding_window,
        pages_per_block=ppb, blocks_per_split=blocks_per_split)
    pool_spec = pl.BlockSpec((num_pages, page_size, None, head_dim), lambda b, h, n: (0, 0, h, 0))
    out, lse = pl.pallas_call(
        kernel,
        grid=(num_seqs, kv_heads, num_splits),
        in_specs=[
            pl.BlockSpec((1,), lambda b, h, n: (b,)),
            pl.BlockSpec((None, None, pages_per_split), lambda b, h, n: (b, n, 0)),
            pl.BlockSpec((None, None, rows, head_dim), lambda b, h, n: (b, h, 0, 0)),
            pool_spec,
            pool_spec,
        ],
        out_specs=[
            pl.BlockSpec((None, None, None, rows, head_dim), lambda b, h, n: (b, h, n, 0, 0)),
            pl.BlockSpec((None, None, None, rows), lambda b, h, n: (b, h, n, 0)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((num_seqs, kv_heads, num_splits, rows, head_dim), jnp.float32),
            jax.ShapeDtypeStruct((num_seqs, kv_heads, num_splits, rows), jnp.float32),
        ],
        interpret=interpret,
        compiler_params=common.compiler_params(interpret, num_warps=4, num_stages=2),
        name="paged_attention_decode",
    )(lengths, tables, q4, k_pages, v_pages)
    out = _merge_splits(out, lse)[:, :, :group]
    return out.reshape(num_seqs, num_heads, head_dim).astype(q.dtype)


def paged_attention(q, k_pages, v_pages, block_tables, lengths, *, sm_scale=None, soft_cap=None,
                    sliding_window=None, pages_per_compute_block=None, num_splits=None,
                    interpret=None):
    """Decode attention over a paged KV cache (one query token per sequence).

    q: [B, H, D]; k_pages, v_pages: [P, S, K, D] with H a multiple of K, all one float dtype;
    block_tables: i32[B, M] (entries past a sequence's last page are ignored); lengths: i32[B],
    cached tokens including the query's own (0 gives zeros). Returns [B, H, D] in q's dtype.

    soft_cap: logits become ``soft_cap * tanh(logits / soft_cap)``. sliding_window: attend to the
    last ``sliding_window`` positions only. pages_per_compute_block, num_splits: tiling of the key
    axis (defaults aim at 128 keys per block and enough programs to fill a GPU).
    interpret: None runs the kernel compiled on GPU and interpreted elsewhere.
    """
    _validate.check_decode(q, k_pages, v_pages, block_tables, lengths)
    _validate.check_options(sm_scale, soft_cap, sliding_window)
    return _paged_attention(
        q, k_pages, v_pages, block_tables, lengths,
        sm_scale=float(q.shape[-1] ** -0.5 if sm_scale is None else sm_scale),
        soft_cap=None if soft_cap is None else float(soft_cap),
        sliding_window=None if sliding_window is None else int(sliding_window),
        pages_per_compute_block=pages_per_compute_block, num_splits=num_splits,
        interpret=common.resolve_interpret(interpret))
