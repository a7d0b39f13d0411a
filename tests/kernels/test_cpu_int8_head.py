"""The int8 LM head (jaxserve/kernels/cpu/int8_head.py, vnni.cc's W8A8 kernel) against its reference, and its
packing."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.kernels.cpu import build
from jaxserve.kernels.cpu import matmul as cpu
from jaxserve.kernels.cpu.int8_head import int8_head_matmul, int8_head_reference, pack_int8_head, with_int8_head

needs_vnni = pytest.mark.skipif(build.unavailable_reason() is not None or cpu.build.load() is None
                                or not cpu.vnni_usable(), reason="no VNNI CPU kernel (needs AVX-512 VNNI)")


@pytest.mark.parametrize("n, k", [(200, 64), (130, 33), (49, 576)])
def test_pack_int8_head_rounds_each_row_to_its_scale(n, k):
    rng = np.random.default_rng(n + k)
    w = rng.standard_normal((n, k)).astype(np.float32) * np.linspace(0.01, 2, n, dtype=np.float32)[:, None]
    w[3] = 0  # a zero row: scale 0, weights 0
    head = pack_int8_head(jnp.asarray(w))
    scale = np.abs(w).max(1) / np.float32(127)
    np.testing.assert_allclose(head.scale, scale, rtol=3e-7)  # (XLA may divide by a reciprocal)
    back = np.asarray(head.dequantize())
    assert back.shape == (n, k) and np.all(back[3] == 0)
    assert np.all(np.abs(back - w) <= scale[:, None] / 2 * (1 + 1e-5) + 1e-30)
    assert head.data.shape == (-(-n // 64) * 4, -(-k // 32) * 32 * 16)


@needs_vnni
@pytest.mark.parametrize("n, k, m", [(200, 64, 1), (1000, 100, 3), (130, 33, 5), (64, 32, 16), (4099, 576, 2)])
def test_int8_head_matches_reference(n, k, m):
    rng = np.random.default_rng(n * k + m)
    head = pack_int8_head(jnp.asarray(rng.standard_normal((n, k)) * 0.05, jnp.float32))
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    got, want = int8_head_matmul(x, head), int8_head_reference(x, head)
    size = jnp.abs(x.astype(jnp.float32)) @ jnp.abs(head.dequantize()).T
    assert float(jnp.max(jnp.abs(got - want) / size)) <= 2e-6


@needs_vnni
def test_int8_head_rows_do_not_depend_on_m_or_threads():
    rng = np.random.default_rng(3)
    head = pack_int8_head(jnp.asarray(rng.standard_normal((3000, 96)), jnp.float32))
    x = jnp.asarray(rng.standard_normal((9, 96)), jnp.float32)
    full = np.asarray(int8_head_matmul(x, head, threads=2))
    np.testing.assert_array_equal(np.asarray(int8_head_matmul(x, head, threads=1)), full)
    for rows in (slice(0, 1), slice(2, 5), slice(8, 9)):
        np.testing.assert_array_equal(np.asarray(int8_head_matmul(x[rows], head)), full[rows])


def test_with_int8_head_keeps_a_tied_embedding_and_replaces_an_untied_head():
    e = jnp.ones((70, 32), jnp.bfloat16)
    tied = with_int8_head({"embed": {"embedding": e}, "final_norm": {}}, tied=True)
    assert tied["embed"]["embedding"] is e and tied["int8_head"]["kernel"].shape == (70, 32)
    untied = with_int8_head({"embed": {"embedding": e}, "lm_head": {"kernel": jnp.ones((32, 70))}}, tied=False)
    assert "lm_head" not in untied and untied["int8_head"]["kernel"].shape == (70, 32)
    with pytest.raises(ValueError, match="x must be"):
        int8_head_matmul(jnp.zeros((1, 31)), tied["int8_head"]["kernel"])
