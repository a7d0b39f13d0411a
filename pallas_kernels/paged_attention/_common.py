"""Pieces shared by the decode and ragged paged-attention kernels.

Axis names as in ``reference.py``: R rows of a query tile (tokens x query heads of one kv head),
L keys of one compute block, D head dim.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from pallas_kernels import _compat

# Finite, so that `m_prev - m_new` never becomes `-inf - -inf`; fully masked rows keep l == 0.
MASK_VALUE = -1e30


def resolve_interpret(interpret):
    """None means: compile on GPU, interpret everywhere else (CPU tests)."""
    if interpret is None:
        return jax.default_backend() != "gpu"
    return bool(interpret)


def compiler_params(interpret, num_warps=4, num_stages=2):
    """Pin the Triton lowering when compiling: on jax 0.10.2 a plain pallas_call defaults to Mosaic
    GPU (0.11+ default to Triton). Triton stays these kernels' GPU path because they are portable
    ``pl.pallas_call`` grids over gathered pages (Mosaic GPU needs ``plgpu.kernel`` with TMA copies
    and 64-row WGMMA tiles: see mosaic.py for the decode kernel written that way)."""
    if interpret:
        return None
    return _compat.triton_params(num_warps=num_warps, num_stages=num_stages)


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def pages_per_block(requested, page_size, max_pages, interpret, target_keys=128):
    """Pages per compute block: default ``target_keys`` keys, never more pages than a table row
    (rounded up to a power of two, which compiled Triton tiles need)."""
    ppb = requested or max(1, target_keys // page_size)
    ppb = max(1, min(ppb, next_power_of_2(max_pages)))
    if not interpret and ppb & (ppb - 1):
        raise ValueError(f"pages_per_compute_block must be a power of two when compiled, got {ppb}")
    return ppb


def _precision(dtype):
    # f32 inputs: full IEEE products (Triton would otherwise use TF32); bf16/f16 use the MMA as is.
    return lax.Precision.HIGHEST if dtype == jnp.float32 else None


def init_carry(rows: int, head_dim: int):
    """(m, l, acc): running max, running sum and unnormalised output, all float32."""
    return (jnp.full((rows,), MASK_VALUE, jnp.float32),
            jnp.zeros((rows,), jnp.float32),
            jnp.zeros((rows, head_dim), jnp.float32))


def online_softmax_step(carry, q, k, v, mask, live, *, sm_scale, soft_cap):
    """One flash step: q [R, D], k/v [L, D], mask bool[R, L] -> updated (m, l, acc).

    ``live`` bool[L, 1] marks the keys that hold written K/V (any key a row may see is live). Scores
    and values of the others are selected away, never multiplied by a zero probability: a page past
    a sequence's end may hold anything, NaN included (0 * NaN = NaN)."""
    m_prev, l_prev, acc_prev = carry
    v = jnp.where(live, v, jnp.zeros_like(v))
    s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=_precision(q.dtype),
                        preferred_element_type=jnp.float32) * sm_scale
    if soft_cap is not None:
        s = soft_cap * jnp.tanh(s / soft_cap)
    s = jnp.where(mask, s, MASK_VALUE)
    m_new = jnp.maximum(m_prev, jnp.max(s, axis=1))
    p = jnp.where(mask, jnp.exp(s - m_new[:, None]), 0.0)
    alpha = jnp.exp(m_prev - m_new)
    l_new = alpha * l_prev + jnp.sum(p, axis=1)
    pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                         precision=_precision(v.dtype), preferred_element_type=jnp.float32)
    return m_new, l_new, alpha[:, None] * acc_prev + pv


def finish(carry):
    """(m, l, acc) -> normalised output [R, D] f32 and log-sum-exp [R] (MASK_VALUE where empty)."""
    m, l, acc = carry
    out = acc / jnp.maximum(l, 1e-30)[:, None]
    lse = jnp.where(l > 0, m + jnp.log(jnp.maximum(l, 1e-30)), MASK_VALUE)
    return out, lse


def load_pages(pages_ref, page_ids, head_dim):
    """Gather whole pages through the block table inside the kernel: [n] ids -> [n*S, D]."""
    block = pages_ref[page_ids]  # [n, S, D]
    return block.reshape(-1, head_dim)
