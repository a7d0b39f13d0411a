"""Input checks for the public paged-attention functions.

Shapes and dtypes are always checked. Values (lengths, table entries, cu_q_lens) are checked only
when the arrays are concrete, so the functions stay usable under ``jax.jit``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def _concrete(x):
    """NumPy copy of x, or None when x is a tracer (inside jit)."""
    try:
        return np.asarray(x)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


def _shapes(**arrays):
    return ", ".join(f"{k}{tuple(v.shape)}:{v.dtype}" for k, v in arrays.items())


def _check_int32(name, x, shape, ctx):
    if x.dtype != jnp.int32:
        raise ValueError(f"{name} must be int32, got {x.dtype} ({ctx})")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(x.shape)} ({ctx})")


def check_common(q, k_pages, v_pages, q_rank_name, ctx):
    """q [N, H, D] against the pool [P, S, K, D]; returns (P, S, K, D)."""
    if q.ndim != 3:
        raise ValueError(f"q must be {q_rank_name}, got shape {tuple(q.shape)} ({ctx})")
    if k_pages.ndim != 4 or k_pages.shape != v_pages.shape:
        raise ValueError(f"k_pages and v_pages must both be [P, S, K, D] with equal shapes ({ctx})")
    num_pages, page_size, kv_heads, head_dim = k_pages.shape
    if not jnp.issubdtype(q.dtype, jnp.floating):
        raise ValueError(f"q must be a floating dtype, got {q.dtype} ({ctx})")
    if k_pages.dtype != q.dtype or v_pages.dtype != q.dtype:
        raise ValueError(f"q, k_pages and v_pages must share one dtype ({ctx})")
    if q.shape[2] != head_dim:
        raise ValueError(f"head dim of q ({q.shape[2]}) != head dim of the pool ({head_dim}) ({ctx})")
    if kv_heads == 0 or q.shape[1] % kv_heads:
        raise ValueError(f"query heads ({q.shape[1]}) must be a multiple of kv heads ({kv_heads}) ({ctx})")
    return num_pages, page_size, kv_heads, head_dim


def check_options(sm_scale, soft_cap, sliding_window):
    if soft_cap is not None and not soft_cap > 0:
        raise ValueError(f"soft_cap must be positive, got {soft_cap}")
    if sliding_window is not None and (int(sliding_window) != sliding_window or sliding_window < 1):
        raise ValueError(f"sliding_window must be a positive integer, got {sliding_window}")
    if sm_scale is not None and not np.isfinite(sm_scale):
        raise ValueError(f"sm_scale must be finite, got {sm_scale}")


def check_lengths_and_table(lengths, block_tables, num_pages, page_size, name, ctx):
    """lengths within [0, M*S]; the entries a sequence uses (its first cdiv(len, S)) within [0, P)."""
    lens, table = _concrete(lengths), _concrete(block_tables)
    capacity = block_tables.shape[1] * page_size
    if lens is not None:
        bad = np.flatnonzero((lens < 0) | (lens > capacity))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"{name}[{i}] = {int(lens[i])} outside [0, {capacity}] "
                             f"(block table capacity M*S = {block_tables.shape[1]}*{page_size}) ({ctx})")
    if lens is not None and table is not None:
        used = np.arange(table.shape[1])[None, :] < -(-lens[:, None] // page_size)
        bad = np.argwhere(used & ((table < 0) | (table >= num_pages)))
        if bad.size:
            b, j = (int(x) for x in bad[0])
            raise ValueError(f"block_tables[{b}, {j}] = {int(table[b, j])} outside the pool "
                             f"[0, {num_pages}) ({ctx})")


def check_decode(q, k_pages, v_pages, block_tables, lengths):
    ctx = _shapes(q=q, k_pages=k_pages, v_pages=v_pages, block_tables=block_tables, lengths=lengths)
    num_pages, page_size, _, _ = check_common(q, k_pages, v_pages, "[B, H, D]", ctx)
    if block_tables.ndim != 2:
        raise ValueError(f"block_tables must be [B, M], got shape {tuple(block_tables.shape)} ({ctx})")
    _check_int32("block_tables", block_tables, (q.shape[0], block_tables.shape[1]), ctx)
    _check_int32("lengths", lengths, (q.shape[0],), ctx)
    check_lengths_and_table(lengths, block_tables, num_pages, page_size, "lengths", ctx)


def check_ragged(q, k_pages, v_pages, block_tables, context_lens, cu_q_lens):
    ctx = _shapes(q=q, k_pages=k_pages, v_pages=v_pages, block_tables=block_tables,
                  context_lens=context_lens, cu_q_lens=cu_q_lens)
    num_pages, page_size, _, _ = check_common(q, k_pages, v_pages, "[T, H, D]", ctx)
    if block_tables.ndim != 2:
        raise ValueError(f"block_tables must be [B, M], got shape {tuple(block_tables.shape)} ({ctx})")
    num_seqs = block_tables.shape[0]
    _check_int32("block_tables", block_tables, tuple(block_tables.shape), ctx)
    _check_int32("context_lens", context_lens, (num_seqs,), ctx)
    _check_int32("cu_q_lens", cu_q_lens, (num_seqs + 1,), ctx)
    check_lengths_and_table(context_lens, block_tables, num_pages, page_size, "context_lens", ctx)
    cu, lens = _concrete(cu_q_lens), _concrete(context_lens)
    if cu is None:
        return
    q_lens = np.diff(cu)
    if cu[0] != 0 or (q_lens < 0).any() or cu[-1] > q.shape[0]:
        raise ValueError(f"cu_q_lens must start at 0, never decrease and end at most at T={q.shape[0]}; "
                         f"got {cu.tolist()} ({ctx})")
    if lens is not None:
        bad = np.flatnonzero(lens < q_lens)
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"context_lens[{i}] = {int(lens[i])} is shorter than its "
                             f"{int(q_lens[i])} new tokens ({ctx})")
