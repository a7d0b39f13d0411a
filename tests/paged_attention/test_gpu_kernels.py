"""Compiled (non-interpret) kernels.

On any machine: every Pallas kernel lowers for CUDA (an abstract H200 stands in for the GPU, see
``pallas_kernels._compat.abstract_gpu``) through the backend its explicit compiler params choose:
Triton for the portable paged decode, ragged and FP4 grid kernels; Mosaic GPU for mosaic.py's
decode kernel (tests/paged_attention/test_mosaic_kernel.py). On a GPU (``-m gpu``, run by
benchmarks/gpu_check.sh): key cases compiled for real against the reference.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import _compat
from pallas_kernels.fp4 import matmul as fp4_matmul_module
from pallas_kernels.fp4 import quantize
from pallas_kernels.paged_attention import (
    paged_attention,
    paged_attention_reference,
    ragged_paged_attention,
    ragged_paged_attention_reference,
)
from pallas_kernels.paged_attention import decode, ragged

LOWERING_CASES = [  # dtype, heads, kv_heads, head_dim, page_size
    (jnp.float32, 4, 4, 64, 8),
    (jnp.bfloat16, 32, 8, 128, 16),
    (jnp.bfloat16, 8, 1, 256, 32),
    (jnp.float32, 8, 2, 128, 128),
]
TRITON_CALL = "__gpu$xla.gpu.triton"  # the custom call a Triton-lowered pallas_call becomes


def lower_for_cuda(fn, *args):
    """StableHLO text of jit(fn) lowered for CUDA, without a GPU."""
    with _compat.abstract_gpu():
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("dtype,heads,kv_heads,head_dim,page_size", LOWERING_CASES,
                         ids=["mha-s8", "gqa4-s16-bf16", "mqa8-d256-bf16", "gqa4-s128"])
def test_kernels_lower_for_cuda(dtype, heads, kv_heads, head_dim, page_size):
    num_seqs, tokens, max_pages, num_pages = 3, 20, 6, 20
    spec = jax.ShapeDtypeStruct
    pool = spec((num_pages, page_size, kv_heads, head_dim), dtype)
    tables, lens = spec((num_seqs, max_pages), jnp.int32), spec((num_seqs,), jnp.int32)
    opts = dict(sm_scale=0.1, soft_cap=30.0, sliding_window=40, interpret=False)

    text = lower_for_cuda(lambda *a: decode._paged_attention(
        *a, pages_per_compute_block=None, num_splits=None, **opts),
        spec((num_seqs, heads, head_dim), dtype), pool, pool, tables, lens)
    assert "paged_attention_decode" in text and TRITON_CALL in text

    text = lower_for_cuda(lambda *a: ragged._ragged_paged_attention(
        *a, tile_q=8, pages_per_compute_block=None, **opts),
        spec((tokens, heads, head_dim), dtype), pool, pool, tables, lens,
        spec((num_seqs + 1,), jnp.int32))
    assert "paged_attention_ragged" in text and TRITON_CALL in text


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("m,dtype,precision,w4a4", [
    (1, jnp.bfloat16, "bfloat16", False), (48, jnp.float32, "float32", False),
    (200, jnp.bfloat16, "bfloat16", True)])
def test_fp4_matmul_lowers_for_cuda(fmt, m, dtype, precision, w4a4):
    k, n = 512, 384
    w = quantize(jnp.asarray(np.random.default_rng(0).normal(size=(k, n)), jnp.float32), fmt, axis=0)
    blocks = fp4_matmul_module.pick_block_sizes(m, n, k)
    text = lower_for_cuda(lambda x, w: fp4_matmul_module._fp4_matmul_call(
        x, w, block_sizes=blocks, interpret=False, w4a4=w4a4, precision=precision, out_dtype=dtype),
        jax.ShapeDtypeStruct((m, k), dtype), w)
    assert f"fp4_matmul_{fmt}" in text and TRITON_CALL in text


TOL = {jnp.float32: 1e-5, jnp.bfloat16: 2e-2}


def _check(out, ref, dtype):
    err = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref.astype(jnp.float32))))
    assert err <= TOL[dtype], f"max abs err {err}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,heads,kv_heads,head_dim,page_size,opts", [
    (jnp.float32, 4, 4, 64, 8, {}),
    (jnp.bfloat16, 32, 8, 128, 16, {}),
    (jnp.bfloat16, 8, 1, 256, 32, {}),
    (jnp.float32, 8, 2, 128, 128, dict(num_splits=3)),
    (jnp.bfloat16, 16, 2, 128, 16, dict(soft_cap=20.0, sliding_window=100)),
    (jnp.float32, 8, 8, 64, 16, dict(pages_per_compute_block=1, num_splits=7)),
])
def test_decode_compiled(decode_case, dtype, heads, kv_heads, head_dim, page_size, opts):
    args = decode_case([1, page_size, 3 * page_size + 5, 700, 0], heads=heads, kv_heads=kv_heads,
                       head_dim=head_dim, page_size=page_size, dtype=dtype)
    out = paged_attention(*args, interpret=False, **opts)
    ref_opts = {k: v for k, v in opts.items() if k in ("soft_cap", "sliding_window")}
    with jax.default_matmul_precision("highest"):
        ref = paged_attention_reference(*args, **ref_opts)
    _check(out, ref, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,heads,kv_heads,tile_q,opts", [
    (jnp.float32, 8, 2, 16, {}),
    (jnp.bfloat16, 32, 8, 8, dict(soft_cap=20.0)),
    (jnp.bfloat16, 8, 1, 4, dict(sliding_window=33)),
])
def test_ragged_compiled(ragged_case, dtype, heads, kv_heads, tile_q, opts):
    args = ragged_case([5, 1, 0, 37, 5], [20, 1, 4, 300, 69], heads=heads, kv_heads=kv_heads,
                       head_dim=128, page_size=16, dtype=dtype)
    out = ragged_paged_attention(*args, tile_q=tile_q, interpret=False, **opts)
    with jax.default_matmul_precision("highest"):
        ref = ragged_paged_attention_reference(*args, **opts)
    _check(out, ref, dtype)


@pytest.mark.gpu
def test_default_compiles_on_gpu(decode_case):
    args = decode_case([9, 40], heads=8, kv_heads=2, head_dim=128, page_size=16,
                       dtype=jnp.bfloat16)
    text = jax.jit(paged_attention).lower(*args).as_text()
    assert "triton" in text.lower()  # interpret=None compiled the kernel instead of interpreting
