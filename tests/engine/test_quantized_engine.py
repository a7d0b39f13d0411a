"""LLM(..., quantization=fmt) serves the quantized params, through the matmul ``quant_impl`` picks.

nvfp4/mxfp4 with ``quant_impl="pallas"`` run the Pallas FP4 kernel (interpret mode on CPU) and must
give the greedy tokens of ``quant_impl="reference"`` (dequantize, then a float32 dot), with
log-probs within 1e-4 (both sum float32 products of the same dequantized weights, in a different
order); the reference path in turn equals the engine serving the dequantized params.
"""
import jax
import numpy as np
import pytest

import jaxserve.quant.matmul as quant_matmul
from jaxserve import LLM, SamplingParams
from jaxserve.models import get_preset, init_params
from jaxserve.kernels import cpu
from jaxserve.quant import dequantize_params, is_quantized, quantize_params

CONFIG = get_preset("tiny-llama").replace(max_position_embeddings=128)
PARAMS = init_params(CONFIG, jax.random.key(11))
ENGINE = dict(block_size=8, max_num_seqs=8, max_num_batched_tokens=32, num_kv_blocks=32)
PROMPTS = [[1, 2, 3, 4, 5], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11]]
GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=True)


def _generate(llm):
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs], np.concatenate([o.outputs[0].logprobs for o in outs])


@pytest.mark.parametrize("fmt", ["nvfp4", pytest.param("mxfp4", marks=pytest.mark.slow)])
def test_pallas_fp4_matmul_engine_matches_reference(fmt, monkeypatch):
    kernel_calls = []
    fp4_matmul = quant_matmul.fp4_matmul
    monkeypatch.setattr(quant_matmul, "fp4_matmul",
                        lambda *a, **k: kernel_calls.append(k) or fp4_matmul(*a, **k))
    tokens, logprobs = _generate(LLM.from_params(CONFIG, PARAMS, quantization=fmt, quant_impl="pallas",
                                                 **ENGINE))
    assert kernel_calls, "quant_impl='pallas' never traced the Pallas FP4 matmul"
    calls = len(kernel_calls)
    ref_tokens, ref_logprobs = _generate(LLM.from_params(CONFIG, PARAMS, quantization=fmt,
                                                         quant_impl="reference", **ENGINE))
    assert len(kernel_calls) == calls  # the reference engine did not run the kernel
    assert tokens == ref_tokens
    np.testing.assert_allclose(logprobs, ref_logprobs, atol=1e-4, rtol=0)


@pytest.mark.slow  # ~45 s in Mosaic GPU's CPU interpreter; tests/quant and tests/fp4/test_fp4_mosaic.py cover it
def test_mosaic_fp4_matmul_engine_matches_reference(monkeypatch):
    """quant_impl="mosaic" (on CPU, the Mosaic GPU kernel in its interpreter): the same greedy tokens as
    the reference; log-probs within 1e-2, since the kernel rounds this float32 model's activations to bf16
    (2^-9 relative) before its products (measured 2e-3)."""
    kernel_calls = []
    kernel = quant_matmul.fp4_matmul_mosaic
    monkeypatch.setattr(quant_matmul, "fp4_matmul_mosaic", lambda *a, **k: kernel_calls.append(k) or kernel(*a, **k))
    tokens, logprobs = _generate(LLM.from_params(CONFIG, PARAMS, quantization="nvfp4", quant_impl="mosaic", **ENGINE))
    assert kernel_calls, "quant_impl='mosaic' never traced the Mosaic FP4 matmul"
    ref_tokens, ref_logprobs = _generate(LLM.from_params(CONFIG, PARAMS, quantization="nvfp4",
                                                         quant_impl="reference", **ENGINE))
    assert tokens == ref_tokens
    np.testing.assert_allclose(logprobs, ref_logprobs, atol=1e-2, rtol=0)


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])  # int4 needs K % 128 == 0: not this tiny model
def test_reference_quantized_engine_equals_dequantized_model(fmt):
    quantized = LLM.from_params(CONFIG, PARAMS, quantization=fmt, quant_impl="reference", **ENGINE)
    dequantized = LLM.from_params(CONFIG, dequantize_params(quantize_params(PARAMS, fmt)), **ENGINE)
    (got, got_lp), (expected, expected_lp), (_, full_lp) = (
        _generate(llm) for llm in (quantized, dequantized, LLM.from_params(CONFIG, PARAMS, **ENGINE)))
    assert got == expected
    np.testing.assert_allclose(got_lp, expected_lp, atol=2e-5)
    assert np.abs(got_lp - full_lp).max() > 1e-4  # the quantization really happened


def test_unknown_quantization_and_quant_impl():
    with pytest.raises(ValueError, match="quantization must be one of"):
        LLM.from_params(CONFIG, PARAMS, quantization="fp3", **ENGINE)
    with pytest.raises(ValueError, match="quant_impl must be one of .* got 'triton'"):
        LLM.from_params(CONFIG, PARAMS, quantization="nvfp4", quant_impl="triton", **ENGINE)


TIED = CONFIG.replace(tie_word_embeddings=True)
TIED_PARAMS = init_params(TIED, jax.random.key(12))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_quantized_tied_head_equals_dequantized_model(fmt, monkeypatch):
    """quantize_lm_head=True: the tied embedding is quantized along E, the head reads it quantized (the CPU
    kernel where usable) and the lookup dequantizes only the looked-up rows: the greedy tokens of the engine
    serving the dequantized params, log-probs within 1e-4 (float32 sums in another order)."""
    shapes = []
    dequantize = quant_matmul.dequantize
    monkeypatch.setattr(quant_matmul, "dequantize", lambda qt, *a: shapes.append(qt.shape) or dequantize(qt, *a))
    qparams = quantize_params(TIED_PARAMS, fmt, lm_head=True)
    table = next(leaf for path, leaf in jax.tree_util.tree_leaves_with_path(qparams, is_leaf=is_quantized)
                 if "embedding" in jax.tree_util.keystr(path))
    assert is_quantized(table) and table.axis == 1 and table.shape == (TIED.vocab_size, TIED.hidden_size)
    got, got_lp = _generate(LLM.from_params(TIED, TIED_PARAMS, quantization=fmt, quantize_lm_head=True, **ENGINE))
    want, want_lp = _generate(LLM.from_params(TIED, dequantize_params(qparams), **ENGINE))
    assert got == want
    np.testing.assert_allclose(got_lp, want_lp, atol=1e-4, rtol=0)
    assert shapes and all(s[0] != TIED.vocab_size for s in shapes) or not cpu.usable(), shapes
    _, plain_lp = _generate(LLM.from_params(TIED, TIED_PARAMS, quantization=fmt, **ENGINE))
    assert np.abs(got_lp - plain_lp).max() > 1e-4  # the head really was quantized


def test_quantize_lm_head_needs_a_quantization():
    with pytest.raises(ValueError, match="quantize_lm_head=True needs a quantization, got quantization=None"):
        LLM.from_params(TIED, TIED_PARAMS, quantize_lm_head=True, **ENGINE)
    with pytest.raises(TypeError, match="quantize_lm_head"):
        LLM.from_params(TIED, TIED_PARAMS, quantization="nvfp4", quantize_lm_head="yes", **ENGINE)


@pytest.mark.parametrize("fmt", ["nvfp4", pytest.param("mxfp4", marks=pytest.mark.slow)])
def test_w4a8_engine_matches_its_reference(fmt, monkeypatch):
    """activation_quantization="int8" (W4A8): decode steps on the CPU VNNI kernel where it runs, prefill and
    quant_impl="reference" on the emulation (jaxserve.quant.w4a8): the same greedy tokens, log-probs within 1e-4
    (the kernel's block sums are exact integers; float32 rounding apart); and not the weight-only numbers."""
    kernel_calls = []
    kernel = cpu.fp4_w4a8_matmul_cpu
    monkeypatch.setattr(cpu, "fp4_w4a8_matmul_cpu", lambda *a, **k: kernel_calls.append(1) or kernel(*a, **k))
    tokens, logprobs = _generate(LLM.from_params(CONFIG, PARAMS, quantization=fmt, activation_quantization="int8",
                                                 **ENGINE))
    assert kernel_calls or not cpu.vnni_usable()
    calls = len(kernel_calls)
    ref_tokens, ref_logprobs = _generate(LLM.from_params(CONFIG, PARAMS, quantization=fmt, quant_impl="reference",
                                                         activation_quantization="int8", **ENGINE))
    assert len(kernel_calls) == calls
    assert tokens == ref_tokens
    np.testing.assert_allclose(logprobs, ref_logprobs, atol=1e-4, rtol=0)
    _, weight_only = _generate(LLM.from_params(CONFIG, PARAMS, quantization=fmt, quant_impl="reference", **ENGINE))
    assert np.abs(logprobs - weight_only).max() > 1e-4  # the activations really were quantized


def test_activation_quantization_needs_fp4_weights():
    with pytest.raises(ValueError, match="activation_quantization must be one of .* got 'int4'"):
        LLM.from_params(CONFIG, PARAMS, quantization="nvfp4", activation_quantization="int4", **ENGINE)
    with pytest.raises(ValueError, match="activation_quantization='int8' needs quantization nvfp4 or mxfp4, got 'fp8'"):
        LLM.from_params(CONFIG, PARAMS, quantization="fp8", activation_quantization="int8", **ENGINE)
    with pytest.raises(ValueError, match="activation_quantization='int8' runs with quant_impl auto or reference, got "
                                         "'pallas'"):
        LLM.from_params(CONFIG, PARAMS, quantization="nvfp4", quant_impl="pallas", activation_quantization="int8",
                        **ENGINE)


@pytest.mark.parametrize("config, params", [(TIED, TIED_PARAMS), (CONFIG, PARAMS)], ids=["tied", "untied"])
def test_int8_lm_head_engine_matches_its_reference(config, params, monkeypatch):
    """lm_head_quantization="int8": decode rows on the VNNI kernel where it runs, prefill on the reference; with the
    kernel switched off, the reference everywhere: the same greedy tokens, log-probs within 1e-4; and the head really
    is int8 (log-probs off the float head's)."""
    from jaxserve.kernels.cpu import int8_head
    calls = []
    kernel = int8_head.int8_head_matmul
    monkeypatch.setattr(int8_head, "int8_head_matmul", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    tokens, logprobs = _generate(LLM.from_params(config, params, lm_head_quantization="int8", **ENGINE))
    assert calls or not cpu.vnni_usable()
    monkeypatch.setattr(int8_head, "vnni_usable", lambda: False)
    jax.clear_caches()  # the step programs are shared jits: trace them again without the kernel
    references = []
    reference = int8_head.int8_head_reference
    monkeypatch.setattr(int8_head, "int8_head_reference", lambda *a, **k: references.append(a[0].shape) or
                        reference(*a, **k))
    ref_tokens, ref_logprobs = _generate(LLM.from_params(config, params, lm_head_quantization="int8", **ENGINE))
    assert any(shape[0] <= 8 for shape in references), references  # decode rows traced on the reference
    assert tokens == ref_tokens
    np.testing.assert_allclose(logprobs, ref_logprobs, atol=1e-4, rtol=0)
    _, float_head = _generate(LLM.from_params(config, params, **ENGINE))
    assert np.abs(logprobs - float_head).max() > 1e-5


def test_lm_head_quantization_choices():
    with pytest.raises(ValueError, match="lm_head_quantization must be one of .* got 'int4'"):
        LLM.from_params(TIED, TIED_PARAMS, lm_head_quantization="int4", **ENGINE)
    with pytest.raises(ValueError, match="both quantize the head: pick one"):
        LLM.from_params(TIED, TIED_PARAMS, quantization="nvfp4", quantize_lm_head=True, lm_head_quantization="int8",
                        **ENGINE)
