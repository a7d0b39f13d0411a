"""The CPU FFI matmuls (jaxserve/kernels/cpu) against XLA's dot and the FP4 reference, and the fallback.

Kernel tests skip where the kernels cannot be built (no compiler, neither AVX-512 nor AVX2+FMA, not x86-64); the
fallback tests run everywhere.
"""
import logging
import re
import subprocess

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.kernels.cpu import build
from jaxserve.kernels.cpu import matmul as cpu
from jaxserve.layers import dense_dot, dot_via, tied_logits
from pallas_kernels.fp4 import dequantize, fp4_matmul_reference, quantize
from tests.kernels.guard_harness import build_harness

needs_kernels = pytest.mark.skipif(build.unavailable_reason() is not None or cpu.build.load() is None,
                                   reason=f"CPU kernels unavailable: {build.unavailable_reason()}")
DN = (((1,), (0,)), ((), ()))


def _rel(got, want):
    """max |got - want| over max |want|."""
    return float(jnp.max(jnp.abs(got - want)) / jnp.maximum(jnp.max(jnp.abs(want)), 1e-30))


# (M, K, N): decode rows, SmolLM2's shapes, odd K and N tails, a K below one vector
SHAPES = [(1, 576, 576), (2, 576, 192), (3, 101, 37), (4, 64, 1000), (5, 1536, 33), (16, 96, 160), (7, 1, 5),
          (1, 33, 65)]


@needs_kernels
@pytest.mark.parametrize("m, k, n", SHAPES)
@pytest.mark.parametrize("transpose_w", [False, True])
@pytest.mark.parametrize("x_dtype", [jnp.float32, jnp.bfloat16])
def test_bf16_matmul_matches_xla_dot(m, k, n, transpose_w, x_dtype):
    rng = np.random.default_rng(m * 1000 + k + n)
    x = jnp.asarray(rng.standard_normal((m, k)), x_dtype)
    w = jnp.asarray(rng.standard_normal((n, k) if transpose_w else (k, n)), jnp.bfloat16)
    got = jax.jit(lambda x, w: cpu.bf16_matmul(x, w, transpose_w=transpose_w))(x, w)
    assert got.dtype == jnp.float32 and got.shape == (m, n)
    # x is rounded to bf16, as XLA's bf16 dot does: the products are exact, only the summation order differs
    want = cpu.bf16_matmul_reference(x.astype(jnp.bfloat16), w, transpose_w=transpose_w)
    assert _rel(got, want) <= 5e-6


# (M, K, N): SmolLM2's shapes, odd K and N tails (below one vector too, and 64-column chunks and a 16-row prefetch
# distance plus a tail), K = 0
F32_SHAPES = [(1, 576, 576), (2, 577, 65), (3, 101, 37), (5, 1536, 33), (16, 96, 161), (16, 7, 1), (2, 1, 1000),
              (5, 0, 9)]


@needs_kernels
@pytest.mark.parametrize("m, k, n", F32_SHAPES)
@pytest.mark.parametrize("transpose_w", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_f32_matmul_matches_xla_dot(m, k, n, transpose_w, threads):
    rng = np.random.default_rng(m * 1000 + k + n)
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((n, k) if transpose_w else (k, n)), jnp.float32)
    got = jax.jit(lambda x, w: cpu.f32_matmul(x, w, transpose_w=transpose_w, threads=threads))(x, w)
    assert got.dtype == jnp.float32 and got.shape == (m, n)
    # x is not rounded: float32 FMAs of the same operands as XLA's float32 dot, summed in another order
    assert _rel(got, cpu.bf16_matmul_reference(x, w, transpose_w=transpose_w)) <= 5e-6


@needs_kernels
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_bf16_matmul_threads_agree(threads):
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((3, 200)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((200, 999)), jnp.bfloat16)
    np.testing.assert_array_equal(cpu.bf16_matmul(x, w, threads=threads), cpu.bf16_matmul(x, w, threads=1))


@needs_kernels
@pytest.mark.parametrize("transpose_w", [False, True])
@pytest.mark.parametrize("k", [576, 1537])
def test_bf16_matmul_rows_do_not_depend_on_m(transpose_w, k):
    """Each y[m, n] sums over k in one order whatever M (speculative verify compares M = 1 with M up to 16)."""
    rng = np.random.default_rng(k)
    x = jnp.asarray(rng.standard_normal((16, k)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((1000, k) if transpose_w else (k, 1000)), jnp.bfloat16)
    full = np.asarray(cpu.bf16_matmul(x, w, transpose_w=transpose_w, threads=2))
    for rows in (slice(0, 1), slice(3, 5), slice(5, 12)):
        np.testing.assert_array_equal(cpu.bf16_matmul(x[rows], w, transpose_w=transpose_w, threads=2), full[rows])


@needs_kernels
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("x_dtype", [jnp.float32, jnp.bfloat16])
def test_fp4_matmul_cpu_rows_do_not_depend_on_m_or_threads(fmt, x_dtype):
    """Each y[m, n] sums over k in one order whatever M, the chunking or the threads: rows computed in groups of M
    (chunks narrow as M grows) are bitwise the rows of M = 1."""
    rng = np.random.default_rng(28)
    x = jnp.asarray(rng.standard_normal((16, 576)), x_dtype)
    w = quantize(jnp.asarray(rng.standard_normal((576, 1000)) * 0.05, jnp.float32), fmt, axis=0)
    mm = lambda x, t: np.asarray(cpu.fp4_matmul_cpu(x, w, out_dtype=jnp.float32, threads=t))  # noqa: E731
    full = mm(x, 2)
    np.testing.assert_array_equal(mm(x, 1), full)
    for rows in (slice(0, 1), slice(3, 5), slice(5, 12), slice(15, 16)):
        np.testing.assert_array_equal(mm(x[rows], 2), full[rows])


@needs_kernels
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("m, k, n", [(1, 576, 576), (2, 64, 37), (5, 1536, 200), (16, 96, 17), (3, 32, 64)])
@pytest.mark.parametrize("x_dtype", [jnp.float32, jnp.bfloat16])
def test_fp4_matmul_cpu_matches_reference(fmt, m, k, n, x_dtype):
    rng = np.random.default_rng(k + n)
    x = jnp.asarray(rng.standard_normal((m, k)), x_dtype)
    w = quantize(jnp.asarray(rng.standard_normal((k, n)) * 0.05, jnp.float32), fmt, axis=0)
    got = jax.jit(lambda x, w: cpu.fp4_matmul_cpu(x, w, out_dtype=jnp.float32))(x, w)
    # the kernel decodes to exactly dequantize(w)'s codes and scales; the summation order differs, and (AVX2, or bf16
    # x on AVX-512) each block's sum is scaled once instead of each weight: rounding of the same order (matmul.cc)
    assert _rel(got, fp4_matmul_reference(x, w, out_dtype=jnp.float32)) <= 5e-6


@needs_kernels
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("x_dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("m, k, v", [(1, 576, 1000), (3, 160, 77), (16, 64, 130)])
def test_fp4_matmul_cpu_tied_head_matches_reference_and_rows_do_not_depend_on_m(fmt, x_dtype, m, k, v):
    """e [V, K] quantized along K (axis 1, a tied embedding as the LM head): x @ dequantize(e)^T, and each row of
    the result bitwise the same computed alone, at 1 or 2 threads."""
    rng = np.random.default_rng(k + v)
    x = jnp.asarray(rng.standard_normal((m, k)), x_dtype)
    e = quantize(jnp.asarray(rng.standard_normal((v, k)) * 0.05, jnp.float32), fmt, axis=1)
    mm = lambda x, t=2: np.asarray(cpu.fp4_matmul_cpu(x, e, out_dtype=jnp.float32, threads=t))  # noqa: E731
    got = mm(x)
    want = jnp.dot(x.astype(jnp.float32), dequantize(e, jnp.float32).T, precision=jax.lax.Precision.HIGHEST)
    assert _rel(jnp.asarray(got), want) <= 5e-6
    np.testing.assert_array_equal(mm(x, 1), got)
    for i in range(m):
        np.testing.assert_array_equal(mm(x[i:i + 1]), got[i:i + 1])


@needs_kernels
def test_fp4_matmul_cpu_leading_axes_and_dtype():
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((2, 3, 64)), jnp.bfloat16)
    w = quantize(jnp.asarray(rng.standard_normal((64, 48)), jnp.float32), "nvfp4", axis=0)
    got = cpu.fp4_matmul_cpu(x, w)
    assert got.shape == (2, 3, 48) and got.dtype == jnp.bfloat16
    want = fp4_matmul_reference(x.reshape(6, 64), w, out_dtype=jnp.float32).reshape(2, 3, 48)
    assert _rel(got.astype(jnp.float32), want) <= 1e-2  # bf16 output rounding


@needs_kernels
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_fp4_matmul_cpu_reads_the_scales_as_stored(fmt):
    """The kernel takes NVFP4's float8_e4m3fn scales as they are. A bitcast to u8 in the graph became a copy under
    the default XLA flags (a bitcast under the tests'), one thunk per matmul: ~2 ms of a SmolLM2 decode step."""
    rng = np.random.default_rng(3)
    w = quantize(jnp.asarray(rng.standard_normal((64, 48)), jnp.float32), fmt, axis=0)
    x = jnp.asarray(rng.standard_normal((1, 64)), jnp.float32)
    hlo = jax.jit(cpu.fp4_matmul_cpu).lower(x, w).compile().as_text()
    assert "jaxserve_fp4_matmul_kn" in hlo and "bitcast" not in hlo, hlo
    np.testing.assert_allclose(cpu.fp4_matmul_cpu(x, w), fp4_matmul_reference(x, w), rtol=1e-5, atol=1e-5)


@needs_kernels
def test_quantized_matmul_routes_up_to_64_rows_to_the_fp4_kernel():
    """Weight-only FP4 Dense layers: the kernel for up to 64 rows (a batch of 64 decodes, a short prefill: it
    beats dequantize-then-dot there), the reference above; both give the reference's numbers."""
    from jaxserve.quant.matmul import quantized_matmul
    rng = np.random.default_rng(5)
    w = quantize(jnp.asarray(rng.standard_normal((64, 48)), jnp.float32), "nvfp4", axis=0)
    for rows, kernel in ((64, True), (65, False)):
        x = jnp.asarray(rng.standard_normal((rows, 64)), jnp.bfloat16)
        hlo = jax.jit(quantized_matmul).lower(x, w).as_text()
        assert ("jaxserve_fp4_matmul_kn" in hlo) == kernel, rows
        got = quantized_matmul(x, w, out_dtype=jnp.float32)
        assert _rel(got, fp4_matmul_reference(x, w, out_dtype=jnp.float32)) <= 5e-6


@needs_kernels
def test_bf16_matmul_grad_and_vmap():
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((2, 40)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((40, 24)), jnp.bfloat16)
    ref = lambda x, w: cpu.bf16_matmul_reference(x.astype(jnp.bfloat16), w)  # noqa: E731
    g = jax.grad(lambda x: jnp.sum(cpu.bf16_matmul(x, w) ** 2))(x)
    g_ref = jax.grad(lambda x: jnp.sum(ref(x, w) ** 2))(x)
    assert _rel(g, g_ref) <= 1e-2  # the JVP uses float32 x, the primal bf16-rounded x
    xs = jnp.asarray(rng.standard_normal((3, 2, 40)), jnp.float32)
    assert _rel(jax.vmap(lambda x: cpu.bf16_matmul(x, w))(xs), jax.vmap(lambda x: ref(x, w))(xs)) <= 5e-6


@needs_kernels
def test_invalid_inputs_raise_value_errors():
    w = jnp.zeros((8, 4), jnp.bfloat16)
    with pytest.raises(ValueError, match="disagree on K"):
        cpu.bf16_matmul(jnp.zeros((1, 7)), w)
    with pytest.raises(ValueError, match="must be bfloat16"):
        cpu.bf16_matmul(jnp.zeros((1, 8)), w.astype(jnp.float32))
    with pytest.raises(ValueError, match="must be float32"):
        cpu.f32_matmul(jnp.zeros((1, 8)), w)
    with pytest.raises(ValueError, match="nvfp4/mxfp4"):
        cpu.fp4_matmul_cpu(jnp.zeros((1, 32)), quantize(jnp.ones((32, 4)), "fp8", axis=0))
    with pytest.raises(ValueError, match="does not contract"):
        cpu.fp4_matmul_cpu(jnp.zeros((1, 4)), quantize(jnp.ones((4, 32)), "nvfp4", axis=1))
    with pytest.raises(ValueError, match="along axis 0, or along axis 1"):
        cpu.fp4_matmul_cpu(jnp.zeros((1, 32)), quantize(jnp.ones((2, 4, 32)), "nvfp4", axis=2))


@needs_kernels
def test_kernels_stay_inside_their_buffers(tmp_path):
    """matmul.cc's kernels on buffers flush against PROT_NONE pages (tails in N and K, K below one vector):
    any read or write outside a buffer faults; the results are checked too (cpu_matmul_guard_pages.cc)."""
    exe = build_harness("cpu_matmul_guard_pages.cc", tmp_path)
    for where in ("back", "front"):
        proc = subprocess.run([str(exe), where], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"{where}: rc {proc.returncode} {proc.stdout} {proc.stderr}"


def _custom_calls(fn, *args, target="jaxserve_bf16_matmul"):
    return jax.jit(fn).lower(*args).as_text().count(target)


@needs_kernels
def test_dot_via_routes_few_bf16_rows_to_the_kernel_and_many_to_xla(monkeypatch):
    monkeypatch.setenv(cpu.AMX_SWITCH, "0")  # (on a CPU with AMX tiles 8 rows and more go there: test_cpu_amx.py)
    rng = np.random.default_rng(4)
    w = jnp.asarray(rng.standard_normal((64, 48)), jnp.bfloat16)
    dot = lambda x: dot_via(jnp.bfloat16)(x, w, DN)  # noqa: E731
    few, many = (jnp.asarray(rng.standard_normal((r, 64)), jnp.bfloat16) for r in (cpu.MAX_ROWS, cpu.MAX_ROWS + 1))
    assert _custom_calls(dot, few) == 1 and _custom_calls(dot, many) == 0
    want = jax.lax.dot_general(few, w, DN, preferred_element_type=jnp.float32)
    assert dot(few).dtype == jnp.bfloat16 and _rel(dot(few).astype(jnp.float32), want) <= 1e-2


@needs_kernels
def test_f32_dense_dot_and_tied_logits_route_2_to_16_rows_to_the_kernel():
    rng = np.random.default_rng(5)
    w = jnp.asarray(rng.standard_normal((64, 48)), jnp.float32)
    embed = nn.Embed(48, 64, dtype=jnp.float32, param_dtype=jnp.float32)
    e = {"params": {"embedding": w.T}}
    dot = lambda x: dense_dot(jnp.float32)(x, w, DN)  # noqa: E731
    head = lambda x: embed.apply(e, x, method=lambda m, x: tied_logits(m, x))  # noqa: E731
    for rows, calls in ((1, 0), (2, 1), (cpu.MAX_ROWS, 1), (cpu.MAX_ROWS + 1, 0)):
        x = jnp.asarray(rng.standard_normal((rows, 64)), jnp.float32)
        assert _custom_calls(dot, x, target="jaxserve_f32_matmul_kn") == calls, rows
        assert _custom_calls(head, x, target="jaxserve_f32_matmul_nk") == calls, rows
        assert _rel(dot(x), cpu.bf16_matmul_reference(x, w)) <= 5e-6
        assert _rel(head(x), cpu.bf16_matmul_reference(x, w)) <= 5e-6


def test_switch_off_keeps_xla_dot(monkeypatch):
    monkeypatch.setenv(cpu.ENV_SWITCH, "0")
    assert not cpu.usable()
    w = jnp.ones((64, 48), jnp.bfloat16)
    assert _custom_calls(lambda x: dot_via(jnp.bfloat16)(x, w, DN), jnp.ones((1, 64), jnp.bfloat16)) == 0
    assert _custom_calls(lambda x: dense_dot(jnp.float32)(x, w.astype(jnp.float32), DN), jnp.ones((4, 64)),
                         target="jaxserve_f32_matmul") == 0


def test_no_compiler_falls_back_with_one_warning(monkeypatch, caplog):
    monkeypatch.setattr(build, "compiler", lambda: None)
    monkeypatch.setattr(build, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    monkeypatch.setattr(build.platform, "machine", lambda: "x86_64")
    assert "no C++ compiler" in build.unavailable_reason()
    with caplog.at_level(logging.WARNING, logger=build.__name__):
        assert build.load.__wrapped__() is None
    assert "using XLA's dot" in caplog.text
    monkeypatch.setattr(build, "cpu_flags", lambda: frozenset({"avx2"}))
    assert "lacks avx512f" in build.unavailable_reason()


@pytest.mark.parametrize("flags, missing", [
    ({"avx512f", "avx512bw"}, None),                          # the AVX-512 kernels
    ({"avx512f", "avx512bw", "avx512_bf16", "avx2", "fma"}, None),
    ({"avx2", "fma", "f16c"}, None),                          # the AVX2 kernels (an AVX2-only VM)
    ({"avx2", "f16c"}, ["fma", "avx512f", "avx512bw"]),
    ({"fma"}, ["avx2", "avx512f", "avx512bw"]),
    ({"avx512f"}, ["avx512bw", "avx2", "fma"]),
    (set(), ["avx512f", "avx512bw", "avx2", "fma"]),
])
def test_availability_needs_avx512_f_bw_or_avx2_fma(monkeypatch, flags, missing):
    monkeypatch.setattr(build, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(build.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(build, "compiler", lambda: "/usr/bin/g++")
    reason = build.unavailable_reason()
    if missing is None:
        assert reason is None
    else:  # the reason names exactly the flags each instruction set lacks
        lacks = [f for group in re.findall(r"lacks ([^)]*)", reason or "") for f in group.split(", ")]
        assert sorted(lacks) == sorted(missing), reason
