"""bf16 Dense kernels packed once for AMX tiles (``jaxserve.kernels.cpu.packed``): the layout against the [K, N]
weight, the packed GEMM against ``bf16_gemm`` (AMX) and a float32 loop over k (FMA) bit for bit, its row invariance,
its epilogues, the Dense layer that reads a packed kernel, and the engine that packs them
(``EngineConfig.weight_layout``).

The layout tests run anywhere; the GEMM and engine tests wherever the kernels load, the kernel-level ones on each
implementation the CPU has (``impl``: "fma" everywhere, "amx" with AMX-BF16 tiles), the ones against ``bf16_gemm`` on
AMX only. (The guard-page harness, ``cpu_amx_guard_pages.cc``, runs both at every ragged edge: test_cpu_amx.py.)
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve import LLM, SamplingParams
from jaxserve.config import EngineConfig
from jaxserve.kernels.cpu import matmul as cpu
from jaxserve.kernels.cpu import packed
from jaxserve.kernels.cpu.packed import (PackedBf16, bf16_gemm_packed, fma_reference, gated_reference, normed_reference,
                                         pack_bf16, pack_dense_kernels, pack_tied_head, packed_argmax)
from jaxserve.activations import ACTIVATIONS
from jaxserve.layers import dense
from jaxserve.models import forward_full, get_preset, init_params
from tests.kernels.test_cpu_kernels_in_models import _assert_greedy_agrees

needs_amx = pytest.mark.skipif(not cpu.amx_usable(), reason="no AMX-BF16 tiles on this CPU (or the kernels)")
needs_packed = pytest.mark.skipif(cpu.packed_impl() is None, reason="the CPU kernels are unavailable")
IMPLS = [impl for impl, here in (("fma", cpu.usable()), ("amx", cpu.amx_usable())) if here]


@pytest.fixture(params=IMPLS or [None])
def impl(request, monkeypatch):
    """Each packed GEMM implementation this CPU has, made the default (``packed_impl``) for the test."""
    if request.param is None:
        pytest.skip("the CPU kernels are unavailable")
    monkeypatch.setattr(packed, "packed_impl", lambda: request.param)
    return request.param


def _weight(k, n, seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal((k, n)), jnp.bfloat16)


@pytest.mark.parametrize("k, n", [(576, 192), (33, 100), (1, 1), (64, 32)])
def test_pack_layout_puts_each_weight_where_the_tiles_read_it(k, n):
    """data[g, kb * 1024 + t * 512 + p * 32 + j * 2 + parity] = w[32 kb + 2 p + parity, 32 g + 16 t + j]; zeros
    past K and N; unpack gives w back bit for bit."""
    w = _weight(k, n)
    packed = pack_bf16(w)
    kp, g = -(-k // 32) * 32, -(-n // 32)
    assert packed.shape == (k, n) and packed.data.shape == (g, kp * 32) and packed.data.dtype == jnp.bfloat16
    data, wn = np.asarray(packed.data, np.float32), np.asarray(w, np.float32)
    rng = np.random.default_rng(1)
    for gi, i in zip(rng.integers(0, g, 200), rng.integers(0, kp * 32, 200)):
        kb, t, p, j, parity = i // 1024, i // 512 % 2, i // 32 % 16, i // 2 % 16, i % 2
        kk, nn = 32 * kb + 2 * p + parity, 32 * gi + 16 * t + j
        assert data[gi, i] == (wn[kk, nn] if kk < k and nn < n else 0.0)
    np.testing.assert_array_equal(np.asarray(packed.unpack(), np.float32), wn)


@pytest.mark.parametrize("k, n", [(576, 100), (33, 70), (64, 32)])
def test_packed_columns_are_the_weights_columns(k, n):
    """columns(ids) = w[:, ids].T bit for bit, for ids of any shape (a packed tied embedding's lookup)."""
    w = _weight(k, n)
    ids = jnp.asarray(np.random.default_rng(2).integers(0, n, (3, 5)), jnp.int32).at[0, 0].set(n - 1)
    got = jax.jit(lambda p, i: p.columns(i))(pack_bf16(w), ids)
    assert got.shape == (3, 5, k) and got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(w, np.float32).T[np.asarray(ids)])


def test_pack_tied_head_replaces_a_bf16_embedding_only():
    e = _weight(40, 16)  # [V, E]
    out = pack_tied_head({"embed": {"embedding": e}, "final_norm": {"scale": jnp.ones(16)}})
    assert set(out) == {"tied_head", "final_norm"} and out["tied_head"]["kernel"].shape == (16, 40)
    np.testing.assert_array_equal(np.asarray(out["tied_head"]["kernel"].unpack(), np.float32),
                                  np.asarray(e, np.float32).T)
    f32 = {"embed": {"embedding": e.astype(jnp.float32)}}
    assert pack_tied_head(f32) is f32 and pack_tied_head({"lm_head": {}}) == {"lm_head": {}}


@needs_packed
@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3"])
def test_packed_tied_head_gives_the_bits_of_the_embedding(preset):
    """A bf16 tied model with its embedding packed as the LM head: the lookups are the embedding's rows and the
    logits the stored embedding's head's, bit for bit (both sum exact products in float32 in one k order, then
    round to bf16)."""
    config = get_preset(preset).replace(dtype="bfloat16", tie_word_embeddings=True)
    params = pack_dense_kernels(init_params(config, jax.random.key(0)))
    tokens = jax.random.randint(jax.random.key(1), (2, 11), 0, config.vocab_size)
    run = jax.jit(forward_full, static_argnums=1)
    packed = pack_tied_head(params)
    assert "tied_head" in packed and "embed" not in packed
    np.testing.assert_array_equal(np.asarray(run(packed, config, tokens), np.float32),
                                  np.asarray(run(params, config, tokens), np.float32))


def test_pack_dense_kernels_packs_only_2d_bf16_kernels():
    params = {"q_proj": {"kernel": _weight(64, 32), "bias": jnp.zeros(32, jnp.bfloat16)},
              "norm": {"scale": jnp.ones(64, jnp.bfloat16)},
              "f32": {"kernel": jnp.ones((64, 32), jnp.float32)},
              "experts": {"kernel": jnp.ones((4, 64, 32), jnp.bfloat16)}}
    out = pack_dense_kernels(params)
    assert isinstance(out["q_proj"]["kernel"], PackedBf16)
    for path in (("q_proj", "bias"), ("norm", "scale"), ("f32", "kernel"), ("experts", "kernel")):
        assert out[path[0]][path[1]] is params[path[0]][path[1]]


def test_pack_dense_kernels_fuses_the_projections_of_one_input():
    """q/k/v and gate/up (with their biases) become one layer each, columns side by side; a group with a part
    missing, not bf16, or with a bias on some parts only stays as it was. fuse=False keeps every layer."""
    w = {name: _weight(64, n, i) for i, (name, n) in enumerate((("q_proj", 32), ("k_proj", 16), ("v_proj", 16),
                                                               ("o_proj", 64), ("gate_proj", 48), ("up_proj", 48)))}
    bias = {name: jnp.full(w[name].shape[1], i, jnp.bfloat16) for i, name in enumerate(("q_proj", "k_proj", "v_proj"))}
    params = {"attn": {n: {"kernel": w[n], "bias": bias[n]} for n in ("q_proj", "k_proj", "v_proj")}
              | {"o_proj": {"kernel": w["o_proj"]}},
              "mlp": {n: {"kernel": w[n]} for n in ("gate_proj", "up_proj")},
              "half_biased": {"gate_proj": {"kernel": w["gate_proj"], "bias": bias["q_proj"][:48]},
                              "up_proj": {"kernel": w["up_proj"]}},
              "f32": {"gate_proj": {"kernel": w["gate_proj"].astype(jnp.float32)}, "up_proj": {"kernel": w["up_proj"]}}}
    out = pack_dense_kernels(params)
    assert set(out["attn"]) == {"qkv_proj", "o_proj"} and set(out["mlp"]) == {"gate_up_proj"}
    qkv = out["attn"]["qkv_proj"]
    np.testing.assert_array_equal(np.asarray(qkv["kernel"].unpack(), np.float32),
                                  np.concatenate([np.asarray(w[n], np.float32) for n in ("q_proj", "k_proj", "v_proj")], 1))
    np.testing.assert_array_equal(np.asarray(qkv["bias"], np.float32), np.repeat([0, 1, 2], [32, 16, 16]))
    assert out["mlp"]["gate_up_proj"]["kernel"].shape == (64, 96)
    assert set(out["half_biased"]) == {"gate_proj", "up_proj"} and set(out["f32"]) == {"gate_proj", "up_proj"}
    assert set(pack_dense_kernels(params, fuse=False)["attn"]) == {"q_proj", "k_proj", "v_proj", "o_proj"}


@needs_packed
@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3"])
@pytest.mark.parametrize("intermediate, gated", [(176, False), (96, True)])
def test_fused_projections_give_the_bits_of_separate_ones(preset, intermediate, gated):
    """A bf16 model forward with q/k/v and gate/up fused (one packed GEMM each) against the same packed layers
    called one by one: every column sums the same k blocks in the same order, so the logits are equal bit for bit.
    (tiny-qwen3: q/k norms after the split.) With the halves on whole 32-column groups (intermediate 96) the fused
    GEMM also applies SiLU(gate) * up in its epilogue, and still gives the unfused graph's bits."""
    config = get_preset(preset).replace(dtype="bfloat16", intermediate_size=intermediate)
    params = init_params(config, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 11), 0, config.vocab_size)
    fused, separate = pack_dense_kernels(params), pack_dense_kernels(params, fuse=False)
    assert "qkv_proj" in fused["layers_0"]["attn"] and "gate_up_proj" in fused["layers_0"]["mlp"]
    run = jax.jit(forward_full, static_argnums=1)
    assert ("epilogue = 2" in run.lower(fused, config, tokens).as_text()) == gated
    np.testing.assert_array_equal(np.asarray(run(fused, config, tokens), np.float32),
                                  np.asarray(run(separate, config, tokens), np.float32))


@needs_amx
@pytest.mark.parametrize("m, k, n", [(1, 576, 576), (9, 576, 192), (64, 576, 1536), (37, 1536, 576), (5, 50, 70),
                                     (33, 64, 33), (16, 1, 17)])
@pytest.mark.parametrize("threads", [1, 2])
def test_packed_gemm_gives_the_bits_of_bf16_gemm(m, k, n, threads):
    """The same tile ops in the same k order as the per-call packing GEMM, whatever the blocking."""
    rng = np.random.default_rng(m + k + n)
    x, w = jnp.asarray(rng.standard_normal((m, k)), jnp.float32), _weight(k, n, m)
    got = jax.jit(lambda x, p: bf16_gemm_packed(x, p, threads=threads))(x, pack_bf16(w))
    assert got.shape == (m, n) and got.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(got), np.asarray(cpu.bf16_gemm(x, w, threads=threads)))


@needs_packed
@pytest.mark.parametrize("m, k, n", [(1, 576, 576), (9, 576, 192), (64, 576, 1536), (37, 1536, 576), (5, 50, 70),
                                     (13, 64, 33), (16, 1, 17), (3, 0, 40)])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("x_dtype", [jnp.float32, jnp.bfloat16])
def test_fma_gemm_is_a_float32_loop_over_k(m, k, n, threads, x_dtype):
    """impl="fma": every output the float32 sum over k in order of exact products (``fma_reference``), bit for bit,
    at row counts inside, at and past its row blocks (12 rows with AVX-512), K past whole 32-k blocks, N past
    32-column groups."""
    rng = np.random.default_rng(m + k + n)
    x, w = jnp.asarray(rng.standard_normal((m, k)), x_dtype), _weight(k, n, m)
    got = jax.jit(lambda x, p: bf16_gemm_packed(x, p, threads=threads, impl="fma"))(x, pack_bf16(w))
    assert got.shape == (m, n) and got.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(got), fma_reference(x, w))


@needs_amx
def test_fma_and_amx_gemms_agree_to_float32_rounding():
    """The two implementations sum the same exact products in different orders: within K roundings of 2^-24 of the
    sum of |products|, and not bit for bit."""
    rng = np.random.default_rng(8)
    x, w = jnp.asarray(rng.standard_normal((64, 576)), jnp.float32), _weight(576, 960)
    amx, fma = (np.asarray(bf16_gemm_packed(x, pack_bf16(w), impl=impl), np.float64) for impl in ("amx", "fma"))
    magnitude = np.abs(np.asarray(x.astype(jnp.bfloat16), np.float64)) @ np.abs(np.asarray(w, np.float64))
    assert np.all(np.abs(amx - fma) <= 2 * 576 * 2.0 ** -24 * magnitude)
    assert not np.array_equal(amx, fma)


@needs_packed
def test_packed_gemm_refuses_an_unknown_or_missing_impl():
    p = pack_bf16(_weight(64, 32))
    with pytest.raises(ValueError, match=r"bf16_gemm_packed: impl must be 'amx' or 'fma', got 'tiles'"):
        bf16_gemm_packed(jnp.ones((3, 64)), p, impl="tiles")
    with pytest.raises(ValueError, match=r"packed_argmax: impl must be 'amx' or 'fma', got 'avx'"):
        packed_argmax(jnp.ones((3, 64)), p, impl="avx")
    if cpu.amx_granted():
        assert bf16_gemm_packed(jnp.ones((3, 64)), p, impl="amx").shape == (3, 32)
    else:
        with pytest.raises(RuntimeError, match=r"bf16_gemm_packed: AMX tiles are unavailable .* impl='fma' runs"):
            bf16_gemm_packed(jnp.ones((3, 64)), p, impl="amx")


@needs_packed
def test_packed_gemm_rows_do_not_depend_on_the_batch_or_threads(impl):
    """A row gives the same bits alone (16-row blocks of one row), in a block of 9, past 32-row pairs, on 1 or 2
    threads: decode rows and verify rows of one request agree."""
    rng = np.random.default_rng(3)
    x, p = jnp.asarray(rng.standard_normal((64, 576)), jnp.float32), pack_bf16(_weight(576, 700))
    full = np.asarray(bf16_gemm_packed(x, p, threads=2))
    for rows, threads in ((1, 1), (1, 2), (9, 2), (17, 1), (40, 2)):
        np.testing.assert_array_equal(np.asarray(bf16_gemm_packed(x[-rows:], p, threads=threads)), full[-rows:])


@needs_packed
@pytest.mark.parametrize("m, k, n", [(1, 576, 192), (17, 576, 100), (64, 1536, 576), (5, 50, 70)])
@pytest.mark.parametrize("threads", [1, 2])
def test_packed_gemm_bf16_output_and_input_give_the_float32_results_bits(impl, m, k, n, threads):
    """out_dtype=bfloat16 rounds the sums in the kernel as XLA's convert rounds the float32 result; a bf16 x gives
    the bits of the same values in float32 (the kernel rounds x to bf16 either way)."""
    rng = np.random.default_rng(m + n)
    x, p = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16), pack_bf16(_weight(k, n, m))
    want = bf16_gemm_packed(x.astype(jnp.float32), p, threads=threads)
    got16 = jax.jit(lambda x, p: bf16_gemm_packed(x, p, threads=threads, out_dtype=jnp.bfloat16))(x, p)
    got32 = jax.jit(lambda x, p: bf16_gemm_packed(x, p, threads=threads))(x, p)
    assert got16.dtype == jnp.bfloat16 and got16.shape == (m, n)
    np.testing.assert_array_equal(np.asarray(got32), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(got16, np.float32), np.asarray(want.astype(jnp.bfloat16), np.float32))


@needs_packed
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("m, k, i", [(1, 576, 64), (9, 64, 96), (17, 100, 32), (40, 576, 128), (64, 576, 1536)])
@pytest.mark.parametrize("threads", [1, 2])
def test_gated_epilogue_gives_the_bits_of_the_unfused_graph(impl, activation, m, k, i, threads):
    """bf16_gemm_packed(activation=...) on [gate | up] = act(gate) * up of two bf16 GEMMs in one jitted graph (XLA
    rounding every op of it to bf16), bit for bit, at every row count; a row's bits do not depend on the others."""
    rng = np.random.default_rng(m + i)
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    gate, up = _weight(k, i, 1) * 0.3, _weight(k, i, 2)
    fused, pg, pu = pack_bf16(jnp.concatenate([gate, up], 1)), pack_bf16(gate), pack_bf16(up)
    gemm = lambda x, p: bf16_gemm_packed(x, p, threads=threads, out_dtype=jnp.bfloat16)  # noqa: E731
    want = jax.jit(lambda x: ACTIVATIONS[activation](gemm(x, pg)) * gemm(x, pu))(x)
    got = jax.jit(lambda x: bf16_gemm_packed(x, fused, threads=threads, activation=activation))(x)
    assert got.dtype == jnp.bfloat16 and got.shape == (m, i)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    alone = bf16_gemm_packed(x[-1:], fused, threads=threads, activation=activation)
    np.testing.assert_array_equal(np.asarray(alone, np.float32), np.asarray(got[-1:], np.float32))


@needs_packed
def test_gated_epilogue_grad_in_x_is_the_unfused_graphs():
    x = jnp.asarray(np.random.default_rng(5).standard_normal((3, 64)), jnp.float32)
    w = _weight(64, 64)
    unfused = lambda x: gated_reference(x @ PackedBf16.unpack(pack_bf16(w)).astype(jnp.float32), "silu")  # noqa: E731
    got = jax.grad(lambda x: bf16_gemm_packed(x, pack_bf16(w), activation="silu").astype(jnp.float32).sum())(x)
    want = jax.grad(lambda x: unfused(x).astype(jnp.float32).sum())(x)
    np.testing.assert_allclose(got, want, rtol=1e-6)


@needs_packed
def test_packed_gemm_refuses_a_bad_epilogue():
    p = pack_bf16(_weight(64, 96))
    with pytest.raises(ValueError, match=r"bf16_gemm_packed: out_dtype must be float32 or bfloat16, got float16"):
        bf16_gemm_packed(jnp.ones((3, 64)), p, out_dtype=jnp.float16)
    with pytest.raises(ValueError, match=r"bf16_gemm_packed: activation must be one of \['gelu_tanh', 'silu'\], "
                                         r"got 'relu'"):
        bf16_gemm_packed(jnp.ones((3, 64)), pack_bf16(_weight(64, 128)), activation="relu")
    with pytest.raises(ValueError, match=r"a gated weight's N must be 2 I with I a multiple of 32, got N=96"):
        bf16_gemm_packed(jnp.ones((3, 64)), p, activation="silu")


@needs_packed
def test_packed_gemm_grad_in_x():
    x, w = jnp.ones((3, 64)), _weight(64, 48)
    g = jax.grad(lambda x: bf16_gemm_packed(x, pack_bf16(w)).sum())(x)
    np.testing.assert_allclose(g, np.broadcast_to(np.asarray(w, np.float32).sum(1), x.shape), rtol=1e-6)


@needs_packed
def test_packed_gemm_refuses_a_mismatched_x():
    with pytest.raises(ValueError,
                       match=r"bf16_gemm_packed: x must be \[M, 64\] for a \[64, 48\] weight, got x\(3, 32\)"):
        bf16_gemm_packed(jnp.ones((3, 32)), pack_bf16(_weight(64, 48)))


@needs_amx
@pytest.mark.parametrize("bias", [False, True])
def test_dense_layer_with_a_packed_kernel_gives_the_amx_bits(bias):
    """``jaxserve.layers.dense`` reads a packed kernel: from 8 rows the [K, N] layer runs ``bf16_gemm`` (the
    ``_CPU_AMX_MIN_ROWS`` routing), and the packed one the same bits at every row count."""
    layer = dense(48, jnp.bfloat16, "proj", bias=bias)
    x = jnp.asarray(np.random.default_rng(4).standard_normal((2, 12, 64)), jnp.bfloat16)
    params = layer.init(jax.random.key(0), x)
    if bias:
        params = jax.tree.map(lambda a: a + 0.5 if a.ndim == 1 else a, params)
    packed = pack_dense_kernels(params)
    assert isinstance(packed["params"]["kernel"], PackedBf16)
    got, want = jax.jit(layer.apply)(packed, x), jax.jit(layer.apply)(params, x)  # 24 rows: AMX on both
    assert got.dtype == want.dtype == jnp.bfloat16 and got.shape == (2, 12, 48)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    one = jax.jit(layer.apply)(packed, x[:1, :1])  # one row: the streaming kernel for [K, N], tiles when packed
    np.testing.assert_array_equal(np.asarray(one, np.float32), np.asarray(got[:1, :1], np.float32))


@needs_packed
def test_dense_layer_refuses_a_packed_kernel_of_another_shape():
    layer = dense(48, jnp.bfloat16, "proj")
    params = {"params": {"kernel": pack_bf16(_weight(32, 48))}}
    with pytest.raises(ValueError, match=r"kernel PackedBf16 of shape \(32, 48\) does not fit inputs \(2, 64\) -> 48"):
        layer.apply(params, jnp.ones((2, 64), jnp.bfloat16))


def test_weight_layout_is_checked():
    with pytest.raises(ValueError, match="EngineConfig.weight_layout must be one of .*got 'packed'"):
        EngineConfig(weight_layout="packed")
    with pytest.raises(TypeError, match="EngineConfig.weight_layout must be a str, got 1"):
        EngineConfig(weight_layout=1)


@needs_packed
def test_bf16_engine_packs_its_kernels_and_agrees_with_the_stored_layout():
    """A bf16 zoo model: the engine packs every Dense kernel (``weight_layout="auto"``), ``"as_stored"`` keeps
    [K, N] arrays; greedy tokens agree up to a near-tie (the AMX tiles sum in another order than the streaming
    kernel a 1-row step of the stored layout runs), and so do the log-probs."""
    prompts = ["def add(a, b):", "class Stack:\n    def push(self, x):"]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=True, top_logprobs=3)
    outs = {}
    for layout in ("auto", "as_stored"):
        llm = LLM("jaxserve/tiny-code", dtype="bfloat16", max_num_seqs=4, weight_layout=layout)
        kernels = [leaf for path, leaf in jax.tree_util.tree_flatten_with_path(
            llm.engine.runner.params, is_leaf=lambda a: isinstance(a, PackedBf16))[0]
            if getattr(path[-1], "key", None) == "kernel"]
        assert kernels and all(isinstance(k, PackedBf16) == (layout == "auto") for k in kernels)
        assert "tied_head" not in llm.engine.runner.params  # tiny-code has an LM head of its own
        outs[layout] = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
    _assert_greedy_agrees(outs["auto"], outs["as_stored"])


@needs_packed
@pytest.mark.parametrize("m, k, n", [(64, 576, 4096), (1, 576, 1000), (9, 64, 100), (33, 50, 17), (17, 33, 70)])
@pytest.mark.parametrize("threads", [1, 2])
def test_packed_argmax_is_the_argmax_of_the_bf16_logits(impl, m, k, n, threads):
    """packed_argmax = jnp.argmax of the bf16 GEMM's result, without the [M, N] matrix: the first maximal column,
    also across the threads' column ranges (rows of equal columns: the first one)."""
    rng = np.random.default_rng(m + n)
    x, p = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16), pack_bf16(_weight(k, n, m))
    want = jnp.argmax(bf16_gemm_packed(x, p, threads=threads, out_dtype=jnp.bfloat16).astype(jnp.float32), -1)
    got = jax.jit(lambda x: packed_argmax(x, p, threads=threads))(x)
    assert got.dtype == jnp.int32 and got.shape == (m,)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    tied = pack_bf16(jnp.tile(_weight(k, 3, 7), (1, n // 3 + 1))[:, :n])  # columns repeating every 3
    first = np.asarray(packed_argmax(x, tied, threads=threads))
    assert (first < 3).all()


@needs_packed
def test_bf16_engine_takes_greedy_tokens_from_the_head_gemm(monkeypatch):
    """A bf16 tied model with its head packed: an all-greedy step without log-probs takes its tokens from
    packed_argmax (the step program holds the argmax epilogue), and they are the tokens a step computing the
    logits (asked for log-probs) draws, request by request."""
    from jaxserve.engine import step_programs
    traced = []
    monkeypatch.setattr(step_programs, "packed_argmax", lambda *a: traced.append(1) or packed_argmax(*a))
    jax.clear_caches()  # (the step programs are shared: this test's must be traced with the spy)
    config = get_preset("tiny-llama").replace(dtype="bfloat16", tie_word_embeddings=True)
    llm = LLM.from_params(config, init_params(config, jax.random.key(0)), None, max_num_seqs=4, max_model_len=64)
    assert step_programs.greedy_head(llm.engine.runner.params, config, None) is not None
    prompts = [[1, 5, 9], [2, 7, 30, 41, 8], [3]]
    fast = llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True), use_tqdm=False)
    slow = llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=True),
                        use_tqdm=False)
    assert [o.outputs[0].token_ids for o in fast] == [o.outputs[0].token_ids for o in slow]
    assert traced  # the fast branch is in the step program


@needs_packed
@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3"])
def test_residual_adds_fused_into_the_projections_give_the_bits_of_the_adds(preset, monkeypatch):
    """A packed bf16 model adds the attention and MLP outputs to the residual stream inside the o and down GEMMs
    (``packed_residual``): the logits are those of the same packed model adding them in XLA with each sum rounded to
    bf16 (an optimization barrier: XLA's own graph lets the next norm read the float32 sum, excess precision the
    model's bf16 residual stream does not have), bit for bit."""
    from jaxserve import layers
    from jaxserve.models import transformer
    config = get_preset(preset).replace(dtype="bfloat16", intermediate_size=96)
    params = pack_dense_kernels(init_params(config, jax.random.key(0)))
    tokens = jax.random.randint(jax.random.key(1), (2, 11), 0, config.vocab_size)
    run = lambda: jax.jit(forward_full, static_argnums=1)(params, config, tokens)  # noqa: E731
    assert jax.jit(forward_full, static_argnums=1).lower(params, config, tokens).as_text().count("epilogue = 4") \
        == 2 * config.num_layers
    fused = np.asarray(run(), np.float32)

    def added_in_xla(module, name, x, residual):
        kernel = module.get_variable("params", name)["kernel"]
        y = bf16_gemm_packed(x.reshape(-1, x.shape[-1]), kernel, out_dtype=jnp.bfloat16).reshape(residual.shape)
        return jax.lax.optimization_barrier(residual + y)

    monkeypatch.setattr(transformer, "packed_residual", added_in_xla)
    monkeypatch.setattr(layers, "packed_residual", added_in_xla)
    jax.clear_caches()
    assert "epilogue = 4" not in jax.jit(forward_full, static_argnums=1).lower(params, config, tokens).as_text()
    np.testing.assert_array_equal(fused, np.asarray(run(), np.float32))


@needs_packed
def test_packed_gemm_refuses_a_bad_residual():
    p = pack_bf16(_weight(64, 96))
    with pytest.raises(ValueError, match=r"a residual must be bf16\[3, 96\] with out_dtype=bfloat16 and no activation, "
                                         r"got float32\(3, 96\)"):
        bf16_gemm_packed(jnp.ones((3, 64)), p, out_dtype=jnp.bfloat16, residual=jnp.ones((3, 96)))


# (m, k, n, epilogue): every epilogue at 1, 5, 64 and 100 rows; a gated weight's N is 2 I with I a multiple of 32
NORM_CASES = [(m, k, n, e) for m, k, n in [(1, 576, 960), (5, 50, 64), (64, 576, 3072), (100, 80, 96)]
              for e in ("f32", "bf16", "residual")] + \
             [(m, k, n, "gated") for m, k, n in [(1, 576, 960), (5, 50, 64), (64, 576, 3072), (100, 80, 128)]]


@needs_packed
@pytest.mark.parametrize("m, k, n, epilogue", NORM_CASES)
@pytest.mark.parametrize("threads", [1, 2])
def test_norm_applied_by_the_gemm_gives_the_bits_of_the_normed_rows(impl, m, k, n, epilogue, threads):
    """``norm=(inv_rms, scale)``: the GEMM of bf16 rows normed as it reads them equals the GEMM of
    ``normed_reference``'s rows (XLA's multiplies, each rounded to bf16), bit for bit, with every epilogue."""
    rng = np.random.default_rng(m + k)
    x = jnp.asarray(rng.standard_normal((m, k)) * 3, jnp.bfloat16)
    inv_rms = jnp.asarray(rng.uniform(0.1, 2.0, m), jnp.float32)
    scale = jnp.asarray(rng.standard_normal(k), jnp.bfloat16)
    p = pack_bf16(_weight(k, n, m) * 0.05)
    kw = {"f32": {}, "bf16": dict(out_dtype=jnp.bfloat16), "gated": dict(activation="silu"),
          "residual": dict(out_dtype=jnp.bfloat16, residual=jnp.asarray(rng.standard_normal((m, n)), jnp.bfloat16))}
    gemm = lambda x, **norm: bf16_gemm_packed(x, p, threads=threads, **kw[epilogue], **norm)  # noqa: E731
    got = jax.jit(lambda x, r, s: gemm(x, norm=(r, s)))(x, inv_rms, scale)
    want = jax.jit(lambda x, r, s: gemm(normed_reference(x, r, s)))(x, inv_rms, scale)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


@needs_packed
def test_norm_applied_by_the_gemm_has_the_gradient_of_the_normed_rows():
    rng = np.random.default_rng(6)
    x = jnp.asarray(rng.standard_normal((3, 64)), jnp.bfloat16)
    r, s, p = jnp.asarray([0.5, 1.0, 2.0], jnp.float32), jnp.asarray(rng.standard_normal(64), jnp.bfloat16), \
        pack_bf16(_weight(64, 32))
    loss = lambda f: lambda r: f(r).astype(jnp.float32).sum()  # noqa: E731
    got = jax.grad(loss(lambda r: bf16_gemm_packed(x, p, norm=(r, s))))(r)
    want = jax.grad(loss(lambda r: bf16_gemm_packed(normed_reference(x, r, s), p)))(r)
    np.testing.assert_allclose(got, want, rtol=1e-6)


@needs_packed
def test_packed_gemm_refuses_a_bad_norm():
    p, r, s = pack_bf16(_weight(64, 32)), jnp.ones(3, jnp.float32), jnp.ones(64, jnp.bfloat16)
    with pytest.raises(ValueError, match=r"a norm needs bf16 x \[M, 64\], inv_rms f32\[M\] and scale bf16\[64\], got "
                                         r"x float32\(3, 64\), inv_rms float32\(3,\), scale bfloat16\(64,\)"):
        bf16_gemm_packed(jnp.ones((3, 64), jnp.float32), p, norm=(r, s))
    with pytest.raises(ValueError, match=r"got x bfloat16\(3, 64\), inv_rms float32\(2,\), scale bfloat16\(64,\)"):
        bf16_gemm_packed(jnp.ones((3, 64), jnp.bfloat16), p, norm=(r[:2], s))


def _normed_gemm_calls(lowered_text: str) -> int:
    """The packed GEMM calls in a lowered program that apply a norm (a non-empty bf16 scale operand)."""
    calls = [line for line in lowered_text.splitlines() if "@jaxserve_bf16_gemm_packed" in line]
    assert calls
    return sum("tensor<0xbf16>" not in line for line in calls)


@needs_packed
@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3"])
def test_norms_applied_by_the_projections_give_the_bits_of_the_norms(preset, monkeypatch):
    """A packed bf16 model hands its input and post-attention norms to the q/k/v and gate/up GEMMs (``NormedRows``):
    the logits are those of the same packed model computing the norms in XLA, bit for bit."""
    from jaxserve.models import transformer
    config = get_preset(preset).replace(dtype="bfloat16", intermediate_size=96)
    params = pack_dense_kernels(init_params(config, jax.random.key(0)))
    tokens = jax.random.randint(jax.random.key(1), (2, 11), 0, config.vocab_size)
    run = lambda: jax.jit(forward_full, static_argnums=1)(params, config, tokens)  # noqa: E731
    lowered = lambda: jax.jit(forward_full, static_argnums=1).lower(params, config, tokens).as_text()  # noqa: E731
    assert _normed_gemm_calls(lowered()) == 2 * config.num_layers
    fused = np.asarray(run(), np.float32)
    monkeypatch.setattr(transformer, "holds_packed", lambda *a: False)
    jax.clear_caches()
    assert _normed_gemm_calls(lowered()) == 0
    np.testing.assert_array_equal(fused, np.asarray(run(), np.float32))
