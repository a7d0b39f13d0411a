"""The experimental Mosaic GPU decode kernel (pallas_kernels/paged_attention/mosaic.py).

On CPU: it lowers through Pallas' Mosaic GPU rules for CUDA (for an abstract H200), and it runs in
Mosaic GPU's CPU interpreter against the reference: the same TMA copies, barriers, shared-memory
P tile and WGMMAs as compiled (on jax 0.10.2 the QK^T WGMMA is a plain dot there; see mosaic.py).
On a GPU (-m gpu): compiled for real. gpu_check.sh runs this file in its own step, so a crash
here cannot take the other results with it.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import _compat
from pallas_kernels.paged_attention import paged_attention_reference
from pallas_kernels.paged_attention import mosaic


@pytest.mark.parametrize("heads,kv_heads,head_dim,page_size", [
    (8, 2, 128, 16), (8, 8, 64, 8), (32, 4, 128, 64)])
def test_lowers_for_cuda(heads, kv_heads, head_dim, page_size):
    spec = jax.ShapeDtypeStruct
    pool = spec((20, page_size, kv_heads, head_dim), jnp.bfloat16)
    fn = jax.jit(lambda *a: mosaic._paged_attention_mosaic(*a, sm_scale=0.1, interpret=None))
    with _compat.abstract_gpu():
        text = fn.trace(spec((3, heads, head_dim), jnp.bfloat16), pool, pool,
                        spec((3, 6), jnp.int32), spec((3,), jnp.int32)).lower(
            lowering_platforms=("cuda",)).as_text()
    assert "custom_call @mosaic_gpu" in text


@pytest.mark.parametrize("lengths,page_size", [([1, 77, 0], 16), ([130, 64], 8)])
def test_interpreted_matches_reference(decode_case, lengths, page_size):
    # 77 and 130 keys: two and three 64-key blocks, so both double-buffer slots are used.
    args = decode_case(lengths, heads=8, kv_heads=2, head_dim=64, page_size=page_size,
                       dtype=jnp.bfloat16)
    out = mosaic.paged_attention_mosaic(*args, interpret=_compat.mosaic_interpret_params())
    err = float(jnp.max(jnp.abs(out.astype(jnp.float32)
                                - paged_attention_reference(*args).astype(jnp.float32))))
    assert err <= 2e-2


def test_rejects_unsupported(decode_case):
    args = decode_case([5], heads=4, kv_heads=2, head_dim=64, page_size=8)  # float32
    with pytest.raises(ValueError, match="bf16/f16"):
        mosaic.paged_attention_mosaic(*args)


@pytest.mark.gpu
@pytest.mark.parametrize("heads,kv_heads,head_dim,page_size", [
    (32, 8, 128, 16), (8, 8, 64, 8), (16, 2, 128, 64)])
def test_compiled_matches_reference(decode_case, heads, kv_heads, head_dim, page_size):
    args = decode_case([1, page_size, 3 * page_size + 5, 700, 0], heads=heads, kv_heads=kv_heads,
                       head_dim=head_dim, page_size=page_size, dtype=jnp.bfloat16)
    out = mosaic.paged_attention_mosaic(*args)
    with jax.default_matmul_precision("highest"):
        ref = paged_attention_reference(*args)
    assert float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref.astype(jnp.float32)))) <= 2e-2


def test_interpreted_output_cannot_be_poisoned(decode_case):
    """Every pool slot outside the live tokens NaN (stale tails of last pages, whole unused pages, the pages
    padded table entries point at): the output is finite and equal to the clean pool's."""
    q, k, v, tables, lengths = decode_case([1, 77, 0], heads=8, kv_heads=2, head_dim=64, page_size=16,
                                           dtype=jnp.bfloat16)
    live = np.zeros(k.shape[:2], bool)
    for b, n in enumerate(np.asarray(lengths)):
        for pos in range(int(n)):
            live[int(tables[b, pos // 16]), pos % 16] = True
    run = functools.partial(mosaic.paged_attention_mosaic, interpret=_compat.mosaic_interpret_params())
    clean = np.asarray(run(q, k, v, tables, lengths).astype(jnp.float32))
    nan = jnp.asarray(np.nan, k.dtype)
    poisoned = np.asarray(run(q, jnp.where(live[:, :, None, None], k, nan), jnp.where(live[:, :, None, None], v, nan),
                              tables, lengths).astype(jnp.float32))
    assert np.isfinite(clean).all() and np.isfinite(poisoned).all()
    np.testing.assert_array_equal(poisoned, clean)
