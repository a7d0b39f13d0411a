"""EXPERIMENTAL, UNVERIFIED ON HARDWARE: a Mosaic GPU (Hopper) decode paged-attention kernel.

Checked in Mosaic GPU's CPU interpreter and by lowering for an abstract H200
(tests/paged_attention/test_mosaic_kernel.py); it has never been compiled or run on an H100/H200.
The portable kernel in ``decode.py`` is the default GPU path; this one is opt-in: the engine's
``attention_impl="mosaic"`` runs it for decode steps (prefill and mixed steps keep the portable
ragged kernel), and benchmarks/gpu_check.sh measures it when a session gets a GPU. On CPU it runs
in the interpreter (correctness only).

Axis names as in ``decode.py``. Grid (B, K): one CTA (one warpgroup) per sequence and kv head.
The G query heads of the kv head, padded to the 64 rows a WGMMA needs, stay in shared memory; K/V
pages are copied by TMA straight from the pool, page by page, into a double-buffered 64-key
block (``64 // S`` pages per block, so S must divide 64); QK^T and PV run on WGMMA with an online
softmax in float32 registers. No split-k yet: small batches will underfill the GPU.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels import _compat
from pallas_kernels.paged_attention import _validate

_ROWS = 64  # WGMMA M
_BLOCK_K = 64


def _kernel(q_ref, k_ref, v_ref, tables_ref, lengths_ref, o_ref, scoped, *, page_size, sm_scale,
            interpreted):
    from jax.experimental.pallas import mosaic_gpu as plgpu

    # Register layouts matter to the compiler only; the CPU interpreter has no rule for them.
    def cast(x, layout):
        return x if interpreted else plgpu.layout_cast(x, layout)

    def iota(shape, dim):
        if interpreted:
            return lax.broadcasted_iota(jnp.int32, shape, dim)
        return plgpu.broadcasted_iota(jnp.int32, shape, dim, layout=plgpu.Layout.WGMMA)
    (qo_smem, k_smem, v_smem, p_smem), (q_bar, k_bars, v_bars) = scoped
    b, h = lax.axis_index("b"), lax.axis_index("h")
    pages_per_block = _BLOCK_K // page_size
    length = lengths_ref[b]
    num_blocks = pl.cdiv(length, _BLOCK_K)

    def fetch(block, slot):
        for j in range(pages_per_block):
            page = tables_ref[b, block * pages_per_block + j]
            rows = pl.ds(j * page_size, page_size)
            plgpu.copy_gmem_to_smem(k_ref.at[page, :, h], k_smem.at[slot, rows], k_bars.at[slot])
            plgpu.copy_gmem_to_smem(v_ref.at[page, :, h], v_smem.at[slot, rows], v_bars.at[slot])

    plgpu.copy_gmem_to_smem(q_ref.at[b, h], qo_smem, q_bar.at[0])
    plgpu.barrier_wait(q_bar.at[0])
    pl.when(num_blocks > 0)(lambda: fetch(0, 0))

    head_dim = qo_smem.shape[-1]
    m_i = cast(jnp.full((_ROWS,), -jnp.inf, jnp.float32), plgpu.Layout.WGMMA.reduce(1))
    l_i = cast(jnp.full((_ROWS,), 0, jnp.float32), plgpu.Layout.WGMMA.reduce(1))
    acc = cast(jnp.full((_ROWS, head_dim), 0, jnp.float32), plgpu.Layout.WGMMA)
    log2e = math.log2(math.e)

    def body(i, carry):
        acc, m_i, l_i = carry
        slot = lax.rem(i, 2)
        pl.when(i + 1 < num_blocks)(lambda: fetch(i + 1, 1 - slot))
        plgpu.barrier_wait(k_bars.at[slot])

        def qk_scope(acc_ref):
            plgpu.wgmma(acc_ref, qo_smem, _compat.transpose_ref(k_smem.at[slot], (1, 0)))
            return acc_ref[...]
        if interpreted and not _compat.MOSAIC_INTERPRETS_TRANSPOSED_WGMMA:
            # jax 0.10.2's interpreter has no rule for a transposed WGMMA operand: a plain dot on
            # the same shared-memory tiles there (jax 0.12 interprets the WGMMA itself).
            s = lax.dot_general(qo_smem[...], k_smem[slot], (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32)
        else:
            s = pl.run_scoped(qk_scope, plgpu.ACC((_ROWS, _BLOCK_K), jnp.float32))
        s = s * (sm_scale * log2e)
        key = iota((_ROWS, _BLOCK_K), 1)
        s = jnp.where(key + i * _BLOCK_K < length, s, -jnp.inf)
        m_new = jnp.maximum(m_i, s.max(axis=1))
        alpha = jnp.exp2(m_i - m_new)
        p = jnp.exp2(s - lax.broadcast_in_dim(m_new, s.shape, [0]))
        l_new = l_i * alpha + p.sum(axis=1)
        acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
        plgpu.barrier_wait(v_bars.at[slot])
        # Rows past the sequence's end (stale slots of its last page, or a padded table entry's page)
        # may hold anything, NaN included, and 0 x NaN = NaN in the WGMMA: zero them in shared memory.
        valid = length - i * _BLOCK_K

        @pl.when(valid < _BLOCK_K)
        def _():
            v_tile = v_smem.at[slot]
            v = v_tile[...] if interpreted else _compat.mosaic_load(v_tile, plgpu.Layout.WGMMA)
            rows = iota((_BLOCK_K, head_dim), 0)
            v_tile[...] = jnp.where(rows < valid, v, jnp.zeros_like(v))
            plgpu.commit_smem()

        # P goes through shared memory rather than as WGMMA's register operand: Mosaic GPU's CPU
        # interpreter only takes shared-memory operands, and one route for both modes means the CPU
        # test runs the compiled kernel's copies, barriers and both WGMMAs (an 8 KiB store per block).
        p_smem[...] = p.astype(p_smem.dtype)
        plgpu.commit_smem()

        def pv_scope(acc_ref):
            plgpu.wgmma(acc_ref, p_smem, v_smem.at[slot])
            return acc_ref[...]
        pv = pl.run_scoped(pv_scope, plgpu.ACC((_ROWS, head_dim), jnp.float32))
        acc = acc + pv
        return acc, m_new, l_new

    acc, m_i, l_i = lax.fori_loop(0, num_blocks, body, (acc, m_i, l_i))
    l_safe = jnp.maximum(l_i, 1e-30)  # length 0: acc == 0 -> zeros
    qo_smem[...] = (acc / lax.broadcast_in_dim(l_safe, acc.shape, [0])).astype(qo_smem.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(qo_smem, o_ref.at[b, h])
    plgpu.wait_smem_to_gmem(0)


@functools.partial(jax.jit, static_argnames=("sm_scale", "interpret"))
def _paged_attention_mosaic(q, k_pages, v_pages, block_tables, lengths, *, sm_scale, interpret):
    from jax.experimental.pallas import mosaic_gpu as plgpu
    num_seqs, num_heads, head_dim = q.shape
    num_pages, page_size, kv_heads, _ = k_pages.shape
    group = num_heads // kv_heads
    ppb = _BLOCK_K // page_size
    q4 = q.reshape(num_seqs, kv_heads, group, head_dim)
    q4 = jnp.pad(q4, ((0, 0), (0, 0), (0, _ROWS - group), (0, 0)))
    tables = jnp.clip(block_tables, 0, num_pages - 1)
    tables = jnp.pad(tables, ((0, 0), (0, (-tables.shape[1]) % ppb)))

    def entry(q_ref, k_ref, v_ref, t_ref, l_ref, o_ref):
        transforms = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
        smem = (plgpu.SMEM((_ROWS, head_dim), q.dtype, transforms=transforms),
                plgpu.SMEM((2, _BLOCK_K, head_dim), q.dtype, transforms=transforms),
                plgpu.SMEM((2, _BLOCK_K, head_dim), q.dtype, transforms=transforms),
                plgpu.SMEM((_ROWS, _BLOCK_K), q.dtype, transforms=transforms))
        barriers = (plgpu.Barrier(num_barriers=1),
                    plgpu.Barrier(num_arrivals=ppb, num_barriers=2),
                    plgpu.Barrier(num_arrivals=ppb, num_barriers=2))
        pl.run_scoped(lambda *s: _kernel(q_ref, k_ref, v_ref, t_ref, l_ref, o_ref, s,
                                         page_size=page_size, sm_scale=sm_scale,
                                         interpreted=_compat.is_mosaic_interpret(interpret)),
                      smem, barriers)

    out = plgpu.kernel(
        entry,
        out_type=jax.ShapeDtypeStruct((num_seqs, kv_heads, _ROWS, head_dim), q.dtype),
        grid=(num_seqs, kv_heads),
        grid_names=("b", "h"),
        # Lane semantics (explicit register layouts, as this kernel writes them): the default
        # changed to Warpgroup in jax 0.12.
        compiler_params=_compat.mosaic_params(lowering_semantics=plgpu.LoweringSemantics.Lane),
        interpret=interpret,
    )(q4, k_pages, v_pages, tables, lengths)
    return out[:, :, :group].reshape(num_seqs, num_heads, head_dim)


def paged_attention_mosaic(q, k_pages, v_pages, block_tables, lengths, *, sm_scale=None,
                           interpret=None):
    """EXPERIMENTAL (never run on a GPU): decode paged attention on Hopper via Mosaic GPU.

    Same contract as ``paged_attention`` minus soft_cap/sliding_window/tiling options, and only
    bf16/f16, head dims that are multiples of 64, page sizes dividing 64, G = H // K <= 64.
    interpret: None compiles on GPU and runs Mosaic GPU's CPU interpreter elsewhere (slow: for
    correctness only); or pass ``plgpu.InterpretGPUParams(...)`` / False explicitly.
    """
    _validate.check_decode(q, k_pages, v_pages, block_tables, lengths)
    page_size, head_dim = k_pages.shape[1], k_pages.shape[3]
    group = q.shape[1] // k_pages.shape[2]
    if q.dtype not in (jnp.bfloat16, jnp.float16):
        raise ValueError(f"the Mosaic GPU kernel needs bf16/f16, got {q.dtype}")
    if head_dim % 64 or _BLOCK_K % page_size or page_size % 8 or group > _ROWS:
        raise ValueError(f"unsupported by the Mosaic GPU kernel: head_dim={head_dim} (multiple of "
                         f"64), page_size={page_size} (8..64 dividing 64), group={group} (<= 64)")
    sm_scale = float(head_dim ** -0.5 if sm_scale is None else sm_scale)
    if interpret is None and jax.default_backend() != "gpu":
        interpret = _compat.mosaic_interpret_params()
    elif interpret is False:
        interpret = None
    return _paged_attention_mosaic(q, k_pages, v_pages, block_tables, lengths,
                                   sm_scale=sm_scale, interpret=interpret)
