"""The AMX bf16 GEMM (``jaxserve.kernels.cpu.bf16_gemm``, many rows) against float64 numpy of the same operands, its
invariants (a row's result depends neither on the other rows nor on the threads), its buffers, its routing from the
bf16 layers and its switch.

GEMM tests skip on CPUs without AMX-BF16 (or where Linux refuses the tile state): there is nothing to run them on.
The error test runs wherever the kernels build.
"""
import subprocess

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.kernels.cpu import build
from jaxserve.kernels.cpu import matmul as cpu
from jaxserve.layers import dot_via, tied_logits
from tests.kernels.guard_harness import build_harness

needs_kernels = pytest.mark.skipif(build.unavailable_reason() is not None or build.load() is None,
                                   reason=f"CPU kernels unavailable: {build.unavailable_reason()}")
needs_amx = pytest.mark.skipif(not cpu.amx_usable(), reason="no AMX-BF16 tiles on this CPU (or the kernels)")
DN = (((1,), (0,)), ((), ()))


def _operands(m, k, n, transpose_w, seed):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((n, k) if transpose_w else (k, n)), jnp.bfloat16)
    return x, w


def _float64_product(x, w, transpose_w):
    """x rounded to bf16 (the operands the tiles multiply), then a float64 product."""
    xb = np.asarray(x.astype(jnp.bfloat16), np.float64)
    wf = np.asarray(w, np.float64)
    return xb @ (wf.T if transpose_w else wf), np.abs(xb) @ np.abs(wf.T if transpose_w else wf)


# (M, K, N): SmolLM2's shapes at a verify round (9 rows) and batch 64 (q/o, k/v, the tied head's width cut down),
# tails in every dimension (M past 16-row tiles and 32-row blocks, K past 32-k blocks, N past 16-column tiles, 32-column
# blocks and 256-column chunks), a K of one, K = 0
GEMM_SHAPES = [(9, 576, 576), (64, 576, 192), (64, 576, 4096), (33, 101, 37), (50, 1536, 300), (17, 1, 1000),
               (20, 0, 9), (1, 64, 33)]


@needs_amx
@pytest.mark.parametrize("m, k, n", GEMM_SHAPES)
@pytest.mark.parametrize("transpose_w", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_bf16_gemm_matches_float64_numpy(m, k, n, transpose_w, threads):
    x, w = _operands(m, k, n, transpose_w, m * 1000 + k + n)
    got = jax.jit(lambda x, w: cpu.bf16_gemm(x, w, transpose_w=transpose_w, threads=threads))(x, w)
    assert got.dtype == jnp.float32 and got.shape == (m, n)
    want, magnitude = _float64_product(x, w, transpose_w)
    # float32 sums of exact products: at most K roundings of 2^-24 each, relative to the sum of |products|
    err = np.abs(np.asarray(got, np.float64) - want)
    assert np.all(err <= k * 2.0 ** -24 * magnitude + 1e-30)


@needs_amx
@pytest.mark.parametrize("transpose_w", [False, True])
def test_bf16_gemm_rows_do_not_depend_on_the_batch_or_threads(transpose_w):
    """Each output sums its k in order, whatever M, the tiles and blocks a row lands in, or the threads: the rows of
    a request give the same bits alone or in a batch of 64."""
    x, w = _operands(64, 576, 700, transpose_w, 7)
    full = np.asarray(cpu.bf16_gemm(x, w, transpose_w=transpose_w, threads=2))
    for rows, threads in ((1, 1), (9, 2), (17, 1), (40, 2)):
        part = np.asarray(cpu.bf16_gemm(x[-rows:], w, transpose_w=transpose_w, threads=threads))
        np.testing.assert_array_equal(part, full[-rows:])


@needs_amx
def test_bf16_gemm_grad_and_vmap():
    x, w = _operands(20, 64, 48, False, 3)
    g = jax.grad(lambda x: cpu.bf16_gemm(x, w).sum())(x)
    np.testing.assert_allclose(g, np.broadcast_to(np.asarray(w, np.float32).sum(1), x.shape), rtol=1e-6)
    batched = jax.vmap(lambda x: cpu.bf16_gemm(x, w))(jnp.stack([x, 2 * x]))
    np.testing.assert_array_equal(batched[1], cpu.bf16_gemm(2 * x, w))


@pytest.mark.skipif(not cpu.usable(), reason="the CPU kernels are unavailable")
def test_amx_kernels_stay_inside_their_buffers(tmp_path):
    """amx.cc's GEMMs (where the CPU has AMX) and the packed GEMM's FMA implementation (everywhere) on buffers flush
    against PROT_NONE pages, every ragged edge (cpu_amx_guard_pages.cc)."""
    exe = build_harness("cpu_amx_guard_pages.cc", tmp_path)
    for where in ("back", "front"):
        proc = subprocess.run([str(exe), where], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{where}: rc {proc.returncode} {proc.stdout} {proc.stderr}"
        assert proc.stdout.startswith("outputs " if cpu.amx_usable() else "no AMX\noutputs "), proc.stdout


def _custom_calls(fn, *args, target):
    return jax.jit(fn).lower(*args).as_text().count(target)


@needs_amx
def test_bf16_layers_route_many_rows_to_amx_and_few_to_the_streaming_kernel():
    """A [K, N] Dense kernel from 8 rows, the tied head from 1 (the measurements at
    ``jaxserve.layers._CPU_AMX_MIN_ROWS``)."""
    rng = np.random.default_rng(5)
    w = jnp.asarray(rng.standard_normal((64, 48)), jnp.bfloat16)
    embed = nn.Embed(48, 64, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    e = {"params": {"embedding": w.T}}
    dot = lambda x: dot_via(jnp.bfloat16)(x, w, DN)  # noqa: E731
    head = lambda x: embed.apply(e, x, method=lambda m, x: tied_logits(m, x))  # noqa: E731
    for rows, dense_amx, head_amx in ((1, 0, 1), (2, 0, 1), (7, 0, 1), (8, 1, 1), (64, 1, 1)):
        x = jnp.asarray(rng.standard_normal((rows, 64)), jnp.bfloat16)
        assert _custom_calls(dot, x, target="jaxserve_bf16_gemm_kn") == dense_amx, rows
        assert _custom_calls(dot, x, target="jaxserve_bf16_matmul_kn") == 1 - dense_amx, rows
        assert _custom_calls(head, x, target="jaxserve_bf16_gemm_nk") == head_amx, rows
        assert _custom_calls(head, x, target="jaxserve_bf16_matmul_nk") == 1 - head_amx, rows
        want = np.asarray(x, np.float32) @ np.asarray(w, np.float32)
        np.testing.assert_allclose(np.asarray(dot(x), np.float32), want, rtol=2e-2, atol=2e-2 * np.abs(want).max())
        np.testing.assert_allclose(np.asarray(head(x), np.float32), want, rtol=2e-2, atol=2e-2 * np.abs(want).max())


@needs_amx
def test_amx_switch_off_keeps_the_other_paths(monkeypatch):
    monkeypatch.setenv(cpu.AMX_SWITCH, "0")
    assert not cpu.amx_usable() and cpu.usable()
    w = jnp.ones((64, 48), jnp.bfloat16)
    dot = lambda x: dot_via(jnp.bfloat16)(x, w, DN)  # noqa: E731
    assert _custom_calls(dot, jnp.ones((16, 64), jnp.bfloat16), target="jaxserve_bf16_gemm") == 0
    assert _custom_calls(dot, jnp.ones((16, 64), jnp.bfloat16), target="jaxserve_bf16_matmul_kn") == 1
    assert _custom_calls(dot, jnp.ones((64, 64), jnp.bfloat16), target="jaxserve_") == 0  # XLA's dot


@needs_kernels
def test_bf16_gemm_without_tiles_raises_before_any_call(monkeypatch):
    monkeypatch.setattr(cpu, "amx_granted", lambda: False)
    assert not cpu.amx_usable()
    with pytest.raises(RuntimeError, match="bf16_gemm: AMX tiles are unavailable"):
        cpu.bf16_gemm(jnp.ones((20, 64)), jnp.ones((64, 48), jnp.bfloat16))
    with pytest.raises(ValueError, match="bf16_gemm: w must be bfloat16, got float32"):
        cpu.bf16_gemm(jnp.ones((20, 64)), jnp.ones((64, 48), jnp.float32))
