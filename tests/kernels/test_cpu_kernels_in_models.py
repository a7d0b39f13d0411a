"""Models served with the CPU FFI matmuls give what they give with XLA's dot (``JAXSERVE_CPU_KERNELS=0``), and with
the CPU attention kernel what they give with the XLA loop (``JAXSERVE_CPU_ATTENTION=0``).

The kernel is chosen when a step is traced, so each comparison clears JAX's caches between the two runs.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxserve.kernels.cpu as cpu_pkg
from jaxserve import LLM, SamplingParams
from jaxserve.kernels.cpu import attention as cpu_attention, build, matmul as cpu
from jaxserve.models import forward_full, get_preset, init_params
from jaxserve.models.loading import resolve_model

pytestmark = pytest.mark.skipif(build.unavailable_reason() is not None or build.load() is None,
                                reason=f"CPU kernels unavailable: {build.unavailable_reason()}")


def _run_both(monkeypatch, run, patch_module, name, switch=cpu.ENV_SWITCH):
    """run() with the kernel on (counting traced calls of ``patch_module.name``), then off (``switch`` = 0)."""
    calls = []
    kernel = getattr(patch_module, name)
    monkeypatch.setattr(patch_module, name, lambda *a, **k: calls.append(1) or kernel(*a, **k))
    jax.clear_caches()
    on = run()
    assert calls, f"{name} was never traced with the kernels on"
    monkeypatch.setenv(switch, "0")
    jax.clear_caches()
    n = len(calls)
    off = run()
    assert len(calls) == n, f"{name} was traced with {switch}=0"
    jax.clear_caches()
    return on, off


def _assert_greedy_agrees(on, off, tie=0.05):
    """Greedy outputs with the kernel (``on``) and XLA's dot (``off``) agree token for token, except that from a
    step where XLA's two most likely tokens are within ``tie`` (log-prob) of each other the kernel may have
    picked the other one: bf16 activations round every layer's float32 sums, and the kernel sums in another
    order, so a last-bit flip may break such a (near-)tie the other way. Up to there the log-probs agree."""
    for o_on, o_off in zip(on, off, strict=True):
        for step, (t_on, t_off) in enumerate(zip(o_on.token_ids, o_off.token_ids, strict=True)):
            (best, lp_best), (_, lp_second) = o_off.top_logprobs[step][:2]
            assert t_off == best
            if t_on != t_off:
                assert lp_best - lp_second <= tie, f"step {step}: {t_on} != {t_off}, XLA's margin {lp_best - lp_second}"
                assert t_on in [t for t, lp in o_off.top_logprobs[step] if lp >= lp_best - tie]
                break
            assert abs(o_on.logprobs[step] - o_off.logprobs[step]) <= tie, f"step {step}"


def test_bf16_zoo_model_greedy_tokens_equal_with_and_without_kernel(monkeypatch):
    """The streaming kernel (``bf16_matmul``): the weights as stored and AMX off (by default the engine packs its
    kernels: test_cpu_amx_packed.py)."""
    monkeypatch.setenv(cpu.AMX_SWITCH, "0")
    llm = LLM("jaxserve/tiny-code", dtype="bfloat16", max_num_seqs=4, weight_layout="as_stored")
    prompts = ["def add(a, b):", "class Stack:\n    def push(self, x):"]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=True, top_logprobs=3)

    def run():
        return [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
    on, off = _run_both(monkeypatch, run, cpu_pkg, "bf16_matmul")
    _assert_greedy_agrees(on, off)


@pytest.mark.parametrize("kernel", ["bf16_matmul", "bf16_gemm"])
def test_bf16_tied_head_forward_matches_xla(monkeypatch, kernel):
    """12 rows: the streaming kernel (AMX off), or on a CPU with AMX tiles the AMX GEMM (every Dense layer and the
    head), against XLA's dot."""
    if kernel == "bf16_gemm" and not cpu.amx_usable():
        pytest.skip("no AMX-BF16 tiles on this CPU")
    if kernel == "bf16_matmul":
        monkeypatch.setenv(cpu.AMX_SWITCH, "0")
    config = get_preset("tiny-qwen3").replace(dtype="bfloat16")
    assert config.tie_word_embeddings
    params = init_params(config, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (1, 12), 0, config.vocab_size)
    on, off = _run_both(monkeypatch, lambda: jax.jit(forward_full, static_argnums=1)(params, config, tokens),
                        cpu_pkg, kernel)
    # bf16 activations: each layer rounds its outputs to bf16, so sums in another order may flip a last bit
    np.testing.assert_allclose(np.asarray(on), np.asarray(off), atol=2e-2 * float(jnp.max(jnp.abs(off))))


def test_f32_zoo_model_logits_and_greedy_tokens_equal_with_and_without_kernel(monkeypatch):
    """Float32 (SmolLM2's draft from the zoo: Dense layers and a tied 49152-token head): 2-16 rows go to f32_matmul,
    whose sums differ from XLA's only in their order. A forward pass over 12 tokens (12 rows: the kernel for every
    matmul) gives the same greedy next token at each position and logits equal within float32 rounding. (A forward,
    not ``LLM.generate``: compiling the engine's programs twice would cost ~10 s.)"""
    config, params, _ = resolve_model("jaxserve/smollm2-135m-instruct-draft")
    assert config.dtype == "float32" and config.matmul_dtype is None and config.tie_word_embeddings
    tokens = jax.random.randint(jax.random.key(1), (1, 12), 0, config.vocab_size)
    on, off = _run_both(monkeypatch, lambda: jax.jit(forward_full, static_argnums=1)(params, config, tokens),
                        cpu_pkg, "f32_matmul")
    on, off = np.asarray(on[0]), np.asarray(off[0])
    np.testing.assert_allclose(on, off, rtol=0, atol=1e-5 * np.abs(off).max())
    top2 = np.sort(off, -1)[:, -2:]
    tied = top2[:, 1] - top2[:, 0] <= 1e-4 * np.abs(off).max()  # a near-tie may go either way
    np.testing.assert_array_equal(on.argmax(-1)[~tied], off.argmax(-1)[~tied])


@pytest.mark.parametrize("fmt", ["nvfp4", pytest.param("mxfp4", marks=pytest.mark.slow)])
def test_fp4_engine_greedy_tokens_equal_with_and_without_kernel(fmt, monkeypatch):
    config = get_preset("tiny-llama").replace(max_position_embeddings=128)
    params = init_params(config, jax.random.key(11))
    llm = LLM.from_params(config, params, quantization=fmt, quant_impl="auto", block_size=8, max_num_seqs=8,
                          max_num_batched_tokens=32, num_kv_blocks=32)
    prompts = [[1, 2, 3, 4, 5], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11]]

    def run():
        outs = llm.generate(prompts, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=True),
                            use_tqdm=False)
        return ([o.outputs[0].token_ids for o in outs], np.concatenate([o.outputs[0].logprobs for o in outs]))
    (on_tokens, on_lp), (off_tokens, off_lp) = _run_both(monkeypatch, run, cpu_pkg, "fp4_matmul_cpu")
    assert on_tokens == off_tokens
    np.testing.assert_allclose(on_lp, off_lp, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.slow)])
def test_engine_greedy_tokens_equal_with_and_without_attention_kernel(dtype, monkeypatch):
    """The engine's prefill (ragged, several pages, a prompt across a block boundary) and decode steps (the kernel's
    writing variant: the new rows stored as their pages are read) through the CPU attention kernel give XLA's loop's
    greedy tokens (XLA's scatter and loop), and log-probs equal up to float32 summation order."""
    config = get_preset("tiny-llama").replace(max_position_embeddings=128, dtype=dtype)
    params = init_params(config, jax.random.key(12))
    llm = LLM.from_params(config, params, block_size=8, max_num_seqs=4, max_num_batched_tokens=64, num_kv_blocks=48)
    rng = np.random.default_rng(12)
    prompts = [rng.integers(0, config.vocab_size, n).tolist() for n in (3, 17, 30)]

    def run():
        outs = llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=True,
                                                     top_logprobs=3),
                            use_tqdm=False)
        return [o.outputs[0] for o in outs]
    prefills = []
    ragged = cpu_attention.ragged_paged_attention_cpu
    monkeypatch.setattr(cpu_attention, "ragged_paged_attention_cpu",
                        lambda *a, **k: prefills.append(1) or ragged(*a, **k))
    on, off = _run_both(monkeypatch, run, cpu_attention, "paged_attention_write_cpu", switch=cpu_attention.ENV_SWITCH)
    assert prefills, "the prefill never went to the kernel"
    if dtype == "float32":
        assert [o.token_ids for o in on] == [o.token_ids for o in off]
        np.testing.assert_allclose(np.concatenate([o.logprobs for o in on]),
                                   np.concatenate([o.logprobs for o in off]), atol=1e-4)
    else:
        _assert_greedy_agrees(on, off)


def test_bf16_model_keeps_a_bf16_kv_pool_with_the_outputs_of_a_float32_one(monkeypatch):
    """Where the C++ attention kernel reads the pool, a bf16 model's KV pool holds bf16 bits (uint16: half the memory,
    twice the blocks in one budget); K/V arrive rounded to bf16 either way and the kernel widens them as it reads, so
    greedy tokens and their log-probs are those of a float32 pool, bit for bit (prefix-cache block copies included)."""
    prompts = ["def add(a, b):", "def add(a, b):\n    return", "class Stack:\n    def push(self, x):"]
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, logprobs=True)

    def run():
        llm = LLM("jaxserve/tiny-code", dtype="bfloat16", max_num_seqs=4, kv_cache_bytes=2**22)
        outs = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
        return llm.engine.runner.pool.layers[0].k.dtype, llm.stats()["kv_blocks_total"], outs
    jax.clear_caches()
    dtype, blocks, bf16 = run()
    from jaxserve.models.attention_backends import XlaAttention
    monkeypatch.setattr(XlaAttention, "storage_dtype", lambda self, dtype: jnp.dtype(jnp.float32))  # as before
    jax.clear_caches()
    dtype32, blocks32, f32 = run()
    jax.clear_caches()
    assert (dtype, dtype32) == (jnp.uint16, jnp.float32) and blocks // 2 == blocks32
    assert [o.token_ids for o in bf16] == [o.token_ids for o in f32]
    assert [o.logprobs for o in bf16] == [o.logprobs for o in f32]
