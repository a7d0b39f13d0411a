"""The model runs its quantized params through the chosen matmul, with model code unchanged."""
import functools

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.cache.kv_pool import init_kv_pool
from jaxserve.models import AttentionMetadata, forward, forward_full
import jaxserve.quant.matmul as quant_matmul
from jaxserve.quant import (MatmulSettings, current_settings, dequantize_params, kernel_for, matmul_context,
                            quantize_params, quantized_apply, quantized_matmul, use_quantized_matmul)
from jaxserve.quant.evaluate import activation_error, dense_inputs, perplexity, weight_error
from jaxserve.train.step import evaluate
from pallas_kernels.fp4 import dequantize
from pallas_kernels.fp4.quant_error import quantization_error

_full = jax.jit(forward_full, static_argnums=1)


def _rel(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b))))


@pytest.fixture(scope="module")
def reference_logits(config, nvfp4_params, tokens):
    return jax.jit(quantized_apply(forward_full, "reference"), static_argnums=1)(nvfp4_params, config, tokens)


def test_reference_equals_forward_on_dequantized_params(config, nvfp4_params, tokens, reference_logits):
    want = _full(dequantize_params(nvfp4_params), config, tokens)
    assert _rel(reference_logits, want) < 1e-5


def test_pallas_interpret_equals_reference(config, nvfp4_params, tokens, reference_logits):
    pallas = jax.jit(quantized_apply(forward_full, "pallas", interpret=True), static_argnums=1)
    assert _rel(pallas(nvfp4_params, config, tokens), reference_logits) <= 1e-5


def test_paged_forward_under_jit(config, nvfp4_params, tokens, reference_logits):
    """The engine's entry point: one jitted prefill of a sequence through the paged pool."""
    n = tokens.shape[1]  # two pages of n/2 tokens
    meta = AttentionMetadata(slot_mapping=jnp.arange(n, dtype=jnp.int32), block_tables=jnp.array([[0, 1]], jnp.int32),
                             context_lens=jnp.array([n], jnp.int32), cu_q_lens=jnp.array([0, n], jnp.int32),
                             decode_only=False)
    pool = init_kv_pool(config.num_layers, 2, n // 2, config.num_kv_heads, config.head_dim)
    step = jax.jit(quantized_apply(forward, "reference"), static_argnums=1, static_argnames="attention_impl")
    logits, _ = step(nvfp4_params, config, tokens[0], jnp.arange(n, dtype=jnp.int32), pool, meta,
                     attention_impl="reference")
    assert _rel(logits, reference_logits[0]) < 1e-5


def test_fp8_kernels_take_the_reference_path_under_pallas(params):
    w = quantize_params(params, "fp8", include=("q_proj",), scaling="channel")["layers_0"]["attn"]["q_proj"]["kernel"]
    x = jax.random.normal(jax.random.key(4), (5, 64), jnp.float32)
    got = quantized_matmul(x, w, MatmulSettings("pallas"))
    np.testing.assert_allclose(got, jnp.dot(x, dequantize(w), precision="highest"), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="w4a4 emulation applies to"):
        quantized_matmul(x, w, MatmulSettings("reference", w4a4=True))


def test_quantized_params_outside_the_context_fail_loudly(config, nvfp4_params, tokens):
    with pytest.raises(flax.errors.ScopeParamShapeError):
        forward_full(nvfp4_params, config, tokens)


def test_innermost_context_wins_and_bad_impl_is_rejected():
    assert current_settings() is None
    with use_quantized_matmul("pallas"):
        with use_quantized_matmul("reference", w4a4=True):
            assert current_settings() == MatmulSettings("reference", w4a4=True)
        assert current_settings().impl == "pallas"
    assert current_settings() is None
    with pytest.raises(ValueError, match="'triton'"):
        quantized_apply(forward_full, "triton")


BF16, F32 = jnp.bfloat16, jnp.float32


@pytest.mark.parametrize("x_dtype, settings, backend, hopper, kernel", [
    (BF16, MatmulSettings("auto"), "cpu", False, "reference"),            # CPU without the FFI kernel
    (BF16, MatmulSettings("pallas"), "cpu", False, "portable"),
    (BF16, MatmulSettings("mosaic"), "cpu", False, "mosaic"),             # the interpreter
    (BF16, MatmulSettings("auto"), "gpu", True, "mosaic"),                # Hopper: Mosaic where it applies
    (BF16, MatmulSettings("pallas"), "gpu", True, "mosaic"),
    (F32, MatmulSettings("pallas", precision="bfloat16"), "gpu", True, "mosaic"),
    (F32, MatmulSettings("auto"), "gpu", True, "triton"),                 # float32 products
    (BF16, MatmulSettings("pallas", w4a4=True), "gpu", True, "triton"),   # W4A4 emulation
    (BF16, MatmulSettings("auto"), "gpu", False, "triton"),               # no WGMMA before Hopper
    (BF16, MatmulSettings("pallas", interpret=True), "gpu", True, "portable"),
    (BF16, MatmulSettings("reference"), "gpu", True, "reference"),
])
def test_kernel_for_picks_mosaic_on_hopper_where_it_applies(nvfp4_params, x_dtype, settings, backend, hopper, kernel):
    w = nvfp4_params["layers_0"]["mlp"]["up_proj"]["kernel"]
    assert kernel_for(x_dtype, w, settings, backend=backend, hopper=hopper, cpu_kernel=False) == kernel


@pytest.mark.parametrize("settings, kernel", [
    (MatmulSettings("auto"), "cpu"),                                      # the AVX-512 or AVX2 FFI kernel
    (MatmulSettings("auto", w4a4=True), "reference"),                     # it has no W4A4 emulation
    (MatmulSettings("pallas"), "portable"),
    (MatmulSettings("reference"), "reference"),
])
def test_kernel_for_picks_the_cpu_kernel_under_auto_where_usable(nvfp4_params, settings, kernel):
    w = nvfp4_params["layers_0"]["mlp"]["up_proj"]["kernel"]
    assert kernel_for(BF16, w, settings, backend="cpu", cpu_kernel=True) == kernel
    assert kernel_for(BF16, w, settings, backend="cpu", cpu_kernel=False) == kernel.replace("cpu", "reference")


def test_fp8_weights_take_the_reference_path_under_every_impl(params):
    w = quantize_params(params, "fp8", include=("q_proj",))["layers_0"]["attn"]["q_proj"]["kernel"]
    for impl in ("auto", "pallas", "mosaic"):
        assert kernel_for(BF16, w, MatmulSettings(impl), backend="gpu", hopper=True) == "reference"


def test_mosaic_impl_runs_the_mosaic_kernel_and_equals_reference(nvfp4_params, monkeypatch):
    calls = []
    kernel = quant_matmul.fp4_matmul_mosaic
    monkeypatch.setattr(quant_matmul, "fp4_matmul_mosaic", lambda *a, **k: calls.append(k) or kernel(*a, **k))
    w = nvfp4_params["layers_0"]["mlp"]["up_proj"]["kernel"]
    x = jax.random.normal(jax.random.key(3), (2, 3, 64), jnp.bfloat16)
    got = quantized_matmul(x, w, MatmulSettings("mosaic"), out_dtype=jnp.float32)
    assert calls and got.shape == (2, 3, 176)
    assert _rel(got, quantized_matmul(x, w, MatmulSettings("reference"), out_dtype=jnp.float32)) <= 1e-5


def test_mosaic_impl_refuses_w4a4_by_name():
    with pytest.raises(ValueError, match=r"impl='mosaic' has no W4A4 emulation \(w4a4=True\)"):
        MatmulSettings("mosaic", w4a4=True)


@pytest.mark.parametrize("w4a4", [False, True])
def test_quantized_matmul_flattens_leading_axes(nvfp4_params, w4a4):
    w = nvfp4_params["layers_0"]["mlp"]["up_proj"]["kernel"]
    x = jax.random.normal(jax.random.key(2), (4, 4, 64), jnp.float32)
    got = quantized_matmul(x, w, MatmulSettings("pallas", w4a4=w4a4, interpret=True))
    want = quantized_matmul(x, w, MatmulSettings("reference", w4a4=w4a4))
    assert got.shape == (4, 4, 176) and _rel(got, want) <= 1e-5
    if w4a4:  # activations really are rounded
        assert _rel(want, quantized_matmul(x, w, MatmulSettings("reference"))) > 1e-3


def test_perplexity_matches_the_training_evaluation(config, params):
    windows = np.random.default_rng(3).integers(0, config.vocab_size, (3, 9)).astype(np.int32)
    want = evaluate(params, config, windows, batch_size=2)
    got = perplexity(params, config, windows, None, batch_size=2)
    assert got["val_tokens"] == want["val_tokens"] == 24 and abs(got["val_loss"] - want["val_loss"]) < 1e-6


def test_weight_error_pools_the_selected_kernels(params):
    kernel = params["layers_0"]["attn"]["q_proj"]["kernel"]
    one = weight_error(params, "nvfp4", include=("layers_0/attn/q_proj/kernel",))
    want = quantization_error(kernel, "nvfp4", axis=0)
    assert one["num_kernels"] == 1 and one["mse"] == pytest.approx(want["mse"], rel=1e-9)
    assert one["sqnr_db"] == pytest.approx(want["sqnr_db"], rel=1e-9) == one["min_sqnr_db"]
    assert np.isnan(weight_error(params, "int4_g128")["sqnr_db"])  # K = 64, 176: no 128-groups


def test_dense_inputs_and_activation_error(config, params, tokens):
    inputs = dense_inputs(params, config, tokens)
    assert len(inputs) == 15 and inputs["layers_1/mlp/down_proj"].shape == (16, 176)
    np.testing.assert_array_equal(inputs["layers_0/attn/q_proj"], inputs["layers_0/attn/v_proj"])  # same normed x
    x = inputs["layers_1/attn/o_proj"]
    got = activation_error({"layers_1/attn/o_proj": x, "lm_head": 100 * x}, "nvfp4")  # lm_head excluded
    want = quantization_error(x, "nvfp4", axis=-1)
    assert got["num_inputs"] == 1 and got["sqnr_db"] == pytest.approx(want["sqnr_db"], rel=1e-9)


@functools.partial(jax.jit, static_argnames=("config", "quant"))
def _engine_like_step(params, tokens, *, config, quant):
    with matmul_context(quant):
        return forward_full(params, config, tokens)


def test_settings_as_a_static_argument_keep_jit_traces_apart(config, nvfp4_params, tokens, reference_logits):
    """The integration the engine should use: one shared jit, settings in its static arguments."""
    weights_only = _engine_like_step(nvfp4_params, tokens, config=config, quant=MatmulSettings("reference"))
    w4a4 = _engine_like_step(nvfp4_params, tokens, config=config, quant=MatmulSettings("reference", w4a4=True))
    assert _rel(weights_only, reference_logits) < 1e-6 and _rel(w4a4, reference_logits) > 1e-3


def test_w4a8_settings_and_reference_path():
    """MatmulSettings(w4a8=True): activations quantized to int8 on the weight's blocks; the reference impl (and any
    backend but the CPU kernel's) computes jaxserve.quant.w4a8's emulation; no Pallas/Mosaic kernel has it."""
    from jaxserve.quant.w4a8 import w4a8_matmul_reference
    from pallas_kernels.fp4 import quantize
    with pytest.raises(ValueError, match="exclude each other"):
        MatmulSettings(w4a4=True, w4a8=True)
    with pytest.raises(ValueError, match="impl='pallas' has no W4A8"):
        MatmulSettings("pallas", w4a8=True)
    rng = np.random.default_rng(4)
    w = quantize(jnp.asarray(rng.standard_normal((64, 24)), jnp.float32), "nvfp4", axis=0)
    x = jnp.asarray(rng.standard_normal((40, 64)), jnp.float32)
    settings = MatmulSettings("auto", w4a8=True)
    assert kernel_for(x.dtype, w, settings, backend="gpu") == "reference"
    want = w4a8_matmul_reference(x, w)
    np.testing.assert_array_equal(quant_matmul.quantized_matmul(x, w, MatmulSettings("reference", w4a8=True)), want)
    # auto on CPU: the VNNI kernel where it runs (any rows), exact integer block sums: float32 rounding apart
    np.testing.assert_allclose(quant_matmul.quantized_matmul(x, w, settings), want, rtol=1e-5, atol=1e-5)
    assert not np.allclose(quant_matmul.quantized_matmul(x, w, MatmulSettings("reference")),
                           w4a8_matmul_reference(x, w), rtol=1e-4, atol=0)
