"""The CPU paged-attention kernel (jaxserve/kernels/cpu/attention.cc) against the plain-jnp references of
``pallas_kernels.paged_attention``, its routing from ``XlaAttention``, and a guard-page harness.

Kernel tests skip where the kernels cannot be built; the routing-off test runs everywhere.
"""
import re
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.kernels.cpu import attention as ca
from jaxserve.kernels.cpu import build
from jaxserve.models.attention_backends import attention_backend
from pallas_kernels import paged_attention as pa
from tests.kernels.guard_harness import build_harness

needs_kernels = pytest.mark.skipif(build.unavailable_reason() is not None or build.load() is None,
                                   reason=f"CPU kernels unavailable: {build.unavailable_reason()}")
TOL = dict(rtol=2e-5, atol=2e-5)
GARBAGE = (2**31 - 1, -(2**31), -1, 10**6)  # table entries past the live pages: the kernel must not read them


def _pools(rng, num_pages, page, kv_heads, head_dim):
    shape = (num_pages, page, kv_heads, head_dim)
    k, v = (jnp.asarray(rng.standard_normal(shape, np.float32)) for _ in range(2))
    return k, pa.tokens_minor(k), v


def _tables(rng, lengths, page, width, num_pages):
    """Distinct random live pages per sequence; every entry past them is garbage (out of the pool's range)."""
    tables = np.asarray(rng.choice(GARBAGE, (len(lengths), width)), np.int32)
    perm = rng.permutation(num_pages)
    at = 0
    for b, n in enumerate(lengths):
        need = -(-n // page)
        tables[b, :need] = perm[at:at + need]
        at += need
    return jnp.asarray(tables)


def _case(seed, lengths, page=16, kv_heads=3, heads=9, head_dim=64, width=None):
    rng = np.random.default_rng(seed)
    width = width or max(-(-n // page) for n in lengths) + 1
    num_pages = sum(-(-n // page) for n in lengths) + 2
    k, kt, v = _pools(rng, num_pages, page, kv_heads, head_dim)
    return rng, k, kt, v, _tables(rng, lengths, page, width, num_pages), jnp.asarray(lengths, jnp.int32), heads


def _reference_tables(tables, num_pages):
    """The reference gathers every entry: point the garbage at page 0 (masked there, never read by the kernel)."""
    return jnp.where((tables >= 0) & (tables < num_pages), tables, 0)


OPTIONS = [dict(), dict(sliding_window=5), dict(sm_scale=0.21), dict(soft_cap=3.0), dict(sliding_window=17,
                                                                                          soft_cap=2.0)]
SHAPES = [  # (page, kv heads, heads, head dim): SmolLM2-135M's; MHA; G = 4, 8 with a page of 8 and 32; odd sizes
    (16, 3, 9, 64), (16, 2, 2, 32), (8, 2, 8, 16), (32, 1, 8, 128), (5, 1, 3, 20)]


@needs_kernels
@pytest.mark.parametrize("opts", OPTIONS)
@pytest.mark.parametrize("shape", SHAPES)
def test_decode_matches_reference(shape, opts):
    page, kv_heads, heads, head_dim = shape
    lengths = [1, page, page + 1, 3 * page - 1, 70, 0]  # one token, block boundaries, an idle row
    rng, k, kt, v, tables, lens, h = _case(0, lengths, page, kv_heads, heads, head_dim)
    q = jnp.asarray(rng.standard_normal((len(lengths), h, head_dim), np.float32))
    got = ca.paged_attention_cpu(q, kt, v, tables, lens, **opts)
    want = pa.paged_attention_reference(q, k, v, _reference_tables(tables, k.shape[0]), lens, **opts)
    np.testing.assert_allclose(got, want, **TOL)
    assert not np.asarray(got[-1]).any()  # length 0: zeros


@needs_kernels
@pytest.mark.parametrize("opts", OPTIONS)
@pytest.mark.parametrize("q_len", [1, 5, 11])
def test_uniform_matches_reference(q_len, opts):
    lengths = [q_len, 16, 33, 47, 0, 64]  # a fresh prompt, a verify at a block boundary, an idle row
    rng, k, kt, v, tables, lens, h = _case(1, lengths)
    q = jnp.asarray(rng.standard_normal((q_len * len(lengths), h, 64), np.float32))
    got = ca.uniform_paged_attention_cpu(q, kt, v, tables, lens, q_len, **opts)
    want = pa.uniform_paged_attention_reference(q, k, v, _reference_tables(tables, k.shape[0]), lens, q_len, **opts)
    np.testing.assert_allclose(got, want, **TOL)


@needs_kernels
@pytest.mark.parametrize("opts", OPTIONS)
@pytest.mark.parametrize("shape", SHAPES[:3])
def test_ragged_matches_reference(shape, opts):
    page, kv_heads, heads, head_dim = shape
    q_lens = [1, 37, 0, 1, 5, 16, 1]  # decodes, prefill chunks on prefixes, a fresh prompt, an idle sequence
    lengths = [1, 60, 0, 17, 5, 16, 90]
    rng, k, kt, v, tables, lens, h = _case(2, lengths, page, kv_heads, heads, head_dim)
    cu = jnp.asarray(np.concatenate([[0], np.cumsum(q_lens)]), jnp.int32)
    q = jnp.asarray(rng.standard_normal((int(cu[-1]) + 4, h, head_dim), np.float32))  # 4 padding rows
    got = ca.ragged_paged_attention_cpu(q, kt, v, tables, lens, cu, **opts)
    want = pa.ragged_paged_attention_reference(q, k, v, _reference_tables(tables, k.shape[0]), lens, cu, **opts)
    np.testing.assert_allclose(got, want, **TOL)
    assert not np.asarray(got[int(cu[-1]):]).any()


@needs_kernels
def test_bf16_queries_come_back_bf16_and_match():
    rng, k, kt, v, tables, lens, h = _case(3, [20, 41])
    q = jnp.asarray(rng.standard_normal((2, h, 64)), jnp.bfloat16)
    got = ca.paged_attention_cpu(q, kt, v, tables, lens)
    want = pa.paged_attention_reference(q.astype(jnp.float32), k, v, _reference_tables(tables, k.shape[0]), lens)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(got.astype(jnp.float32), want, rtol=1e-2, atol=1e-2)


@needs_kernels
@pytest.mark.parametrize("bits_pools", [False, True])
def test_bf16_queries_give_the_bits_of_a_float32_call_rounded(bits_pools):
    """bf16 q goes into the kernel as it is and the output comes out bf16: the bits of converting q to float32,
    attending, and rounding the output to nearest even (the converts this replaced), with ragged rows and rows that
    see nothing (zeros)."""
    rng, k, kt, v, tables, lens, h = _case(4, [20, 41, 3])
    if bits_pools:
        kt, v = (jax.lax.bitcast_convert_type(x.astype(jnp.bfloat16), jnp.uint16) for x in (kt, v))
    q = jnp.asarray(3 * rng.standard_normal((9, h, 64)), jnp.bfloat16)
    cu = jnp.asarray([0, 4, 5, 7], jnp.int32)  # 2 rows no sequence owns
    got = ca.ragged_paged_attention_cpu(q, kt, v, tables, lens, cu)
    want = ca.ragged_paged_attention_cpu(q.astype(jnp.float32), kt, v, tables, lens, cu).astype(jnp.bfloat16)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(jax.lax.bitcast_convert_type(got, jnp.uint16),
                                  jax.lax.bitcast_convert_type(want, jnp.uint16))
    assert not np.asarray(got[7:].astype(jnp.float32)).any()


@needs_kernels
def test_bf16_output_rounds_ties_to_even():
    """A row that sees one key gets that key's V row exactly; V rows of float32 values halfway between two bf16
    neighbours (1 + 2^-8 and the like) must round to the even one, as XLA's convert does."""
    rng, k, kt, v, tables, _, h = _case(5, [1, 1])
    lens = jnp.asarray([1, 1], jnp.int32)
    # halfway above an even bf16 mantissa (rounds down) or above an odd one (rounds up)
    ties = rng.choice([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8], v.shape) * 2.0 ** rng.integers(-3, 4, v.shape)
    v = jnp.asarray(ties * rng.choice([-1, 1], v.shape), jnp.float32)
    q = jnp.asarray(rng.standard_normal((2, h, 64)), jnp.bfloat16)
    got = ca.paged_attention_cpu(q, kt, v, tables, lens)
    want = ca.paged_attention_cpu(q.astype(jnp.float32), kt, v, tables, lens)
    assert not np.array_equal(want, want.astype(jnp.bfloat16).astype(jnp.float32))  # ties, not bf16 values
    np.testing.assert_array_equal(jax.lax.bitcast_convert_type(got, jnp.uint16),
                                  jax.lax.bitcast_convert_type(want.astype(jnp.bfloat16), jnp.uint16))


@needs_kernels
def test_thread_count_does_not_change_a_bit():
    q_lens, lengths = [1, 30, 1, 9, 1], [200, 45, 3, 9, 130]
    rng, k, kt, v, tables, lens, h = _case(4, lengths)
    cu = jnp.asarray(np.concatenate([[0], np.cumsum(q_lens)]), jnp.int32)
    q = jnp.asarray(rng.standard_normal((int(cu[-1]), h, 64), np.float32))
    outs = [np.asarray(jax.jit(lambda *a, t=t: ca.ragged_paged_attention_cpu(*a, threads=t))(q, kt, v, tables, lens,
                                                                                              cu)) for t in (1, 2, 7)]
    for other in outs[1:]:
        np.testing.assert_array_equal(other, outs[0])


@needs_kernels
@pytest.mark.parametrize("opts", [dict(), dict(sliding_window=37)])
def test_verify_rows_get_the_bits_decode_rows_get(opts):
    """A speculative verify's rows (uniform, 9 a sequence: items of 8 rows and of 1) equal one decode call per
    position, bit for bit: the pages and softmax groups an item walks do not change a row's sums."""
    lengths = [40, 130, 150, 300]
    rng, k, kt, v, tables, lens, h = _case(5, lengths)
    q = jnp.asarray(rng.standard_normal((9 * len(lengths), h, 64), np.float32))
    verify = np.asarray(ca.uniform_paged_attention_cpu(q, kt, v, tables, lens, 9, **opts))
    for r in range(9):
        rows = q[r::9]  # row r of every sequence, at position length - 9 + r
        decode = ca.paged_attention_cpu(rows, kt, v, tables, lens - 8 + r, **opts)
        np.testing.assert_array_equal(np.asarray(decode), verify[r::9])


@needs_kernels
def test_nan_past_the_context_and_outside_the_window_never_leaks():
    lengths = [21, 7]
    rng, k, kt, v, tables, lens, h = _case(5, lengths, width=4)
    q = jnp.asarray(rng.standard_normal((2, h, 64), np.float32))
    live = np.zeros(k.shape[:2], bool)
    for b, n in enumerate(lengths):
        for pos in range(max(0, n - 4), n):  # window 4: only the last 4 keys are seen
            live[int(tables[b, pos // 16]), pos % 16] = True
    kp, vp = (np.where(live[:, :, None, None], np.asarray(x), np.nan).astype(np.float32) for x in (k, v))
    clean = ca.paged_attention_cpu(q, kt, v, tables, lens, sliding_window=4)
    dirty = ca.paged_attention_cpu(q, pa.tokens_minor(jnp.asarray(kp)), jnp.asarray(vp), tables, lens,
                                   sliding_window=4)
    np.testing.assert_array_equal(dirty, clean)


@needs_kernels
def test_bad_arguments_are_value_errors():
    rng, k, kt, v, tables, lens, h = _case(6, [5])
    q = jnp.zeros((1, h, 64), jnp.float32)
    with pytest.raises(ValueError, match="v_pages"):
        ca.paged_attention_cpu(q, kt, kt, tables, lens)
    with pytest.raises(ValueError, match="multiple of 3 heads"):
        ca.paged_attention_cpu(jnp.zeros((1, 8, 64)), kt, v, tables, lens)
    with pytest.raises(ValueError, match="float32"):
        ca.paged_attention_cpu(q, kt.astype(jnp.bfloat16), v, tables, lens)
    with pytest.raises(ValueError, match="sliding_window"):
        ca.paged_attention_cpu(q, kt, v, tables, lens, sliding_window=0)


def _traced_targets(backend, q, layer_k, v, tables, lens):
    return jax.jit(lambda q, k, v: backend.decode(q, k, v, tables, lens)).lower(q, layer_k, v).as_text()


@needs_kernels
def test_xla_backend_routes_float32_and_bf16_pools_to_the_kernel(monkeypatch):
    rng, k, kt, v, tables, lens, h = _case(7, [9, 30])
    q = jnp.asarray(rng.standard_normal((2, h, 64), np.float32))
    xla = attention_backend("xla")
    f32, bf16 = ca.TARGETS[jnp.dtype(jnp.float32)], ca.TARGETS[jnp.dtype(jnp.uint16)]
    assert f32 + "(" in _traced_targets(xla, q, kt, v, tables, lens)
    bits = (jax.lax.bitcast_convert_type(x.astype(jnp.bfloat16), jnp.uint16) for x in (kt, v))
    assert bf16 + "(" in _traced_targets(xla, q, *bits, tables, lens)
    assert "jaxserve_paged" not in _traced_targets(xla, q, kt.astype(jnp.float16), v.astype(jnp.float16), tables, lens)
    for off in ("0", "off", "False", "no"):
        monkeypatch.setenv(ca.ENV_SWITCH, off)
        assert "jaxserve_paged" not in _traced_targets(xla, q, kt, v, tables, lens)
    monkeypatch.delenv(ca.ENV_SWITCH)
    monkeypatch.setenv("JAXSERVE_CPU_KERNELS", "0")
    assert "jaxserve_paged" not in _traced_targets(xla, q, kt, v, tables, lens)


@needs_kernels
@pytest.mark.parametrize("opts", OPTIONS)
def test_bf16_pools_give_the_bits_float32_pools_holding_their_values_give(opts):
    """Pools of bf16 bits (uint16, as the engine keeps them; bf16 arrays are bit-cast) are widened element by element
    as they are read: the same sums, in the same order, as over float32 pools holding those values (decode and a
    ragged batch)."""
    q_lens, lengths = [1, 30, 1, 9, 0], [200, 45, 3, 9, 4]
    rng, k, kt, v, tables, lens, h = _case(8, lengths)
    kt, v = kt.astype(jnp.bfloat16), v.astype(jnp.bfloat16)
    cu = jnp.asarray(np.concatenate([[0], np.cumsum(q_lens)]), jnp.int32)
    q = jnp.asarray(rng.standard_normal((int(cu[-1]), h, 64), np.float32))
    wide = (kt.astype(jnp.float32), v.astype(jnp.float32))
    np.testing.assert_array_equal(ca.ragged_paged_attention_cpu(q, kt, v, tables, lens, cu, **opts),
                                  ca.ragged_paged_attention_cpu(q, *wide, tables, lens, cu, **opts))
    np.testing.assert_array_equal(ca.paged_attention_cpu(q[:5], kt, v, tables, lens, **opts),
                                  ca.paged_attention_cpu(q[:5], *wide, tables, lens, **opts))
    bits = [jax.lax.bitcast_convert_type(x, jnp.uint16) for x in (kt, v)]
    np.testing.assert_array_equal(ca.paged_attention_cpu(q[:5], *bits, tables, lens, **opts),
                                  ca.paged_attention_cpu(q[:5], *wide, tables, lens, **opts))


def test_switch_off_is_not_usable(monkeypatch):
    monkeypatch.setenv(ca.ENV_SWITCH, "off")
    assert not ca.usable(jnp.zeros(1, jnp.float32), jnp.zeros(1, jnp.float32))


@needs_kernels
def test_guard_pages(tmp_path):
    """attention.cc with every page no query sees, and the memory after the tables, q and the output, on PROT_NONE
    pages (cpu_attention_guard_pages.cc): a read outside the visible pages faults; the outputs are checked against a
    double-precision reference too."""
    exe = build_harness("cpu_attention_guard_pages.cc", tmp_path)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"rc {proc.returncode} {proc.stdout} {proc.stderr}"


@pytest.mark.skipif(build.compiler() is None, reason="no C++ compiler")
@pytest.mark.parametrize("group", ["SOURCES", "HEADERS"])
def test_build_key_covers_both_sources_and_the_header(group, tmp_path, monkeypatch):
    """An edit to any file compiled into jaxserve_cpu_kernels.so gives a new cache key (a fresh build)."""
    cxx = build.compiler()
    key = build._build_key(cxx)
    for i, path in enumerate(getattr(build, group)):
        copies = [tmp_path / p.name for p in getattr(build, group)]
        for src, dst in zip(getattr(build, group), copies):
            dst.write_bytes(src.read_bytes())
        with monkeypatch.context() as m:
            m.setattr(build, group, tuple(copies))
            assert build._build_key(cxx) == key  # the same bytes: the same key
            copies[i].write_bytes(copies[i].read_bytes() + b"\n// edited\n")
            assert build._build_key(cxx) != key, path.name


@pytest.mark.parametrize("k_tokens_minor", [True, False])
def test_pools_of_bf16_bits_are_written_and_copied_in_place(k_tokens_minor):
    """A uint16 pool holds bf16 bits: new rows are rounded to bf16 and scattered as bits, block copies move bits; the
    values a float32 pool gets, and the compiled program neither converts nor copies a whole pool (a bf16 pool, or a
    bit-cast of one, would be: XLA:CPU has no bf16 scatter, and it materializes a bit-cast)."""
    from jaxserve.cache.kv_pool import init_kv_pool
    rng = np.random.default_rng(9)
    pools = {dt: init_kv_pool(1, 256, 16, 3, 64, dt, k_tokens_minor=k_tokens_minor) for dt in (jnp.uint16, jnp.float32)}
    k, v = (jnp.asarray(rng.standard_normal((5, 3, 64)), jnp.float32) for _ in range(2))
    slots = jnp.asarray([0, 17, -1, 63, 5], jnp.int32)  # -1: padding, dropped

    def step(pool, k, v):
        layer = pool.layers[0].write(k, v, slots)
        return pool.replace(layers=(layer,)).copy_blocks(jnp.asarray([1, 0]), jnp.asarray([2, -1]))
    got = jax.jit(step)(pools[jnp.uint16], k, v)
    want = step(pools[jnp.float32], k.astype(jnp.bfloat16).astype(jnp.float32), v.astype(jnp.bfloat16).astype(jnp.float32))
    assert got.layers[0].k.dtype == jnp.uint16
    for a, b in ((got.layers[0].k, want.layers[0].k), (got.layers[0].v, want.layers[0].v)):
        np.testing.assert_array_equal(np.asarray(jax.lax.bitcast_convert_type(a, jnp.bfloat16).astype(jnp.float32)),
                                      np.asarray(b))
    assert np.asarray(got.layers[0].v[2]).any()  # page 1 (slot 17) copied onto page 2
    compiled = jax.jit(step, donate_argnums=0).lower(pools[jnp.uint16], k, v).compile().as_text()
    whole = [line for line in compiled.splitlines()
             if re.search(r"= (bf16|f32)\[256,", line) or re.search(r"= u16\[256,[^=]*\bcopy\(", line)]
    assert not whole, whole  # no pool-sized float array, no copy of a pool


def _write_case(seed, lengths, q_len, pool_dtype):
    """Pools in ``pool_dtype`` (uint16: bf16 bits), the slots of each sequence's last ``q_len`` positions (sequence 1's
    first row a padding slot), new rows in the pools' dtype, and queries."""
    rng, _, kt, v, tables, lens, h = _case(seed, lengths)
    if pool_dtype == jnp.uint16:
        kt, v = (jax.lax.bitcast_convert_type(x.astype(jnp.bfloat16), jnp.uint16) for x in (kt, v))
    b, t = len(lengths), len(lengths) * q_len
    pos = np.asarray(lengths)[:, None] - q_len + np.arange(q_len)
    slots = np.asarray(tables)[np.arange(b)[:, None], pos // 16] * 16 + pos % 16
    slots[1, 0] = -1
    rows = [jnp.asarray(rng.standard_normal((t, 3, 64)), jnp.float32) for _ in range(2)]
    if pool_dtype == jnp.uint16:
        rows = [jax.lax.bitcast_convert_type(r.astype(jnp.bfloat16), jnp.uint16) for r in rows]
    q = jnp.asarray(rng.standard_normal((t, h, 64)), jnp.bfloat16 if pool_dtype == jnp.uint16 else jnp.float32)
    cu = jnp.arange(b + 1, dtype=jnp.int32) * q_len
    return q, rows, jnp.asarray(slots.reshape(-1), jnp.int32), kt, v, tables, lens, cu


@needs_kernels
@pytest.mark.parametrize("pool_dtype", [jnp.float32, jnp.uint16])
@pytest.mark.parametrize("q_len", [1, 4, 8])
def test_writing_variant_gives_the_scatter_then_the_read_in_place(q_len, pool_dtype):
    """``paged_attention_write_cpu`` = ``KVLayer.write`` (XLA's scatter) then the read: the same pools and output bit
    for bit, for decode and verify-shaped batches with a padding slot; under jit with the pools donated the results
    are the donated buffers (written in place, no copy of a pool in the program)."""
    from jaxserve.cache.kv_pool import KVLayer
    q, (k, v_rows), slots, kt, v, tables, lens, cu = _write_case(10, [40, 17, 130, 8], q_len, pool_dtype)
    widen = (lambda x: jax.lax.bitcast_convert_type(x, jnp.bfloat16)) if pool_dtype == jnp.uint16 else (lambda x: x)
    want_layer = KVLayer(kt, v, True).write(widen(k), widen(v_rows), slots)
    want = ca.ragged_paged_attention_cpu(q, want_layer.k, want_layer.v, tables, lens, cu)
    fused = jax.jit(ca.paged_attention_write_cpu, donate_argnums=(4, 5))
    compiled = fused.lower(q, k, v_rows, slots, kt, v, tables, lens, cu).compile().as_text()
    assert not [line for line in compiled.splitlines() if " copy(" in line and f"[{kt.shape[0]}," in line]
    pointers = kt.unsafe_buffer_pointer(), v.unsafe_buffer_pointer()
    got, got_k, got_v = fused(q, k, v_rows, slots, kt, v, tables, lens, cu)
    assert (got_k.unsafe_buffer_pointer(), got_v.unsafe_buffer_pointer()) == pointers
    np.testing.assert_array_equal(got_k, want_layer.k)
    np.testing.assert_array_equal(got_v, want_layer.v)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


@needs_kernels
def test_writing_variant_skips_slots_outside_the_pool_and_refuses_long_sequences():
    q, (k, v_rows), slots, kt, v, tables, lens, cu = _write_case(11, [40, 17], 1, jnp.float32)
    outside = jnp.asarray([kt.shape[0] * 16, 2**31 - 1], jnp.int32)  # one past the pool, far past it
    _, got_k, got_v = ca.paged_attention_write_cpu(q, k, v_rows, outside, kt, v, tables, lens, cu)
    np.testing.assert_array_equal(got_k, kt)
    np.testing.assert_array_equal(got_v, v)
    q9, (k9, v9), slots9, kt9, v_9, tables9, lens9, cu9 = _write_case(12, [40, 17], 9, jnp.float32)
    with pytest.raises(Exception, match="more than 8 rows"):
        jax.block_until_ready(ca.paged_attention_write_cpu(q9, k9, v9, slots9, kt9, v_9, tables9, lens9, cu9))
    with pytest.raises(ValueError, match="all be float32 or all uint16"):
        ca.paged_attention_write_cpu(q, k.astype(jnp.bfloat16), v_rows, slots, kt, v, tables, lens, cu)
    with pytest.raises(ValueError, match=r"want k, v \[2, 3, 64\] and slots \[2\]"):
        ca.paged_attention_write_cpu(q, k[:1], v_rows, slots, kt, v, tables, lens, cu)


@needs_kernels
def test_xla_backend_writes_in_the_kernel_for_decode_and_verify_batches_only(monkeypatch):
    """``XlaAttention.write_and_read`` takes the writing variant where each sequence has at most ``ROWS_PER_ITEM`` new
    rows (decode, uniform rounds) and leaves the rest (ragged, fresh prompts, longer rounds, the kernel off) to the
    scatter and the read (None)."""
    from jaxserve.cache.kv_pool import KVLayer
    from jaxserve.models.attention import AttentionMetadata
    xla = attention_backend("xla")
    q, (k, v_rows), slots, kt, v, tables, lens, cu = _write_case(13, [40, 17], 1, jnp.uint16)
    layer, rows = KVLayer(kt, v, True), jnp.zeros((2, 3, 64), jnp.bfloat16)

    def fused(meta, q=q, rows=rows):
        return xla.write_and_read(q, rows, rows, layer, meta)
    meta = AttentionMetadata(slots, tables, lens, cu, decode_only=True, uniform_q_len=1)
    assert fused(meta) is not None
    assert fused(meta.replace(decode_only=False, uniform_q_len=None)) is None  # ragged
    assert fused(meta.replace(decode_only=False, fresh=True)) is None
    long_q, long_rows = jnp.zeros((18, 9, 64), jnp.bfloat16), jnp.zeros((18, 3, 64), jnp.bfloat16)
    assert fused(meta.replace(decode_only=False, uniform_q_len=9), long_q, long_rows) is None
    monkeypatch.setenv(ca.ENV_SWITCH, "off")
    assert fused(meta) is None
