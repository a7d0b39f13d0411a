"""float32 Dense kernels packed once (``jaxserve.kernels.cpu.packed_f32``): the layout against the [K, N] weight, the
GEMM against a float32 FMA chain over k bit for bit, its row invariance, the Dense layer that reads a packed kernel,
and a float32 engine that packs them (``EngineConfig.weight_layout``). The layout tests run anywhere; the rest
wherever the CPU kernels load."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve import LLM, SamplingParams
from jaxserve.kernels.cpu import matmul as cpu
from jaxserve.kernels.cpu.packed import pack_dense_kernels, pack_tied_head
from jaxserve.models import get_preset, init_params
from jaxserve.kernels.cpu.packed_f32 import GROUP, PackedF32, f32_gemm_packed, pack_f32
from jaxserve.layers import dense
from tests.kernels.test_cpu_kernels_in_models import _assert_greedy_agrees

needs_kernels = pytest.mark.skipif(not cpu.usable(), reason="the CPU kernels are unavailable")


def _f32(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def fma_chain_reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x f32[M, K] @ w f32[K, N] as the kernel sums: from 0, acc = fma(x[m, k], w[k, n], acc) for k in order. The
    product is exact in float64, and so is its sum with a float32 acc where w has bf16's 8 significant bits (a
    32-bit product; checked), so rounding that to float32 is the FMA's one rounding. (The product itself is not a
    float32: an unfused multiply and add would round twice.)"""
    acc = np.zeros((x.shape[0], w.shape[1]), np.float32)
    for k in range(x.shape[1]):
        exact = x[:, k:k + 1].astype(np.float64) * w[k].astype(np.float64) + acc.astype(np.float64)
        assert ((exact - acc) == x[:, k:k + 1].astype(np.float64) * w[k]).all()  # the float64 sum was exact
        acc = exact.astype(np.float32)
    return acc


@pytest.mark.parametrize("k, n", [(576, 192), (33, 100), (1, 1), (64, 32)])
def test_pack_layout_puts_each_weight_where_the_kernel_reads_it(k, n):
    w = _f32((k, n), k + n)
    p = pack_f32(w)
    g = -(-n // GROUP)
    assert p.shape == (k, n) and p.data.shape == (g, k * GROUP)
    data = np.asarray(p.data).reshape(g, k, GROUP)
    for kk, nn in [(0, 0), (k - 1, n - 1), (k // 2, n // 3)]:
        assert data[nn // GROUP, kk, nn % GROUP] == w[kk, nn]
    assert (data.reshape(g, k * GROUP)[-1].reshape(k, GROUP)[:, n - (g - 1) * GROUP:] == 0).all()  # padded columns
    np.testing.assert_array_equal(np.asarray(p.unpack()), w)


def test_columns_read_the_weights_columns_as_rows():
    """A packed tied embedding's lookup (``pack_tied_head``): column n of the [K, N] weight, bit for bit."""
    w = _f32((40, 70), 3)
    ids = jnp.asarray([[0, 69, 33], [31, 32, 64]])
    got = jax.jit(lambda p, i: p.columns(i))(pack_f32(w), ids)
    np.testing.assert_array_equal(np.asarray(got), w.T[np.asarray(ids)])


def test_pack_f32_refuses_other_weights():
    with pytest.raises(ValueError, match=r"pack_f32: w must be float32 \[K, N\], got bfloat16\(4, 4\)"):
        pack_f32(jnp.ones((4, 4), jnp.bfloat16))


@needs_kernels
@pytest.mark.parametrize("m, k, n", [(1, 64, 40), (12, 40, 64), (13, 33, 70), (30, 48, 33), (64, 20, 96), (3, 0, 5)])
@pytest.mark.parametrize("threads", [1, 2])
def test_packed_f32_gemm_is_an_fma_chain_over_k(m, k, n, threads):
    """Bit for bit the FMA chain, at row counts inside, at and past the 12-row blocks, N inside and past 32."""
    x, w = _f32((m, k), m), np.asarray(jnp.asarray(_f32((k, n), n), jnp.bfloat16), np.float32)
    got = np.asarray(f32_gemm_packed(jnp.asarray(x), pack_f32(w), threads=threads))
    np.testing.assert_array_equal(got, fma_chain_reference(x, w))


@needs_kernels
def test_packed_f32_rows_do_not_depend_on_the_batch_or_threads():
    """SmolLM2's gate/up shape: a row alone, in a block of 9 and in a batch of 64 over 1 or 2 threads: the same bits;
    the sums XLA's dot gives to float32 rounding."""
    x, w = _f32((64, 576), 1), _f32((576, 3072), 2)
    p = pack_f32(w)
    full = np.asarray(f32_gemm_packed(jnp.asarray(x), p, threads=2))
    np.testing.assert_allclose(full, x.astype(np.float64) @ w.astype(np.float64), rtol=1e-5, atol=2e-4)
    for rows, threads in [(slice(63, 64), 1), (slice(5, 14), 2), (slice(0, 64), 1)]:
        np.testing.assert_array_equal(np.asarray(f32_gemm_packed(jnp.asarray(x[rows]), p, threads=threads)),
                                      full[rows])


@needs_kernels
def test_packed_f32_gemm_checks_x_and_has_xlas_gradient():
    p = pack_f32(_f32((16, 8), 0))
    with pytest.raises(ValueError, match=r"x must be float32 \[M, 16\] for a \[16, 8\] weight, got bfloat16\(2, 16\)"):
        f32_gemm_packed(jnp.ones((2, 16), jnp.bfloat16), p)
    x = jnp.asarray(_f32((3, 16), 1))
    loss = lambda x, w: jnp.sum(jnp.sin(f32_gemm_packed(x, w)))  # noqa: E731
    gx, gw = jax.grad(loss, argnums=(0, 1))(x, p)
    want_x, want_w = jax.grad(lambda x, w: jnp.sum(jnp.sin(x @ w)), argnums=(0, 1))(x, p.unpack())
    np.testing.assert_allclose(np.asarray(gx), np.asarray(want_x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(pack_f32(want_w).data), np.asarray(gw.data), rtol=1e-5, atol=1e-5)


@needs_kernels
@pytest.mark.parametrize("bias", [False, True])
def test_dense_layer_with_a_packed_f32_kernel(bias):
    """``jaxserve.layers.dense`` in float32 reads a packed kernel: XLA's dot to float32 rounding, and a row's bits
    the same alone and in the batch."""
    layer = dense(48, jnp.float32, "proj", bias=bias)
    x = jnp.asarray(_f32((2, 12, 64), 4))
    params = layer.init(jax.random.key(0), x)
    if bias:
        params = jax.tree.map(lambda a: a + 0.5 if a.ndim == 1 else a, params)
    packed = pack_dense_kernels(params, dtype=jnp.float32)
    assert isinstance(packed["params"]["kernel"], PackedF32)
    got, want = jax.jit(layer.apply)(packed, x), jax.jit(layer.apply)(params, x)
    assert got.dtype == jnp.float32 and got.shape == (2, 12, 48)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(jax.jit(layer.apply)(packed, x[1:, 3:4])), np.asarray(got[1:, 3:4]))
    with pytest.raises(ValueError, match=r"kernel PackedF32 of shape \(64, 48\) does not fit float32 inputs "
                                         r"\(2, 32\) -> 48 of a float32 layer"):
        layer.apply(packed, jnp.ones((2, 32), jnp.float32))


@needs_kernels
def test_float32_engine_packs_its_kernels_and_a_request_gets_its_bits_alone_or_in_a_batch():
    """A float32 zoo model: the engine packs every Dense kernel as ``PackedF32`` (``weight_layout="auto"``; "as_stored"
    keeps the arrays, whose 1-row, 2-16-row and larger matmuls each sum in an order of their own), greedy tokens and
    log-probs agree with the stored layout's; and packed, a request decodes alone with the bits it gets beside two
    others (every Dense layer row-invariant; the tiny model's head is untied)."""
    prompts = ["def add(a, b):", "class Stack:\n    def push(self, x):", "import numpy as np\n"]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=True, top_logprobs=3)
    outs = {}
    for layout in ("auto", "as_stored"):
        llm = LLM("jaxserve/tiny-code", dtype="float32", max_num_seqs=4, weight_layout=layout)
        kernels = [leaf for path, leaf in jax.tree_util.tree_flatten_with_path(
            llm.engine.runner.params, is_leaf=lambda a: isinstance(a, PackedF32))[0]
            if getattr(path[-1], "key", None) == "kernel"]
        assert kernels and all(isinstance(k, PackedF32) == (layout == "auto") for k in kernels)
        outs[layout] = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
        if layout == "auto":
            alone = llm.generate(prompts[1:2], params, use_tqdm=False)[0].outputs[0]
    _assert_greedy_agrees(outs["auto"], outs["as_stored"])
    batched = outs["auto"][1]
    assert alone.token_ids == batched.token_ids
    assert alone.logprobs == batched.logprobs


@needs_kernels
def test_float32_tied_head_is_packed_once_and_a_request_gets_its_logits_bits_alone_or_in_a_batch():
    """A tied float32 model: the engine packs its embedding as the LM head (``pack_tied_head``: ``tied_head`` in place
    of ``embed``, one copy), its lookups and logits agree with the stored layout's, and a request decodes alone with
    the log-prob bits it gets beside 17 others: the head, too, is row-invariant (OpenBLAS's sgemm, which served the
    stored head from 17 rows, sums in an order of its own: there the log-probs differed in their last bits)."""
    config = get_preset("tiny-qwen3").replace(vocab_size=301, max_position_embeddings=128, dtype="float32")
    assert config.tie_word_embeddings
    params = init_params(config, jax.random.key(3))
    packed = pack_tied_head(pack_dense_kernels(params, dtype=jnp.float32), jnp.float32)
    assert "embed" not in packed and isinstance(packed["tied_head"]["kernel"], PackedF32)
    np.testing.assert_array_equal(np.asarray(packed["tied_head"]["kernel"].unpack()),
                                  np.asarray(params["embed"]["embedding"]).T)
    assert pack_tied_head(params, jnp.bfloat16) is params  # a float32 embedding is packed only as float32
    prompts = [np.random.default_rng(s).integers(0, 300, 3 + s % 7).tolist() for s in range(18)]
    sampling = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=True, top_logprobs=3)
    engine = dict(block_size=4, max_num_seqs=18, max_num_batched_tokens=256)
    outs = {}
    for layout in ("auto", "as_stored"):
        llm = LLM.from_params(config, params, weight_layout=layout, **engine)
        assert ("tied_head" in llm.engine.runner.params) == (layout == "auto")
        outs[layout] = [o.outputs[0] for o in llm.generate(prompts, sampling, use_tqdm=False)]
        if layout == "auto":
            alone = llm.generate(prompts[1:2], sampling, use_tqdm=False)[0].outputs[0]
    _assert_greedy_agrees(outs["auto"], outs["as_stored"])
    assert (alone.token_ids, alone.logprobs) == (outs["auto"][1].token_ids, outs["auto"][1].logprobs)
