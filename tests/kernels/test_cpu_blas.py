"""The float32 GEMM by OpenBLAS (``jaxserve.kernels.cpu.f32_gemm``, many rows) against float64 numpy and XLA's dot,
its routing from the float32 layers, its switch, and the fallback without the wheel.

GEMM tests skip where the CPU kernels or OpenBLAS (the scipy-openblas32 wheel) are unavailable; the fallback test
runs wherever the kernels build.
"""
import logging

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.kernels.cpu import build
from jaxserve.kernels.cpu import matmul as cpu
from jaxserve.layers import dense_dot, tied_logits

needs_kernels = pytest.mark.skipif(build.unavailable_reason() is not None or build.load() is None,
                                   reason=f"CPU kernels unavailable: {build.unavailable_reason()}")
needs_blas = pytest.mark.skipif(not cpu.blas_usable(), reason="CPU kernels or OpenBLAS (scipy-openblas32) unavailable")
DN = (((1,), (0,)), ((), ()))


def _rel(got, want):
    """max |got - want| over max |want|."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


def _custom_calls(fn, *args, target):
    return jax.jit(fn).lower(*args).as_text().count(target)


# (M, K, N): SmolLM2's shapes at batch 17 and 64, primes and odd tails in every dimension (N below and across the
# 64-column blocks the threads split), a K of one, K = 0
GEMM_SHAPES = [(17, 576, 576), (64, 576, 192), (33, 101, 37), (97, 1536, 33), (257, 96, 161), (20, 7, 1),
               (19, 1, 1000), (18, 0, 9)]


@needs_blas
@pytest.mark.parametrize("m, k, n", GEMM_SHAPES)
@pytest.mark.parametrize("transpose_w", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_f32_gemm_matches_float64_numpy_and_xla_dot(m, k, n, transpose_w, threads):
    rng = np.random.default_rng(m * 1000 + k + n)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k) if transpose_w else (k, n)).astype(np.float32)
    got = jax.jit(lambda x, w: cpu.f32_gemm(x, w, transpose_w=transpose_w, threads=threads))(x, w)
    assert got.dtype == jnp.float32 and got.shape == (m, n)
    want = x.astype(np.float64) @ (w.T if transpose_w else w).astype(np.float64)
    if k == 0:
        assert not np.any(np.asarray(got))  # y is written even with nothing to sum
        return
    # float32 sums of the same float32 products, in another order
    assert _rel(got, want) <= 5e-6
    assert _rel(got, cpu.bf16_matmul_reference(x, w, transpose_w=transpose_w)) <= 5e-6


@needs_blas
def test_f32_gemm_grad_matches_xla():
    rng = np.random.default_rng(1)
    x, w = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((24, 40), (40, 30)))
    loss = lambda f: lambda x, w: jnp.sum(jnp.sin(f(x, w)))  # noqa: E731
    got = jax.grad(loss(cpu.f32_gemm), argnums=(0, 1))(x, w)
    want = jax.grad(loss(lambda x, w: jnp.dot(x, w, precision=jax.lax.Precision.HIGHEST)), argnums=(0, 1))(x, w)
    for g, r in zip(got, want):
        assert _rel(g, r) <= 1e-5


def _dense_and_head(rng):
    w = jnp.asarray(rng.standard_normal((64, 48)), jnp.float32)
    embed = nn.Embed(48, 64, dtype=jnp.float32, param_dtype=jnp.float32)
    e = {"params": {"embedding": w.T}}
    dot = lambda x: dense_dot(jnp.float32)(x, w, (((x.ndim - 1,), (0,)), ((), ())))  # noqa: E731
    head = lambda x: embed.apply(e, x, method=lambda m, x: tied_logits(m, x))  # noqa: E731
    return w, dot, head


@needs_blas
def test_f32_dense_dot_and_tied_logits_route_over_16_rows_to_openblas():
    rng = np.random.default_rng(5)
    w, dot, head = _dense_and_head(rng)
    # (x's shape, GEMM calls): up to MAX_ROWS rows stay on the few-row kernel; leading axes count as rows
    for shape, calls in (((cpu.MAX_ROWS, 64), 0), ((cpu.MAX_ROWS + 1, 64), 1), ((64, 64), 1), ((4, 9, 64), 1),
                         ((2, 8, 64), 0)):
        x = jnp.asarray(rng.standard_normal(shape), jnp.float32)
        assert _custom_calls(dot, x, target="jaxserve_f32_gemm_kn") == calls, shape
        assert _custom_calls(head, x, target="jaxserve_f32_gemm_nk") == calls, shape
        want = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
        assert dot(x).shape == head(x).shape == want.shape
        assert _rel(dot(x), want) <= 5e-6 and _rel(head(x), want) <= 5e-6


@needs_blas
@pytest.mark.parametrize("switch", [cpu.BLAS_SWITCH, cpu.ENV_SWITCH])
def test_switches_keep_xla_dot_for_many_rows(monkeypatch, switch):
    """JAXSERVE_CPU_BLAS=0 turns off only the GEMM (the few-row kernel stays); JAXSERVE_CPU_KERNELS=0 turns off
    both."""
    monkeypatch.setenv(switch, "0")
    assert not cpu.blas_usable()
    _, dot, head = _dense_and_head(np.random.default_rng(6))
    many, few = jnp.ones((64, 64)), jnp.ones((4, 64))
    assert _custom_calls(dot, many, target="jaxserve_f32_gemm") == 0
    assert _custom_calls(head, many, target="jaxserve_f32_gemm") == 0
    assert "dot_general" in jax.jit(dot).lower(many).as_text()
    kernel_calls = int(switch == cpu.BLAS_SWITCH)
    assert _custom_calls(dot, few, target="jaxserve_f32_matmul_kn") == kernel_calls
    assert _custom_calls(head, few, target="jaxserve_f32_matmul_nk") == kernel_calls


@pytest.fixture
def fresh_load_blas():
    """load_blas() uncached for the test, and uncached again after it (the real library then reloads)."""
    build.load_blas.cache_clear()
    yield
    build.load_blas.cache_clear()


@needs_kernels
@pytest.mark.parametrize("what, value", [("BLAS_MODULE", "no_such_openblas_wheel"), ("BLAS_SGEMM", "no_such_sgemm")])
def test_missing_wheel_or_symbol_falls_back_to_xla_with_one_warning(monkeypatch, caplog, fresh_load_blas, what, value):
    monkeypatch.setattr(build, what, value)
    with caplog.at_level(logging.WARNING, logger=build.__name__):
        assert build.load_blas() is None and build.load_blas() is None
    assert caplog.text.count("using XLA's dot") == 1 and value in caplog.text
    assert cpu.usable() and not cpu.blas_usable()
    _, dot, head = _dense_and_head(np.random.default_rng(7))
    many = jnp.ones((32, 64))
    assert _custom_calls(dot, many, target="jaxserve_f32_gemm") == 0
    assert _custom_calls(head, many, target="jaxserve_f32_gemm") == 0
    assert "dot_general" in jax.jit(dot).lower(many).as_text()
    with pytest.raises(RuntimeError, match="OpenBLAS is unavailable"):
        cpu.f32_gemm(many, jnp.ones((64, 8)))
