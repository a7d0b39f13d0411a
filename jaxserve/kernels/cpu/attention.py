"""Paged attention on CPU as one XLA FFI custom call (``attention.cc``), with the contracts of
``pallas_kernels.paged_attention.online``.

Axis names: B sequences, T packed query tokens, H query heads, K kv heads, D head dim, P pages in the pool,
S page size, M pages per block table. The pools are float32, or bf16 held as its bits (``uint16``: a bf16 model's K/V
at half the bytes, the engine's pools where this kernel reads them), in the layout the online path reads: K with
tokens innermost, ``kt_pages [P, K, D, S]``, and ``v_pages [P, S, K, D]``. Each bf16 element is widened to float32
as it is read: the result is the one float32 pools holding the same values give. (bf16 arrays are taken too, and
bit-cast: XLA:CPU copies a whole array to do that, so the engine keeps its pools as ``uint16``.)

- ``paged_attention_cpu``: decode, one query token per sequence (``paged_attention_online``);
- ``uniform_paged_attention_cpu``: ``q_len`` tokens per sequence (``uniform_paged_attention_online``);
- ``ragged_paged_attention_cpu``: packed tokens, ``cu_q_lens`` (``ragged_paged_attention_online``).

All three are the same kernel over packed tokens: the i-th new token of sequence b sits at position
``context_lens[b] - q_len_b + i`` and sees the keys at positions <= its own (and, with ``sliding_window``, within
it) of that sequence; online softmax in float32, only the pages holding visible keys read. Queries of any float
dtype are read in float32 (float32 and bf16 ones by the kernel itself) and the output given in q's dtype.

``usable(k_pages, v_pages)`` says whether to route the engine's attention here at trace time: the matmul kernels'
conditions (``matmul.usable()``: CPU backend, one device, the library loaded, ``JAXSERVE_CPU_KERNELS`` on), pools of
a ``POOL_DTYPES`` dtype, and ``JAXSERVE_CPU_ATTENTION`` not 0/off/false/no (``available()``: all but the pools). A jitted function keeps the path it was traced with.
``JAXSERVE_CPU_KERNEL_THREADS`` caps the threads a call uses, as for the matmuls; the result does not depend on it.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.kernels.cpu import build, matmul

ENV_SWITCH = "JAXSERVE_CPU_ATTENTION"
TARGETS = {jnp.dtype(jnp.float32): "jaxserve_paged_attention", jnp.dtype(jnp.uint16): "jaxserve_paged_attention_bf16"}
WRITE_TARGETS = {jnp.dtype(jnp.float32): "jaxserve_paged_attention_write",
                 jnp.dtype(jnp.uint16): "jaxserve_paged_attention_write_bf16"}
ROWS_PER_ITEM = 8  # attention.cc's kRowsPerItem: the most new rows a sequence may own in the writing variant
POOL_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.uint16), jnp.dtype(jnp.bfloat16))  # uint16: bf16 bits


def available() -> bool:
    """Whether the engine's attention goes to the kernel now, pools aside (see the module docstring)."""
    return matmul.enabled(ENV_SWITCH) and matmul.usable()


def usable(k_pages: jax.Array, v_pages: jax.Array) -> bool:
    """Whether attention over these pools should go to the kernel now (see the module docstring)."""
    return k_pages.dtype == v_pages.dtype and k_pages.dtype in POOL_DTYPES and available()


def paged_attention_cpu(q, kt_pages, v_pages, block_tables, lengths, *, sm_scale=None, soft_cap=None,
                        sliding_window=None, threads=None):
    """Decode: q [B, H, D]; lengths i32[B] counts the cached tokens, the query's own included -> [B, H, D]."""
    b = block_tables.shape[0]
    return _attend(q, kt_pages, v_pages, block_tables, lengths, jnp.arange(b + 1, dtype=jnp.int32), sm_scale,
                   soft_cap, sliding_window, threads)


def uniform_paged_attention_cpu(q, kt_pages, v_pages, block_tables, context_lens, q_len, *, sm_scale=None,
                                soft_cap=None, sliding_window=None, threads=None):
    """``q_len`` new tokens per sequence: q [B*q_len, H, D], rows grouped by sequence -> [B*q_len, H, D]."""
    b = block_tables.shape[0]
    return _attend(q, kt_pages, v_pages, block_tables, context_lens, jnp.arange(b + 1, dtype=jnp.int32) * q_len,
                   sm_scale, soft_cap, sliding_window, threads)


def ragged_paged_attention_cpu(q, kt_pages, v_pages, block_tables, context_lens, cu_q_lens, *, sm_scale=None,
                               soft_cap=None, sliding_window=None, threads=None):
    """Packed tokens: q [T, H, D], sequence b owning rows ``cu_q_lens[b]:cu_q_lens[b+1]`` (i32[B+1]); rows at or
    past ``cu_q_lens[B]`` get zeros -> [T, H, D]."""
    return _attend(q, kt_pages, v_pages, block_tables, context_lens, cu_q_lens, sm_scale, soft_cap, sliding_window,
                   threads)


def _check(q, kt_pages, v_pages, block_tables, context_lens, cu_q_lens):
    if q.ndim != 3 or kt_pages.ndim != 4 or v_pages.ndim != 4:
        raise ValueError(f"paged_attention_cpu: q must be [T, H, D] and the pools 4-D, got q{q.shape}, "
                         f"kt_pages{kt_pages.shape}, v_pages{v_pages.shape}")
    p, k, d, s = kt_pages.shape
    if v_pages.shape != (p, s, k, d):
        raise ValueError(f"paged_attention_cpu: v_pages{v_pages.shape} does not match kt_pages{kt_pages.shape} "
                         f"(want [P, S, K, D] = {(p, s, k, d)})")
    if q.shape[2] != d or q.shape[1] % k:
        raise ValueError(f"paged_attention_cpu: q{q.shape} needs head dim {d} and a multiple of {k} heads")
    if kt_pages.dtype != v_pages.dtype or kt_pages.dtype not in POOL_DTYPES:
        raise ValueError(f"paged_attention_cpu: the pools must be both float32, both bfloat16 or both uint16 "
                         f"(bfloat16 bits), got {kt_pages.dtype}, {v_pages.dtype}")
    if not jnp.issubdtype(q.dtype, jnp.floating):
        raise ValueError(f"paged_attention_cpu: q must be floating point, got {q.dtype}")
    b = block_tables.shape[0]
    if block_tables.ndim != 2 or context_lens.shape != (b,) or cu_q_lens.shape != (b + 1,):
        raise ValueError(f"paged_attention_cpu: block_tables{block_tables.shape}, context_lens{context_lens.shape} "
                         f"and cu_q_lens{cu_q_lens.shape} must be [B, M], [B] and [B+1]")


def paged_attention_write_cpu(q, k_rows, v_rows, slot_mapping, kt_pages, v_pages, block_tables, context_lens,
                              cu_q_lens, *, sm_scale=None, soft_cap=None, sliding_window=None, threads=None):
    """``ragged_paged_attention_cpu`` after writing this step's rows k, v [T, K, D] into their flat slots ``i32[T]``
    (page * S + offset; negative or past the pool: not written) -> (o [T, H, D], kt_pages, v_pages). The rows must
    already be in the pools' dtype (float32, or uint16 bf16 bits: ``kv_pool.pool_rows``), and each sequence own at most
    ``ROWS_PER_ITEM`` rows (decode steps, verify rounds); the kernel refuses more at run time. The pools are aliased to
    the results: under ``jit`` with them donated, the rows go into the buffers in place, each written by the work
    item that then reads its page (XLA's scatter, a call apart, missed on every K line of pages written a step ago:
    SmolLM2 bf16 at batch 64, ~1.4 of a ~30 ms decode step). Same output and pools as ``KVLayer.write`` then the read."""
    k_rows, v_rows = jnp.asarray(k_rows), jnp.asarray(v_rows)
    t, p, k, d = q.shape[0], kt_pages.shape[0], kt_pages.shape[1], kt_pages.shape[2]
    if kt_pages.dtype not in WRITE_TARGETS or {k_rows.dtype, v_rows.dtype, v_pages.dtype} != {kt_pages.dtype}:
        raise ValueError(f"paged_attention_write_cpu: rows and pools must all be float32 or all uint16 (bf16 bits), "
                         f"got rows {k_rows.dtype}, {v_rows.dtype} and pools {kt_pages.dtype}, {v_pages.dtype}")
    if k_rows.shape != (t, k, d) or v_rows.shape != (t, k, d) or jnp.shape(slot_mapping) != (t,):
        raise ValueError(f"paged_attention_write_cpu: want k, v [{t}, {k}, {d}] and slots [{t}], got "
                         f"k{k_rows.shape}, v{v_rows.shape}, slots{jnp.shape(slot_mapping)}")
    return _attend(q, kt_pages, v_pages, block_tables, context_lens, cu_q_lens, sm_scale, soft_cap, sliding_window,
                   threads, fresh=(k_rows, v_rows, jnp.asarray(slot_mapping).astype(jnp.int32)))


def _attend(q, kt_pages, v_pages, block_tables, context_lens, cu_q_lens, sm_scale, soft_cap, sliding_window,
            threads, fresh=None):
    q, kt_pages, v_pages = jnp.asarray(q), jnp.asarray(kt_pages), jnp.asarray(v_pages)
    block_tables, context_lens, cu_q_lens = (jnp.asarray(a).astype(jnp.int32)
                                             for a in (block_tables, context_lens, cu_q_lens))
    _check(q, kt_pages, v_pages, block_tables, context_lens, cu_q_lens)
    if soft_cap is not None and soft_cap <= 0:
        raise ValueError(f"paged_attention_cpu: soft_cap must be positive, got {soft_cap}")
    if sliding_window is not None and sliding_window <= 0:
        raise ValueError(f"paged_attention_cpu: sliding_window must be positive, got {sliding_window}")
    if build.load() is None:
        raise RuntimeError("paged_attention_cpu: the CPU kernels are unavailable (see the logged warning)")
    sm_scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    if kt_pages.dtype == jnp.bfloat16:  # (a copy of each pool under XLA:CPU: the engine hands over uint16 pools)
        kt_pages, v_pages = (jax.lax.bitcast_convert_type(x, jnp.uint16) for x in (kt_pages, v_pages))
    # float32 and bf16 queries go in as they are and the output comes out in their dtype (a bf16 model's attention
    # then has no converts around it: the kernel widens q exactly and rounds o to nearest even, XLA's own converts)
    io = q.dtype if q.dtype in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)) else jnp.dtype(jnp.float32)
    attrs = dict(sm_scale=np.float32(sm_scale), soft_cap=np.float32(soft_cap or 0.0),
                 sliding_window=int(sliding_window or 0), threads=threads or matmul.default_threads())
    o = jax.ShapeDtypeStruct(q.shape, io)
    if fresh is None:
        call = jax.ffi.ffi_call(TARGETS[kt_pages.dtype], o, vmap_method="sequential")
        return call(q.astype(io), kt_pages, v_pages, block_tables, context_lens, cu_q_lens, **attrs).astype(q.dtype)
    pools = (jax.ShapeDtypeStruct(kt_pages.shape, kt_pages.dtype), jax.ShapeDtypeStruct(v_pages.shape, v_pages.dtype))
    call = jax.ffi.ffi_call(WRITE_TARGETS[kt_pages.dtype], (o, *pools), input_output_aliases={4: 1, 5: 2})
    out, kt_pages, v_pages = call(q.astype(io), *fresh, kt_pages, v_pages, block_tables, context_lens, cu_q_lens,
                                  **attrs)
    return out.astype(q.dtype), kt_pages, v_pages
