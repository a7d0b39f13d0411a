"""The experimental Mosaic GPU decode kernel (pallas_kernels/paged_attention/mosaic.py).

On CPU: it lowers through Pallas' Mosaic GPU rules for CUDA, and it runs in Mosaic GPU's CPU
interpreter (which replaces its two WGMMAs by plain dots; see mosaic.py) against the reference.
On a GPU (-m gpu): compiled for real. gpu_check.sh runs this file in its own step, so a crash
here cannot take the other results with it.
"""
import jax
import jax.numpy as jnp
import pytest

from pallas_kernels.paged_attention import paged_attention_reference
from pallas_kernels.paged_attention import mosaic


@pytest.mark.parametrize("heads,kv_heads,head_dim,page_size", [
    (8, 2, 128, 16), (8, 8, 64, 8), (32, 4, 128, 64)])
def test_lowers_for_cuda(heads, kv_heads, head_dim, page_size):
    spec = jax.ShapeDtypeStruct
    pool = spec((20, page_size, kv_heads, head_dim), jnp.bfloat16)
    fn = jax.jit(lambda *a: mosaic._paged_attention_mosaic(*a, sm_scale=0.1, interpret=None))
    text = fn.trace(spec((3, heads, head_dim), jnp.bfloat16), pool, pool,
                    spec((3, 6), jnp.int32), spec((3,), jnp.int32)).lower(
        lowering_platforms=("cuda",)).as_text()
    assert "mosaic" in text.lower()


def test_interpreted_matches_reference(decode_case):
    params = pytest.importorskip("jax._src.pallas.mosaic_gpu.interpret.params")
    args = decode_case([1, 77, 0], heads=8, kv_heads=2, head_dim=64, page_size=16,
                       dtype=jnp.bfloat16)
    out = mosaic.paged_attention_mosaic(*args, interpret=params.InterpretGPUParams())
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
